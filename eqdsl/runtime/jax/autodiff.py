"""Reverse-mode autodiff of the generated kernels: ``jax.custom_vjp`` functions whose VJPs
are the other kernels (``TensorProductVJP``), so derivatives of every order are kernels."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .launch import varying_axes
from .sharding import RowLayout, row_parallel

__all__ = ["TensorProductVJP", "make_vjp_ops", "make_conv_vjp_ops", "RadialVJP", "make_radial_vjp_ops",
           "radial_cotangents"]


class TensorProductVJP(NamedTuple):
    """The kernels of a tensor product as mutually differentiating ``jax.custom_vjp``
    functions on kernel operands (spec-layout rows); each takes ``(a, b, c, block_batch, interpret)``
    (the last two static).

    With ``F(x1, x2, W, g) = F_w + F_u`` the form of the tensor product (``F_w`` over the
    weighted paths, four-linear; ``F_u`` over the unweighted ones, independent of ``W``)::

        fwd(x1, x2, W)    = dF/dg     VJP(h): bwd_x1(h, x2, W), bwd_x2(x1, h, W), bwd_w(x1, x2, h)
        bwd_x1(g, x2, W)  = dF/dx1    VJP(h): fwd(h, x2, W),    bwd_x2(h, g, W),  bwd_w(h, x2, g)
        bwd_x2(x1, g, W)  = dF/dx2    VJP(h): bwd_x1(g, h, W),  fwd(x1, h, W),    bwd_w(x1, h, g)
        bwd_w(x1, x2, g)  = dF_w/dW   VJP(h): bwd_x1_w(g, x2, h), bwd_x2_w(x1, g, h), fwd_w(x1, x2, h)

    where ``fwd_w``, ``bwd_x1_w``, ``bwd_x2_w`` are the same derivatives of ``F_w`` alone
    (with the same rules among themselves and ``bwd_w``); when every path is weighted they
    are ``fwd``, ``bwd_x1``, ``bwd_x2``. So reverse-mode derivatives of every order are
    again these kernels. Forward mode (``jax.jvp``, ``jax.jacfwd``) is not available: JAX
    refuses it for ``custom_vjp`` functions with a ``TypeError``.

    ``bwd`` (None unless the product is channelwise, ``eqdsl.backends.pallas.fused``)::

        bwd(x1, x2, W, g) = (bwd_x1(g, x2, W), bwd_x2(x1, g, W), bwd_w(x1, x2, g))
            VJP(k1, k2, kW): bwd_x1(g, k2, W) + bwd_x1_w(g, x2, kW),
                             bwd_x2(k1, g, W) + bwd_x2_w(x1, g, kW),
                             bwd_w(k1, x2, g) + bwd_w(x1, k2, g),
                             fwd(k1, x2, W) + fwd(x1, k2, W) + fwd_w(x1, x2, kW)

    (the sum of its three parts' rules; terms with a symbolically zero cotangent, an unused
    output, are skipped); where given, the VJP of ``fwd`` is ``bwd(x1, x2, W, h)``: one
    pass over ``h`` instead of three.
    """

    fwd: Callable
    bwd_x1: Callable
    bwd_x2: Callable
    bwd_w: Callable
    fwd_w: Callable
    bwd_x1_w: Callable
    bwd_x2_w: Callable
    bwd: Callable | None = None


def make_vjp_ops(forward, backward_x1, backward_x2, backward_w, weighted=None, fused=None, *,
                 shared_weights: bool | None = None) -> TensorProductVJP:
    """Wire kernel launchers ``f(a, b, c, *, block_batch, interpret)`` into
    ``TensorProductVJP`` (see there for the rules). ``weighted``: the launchers
    ``(forward, backward_x1, backward_x2)`` over the weighted paths only, or ``None``
    when every path is weighted. ``fused``: the launcher ``f(x1, x2, w, g, *,
    block_batch, interpret) -> (gx1, gx2, gw)`` of a channelwise product's fused
    backward, or ``None``.

    The ops take row operands of any row count: each launch pads its rows to a multiple
    of ``block_batch`` itself and runs batch-parallel on the devices holding the rows
    (``sharding.row_parallel``). ``shared_weights``: whether the weight
    operand is one ``(1, numel)`` row and its gradient a sum over the rows; None (packages
    generated before this argument) reads it from the operand: one row while the batch
    has more (a batch of one row computes the same either way)."""
    return _wire((forward, backward_x1, backward_x2, backward_w), weighted, graph=False, fused=fused,
                 shared_weights=shared_weights)


def make_conv_vjp_ops(forward, backward_x1, backward_x2, backward_w, weighted=None, fused=None) -> TensorProductVJP:
    """``make_vjp_ops`` for the fused convolution: launchers
    ``f(a, b, c, graph, *, block_batch, interpret)`` with a ``ConvGraph`` (integer arrays,
    not differentiated: its cotangent is ``None``); the ops take
    ``(a, b, c, graph, block, interpret)``. The same rules hold because the convolution
    ``F_conv(x, y, W, G) = sum_e F(x[src_e], y_e, W_e, G[dst_e])`` is the same four-linear
    form composed with gathers: ``fwd`` gathers ``x`` by ``src`` and reduces into ``dst``,
    ``bwd_x1`` gathers ``G`` by ``dst`` and reduces into ``src``, ``bwd_x2`` and
    ``bwd_w`` are per edge (``bwd_w`` summed over the edges with shared weights).
    ``fused``: ``f(x, y, W, G, graph, *, block_batch, interpret) -> (gx, gy, gW)``, the
    three at once (``conv_backward_fused``), or None."""
    return _wire((forward, backward_x1, backward_x2, backward_w), weighted, graph=True, fused=fused)


def _is_shared(shared_weights: bool | None, kind: str, launch, args) -> bool:
    """Whether a launch's weights are one shared ``(1, numel)`` row: ``shared_weights`` when
    given, else read from the shapes (``make_vjp_ops``): the weight operand (``backward_w``:
    the output) has one row while the batch has more."""
    if shared_weights is not None:
        return bool(shared_weights)
    if kind == "bwd_w":
        rows = jax.eval_shape(lambda *a: launch(*a, block_batch=1, interpret=True), *args).shape[0]
    else:
        rows = args[3 if kind == "fused" else 2].shape[0]
    return rows == 1 and args[0].shape[0] != 1


def _layout(kind: str, shared: bool):
    """Row layout (``sharding.RowLayout``) of a launch of the plain product: operands
    ``(a, b, c)``, ``c`` the weights (one row if shared) except for ``bwd_w`` (``c`` the
    output cotangent; the output one row if shared); ``fused``: ``(x1, x2, w, g) ->
    (gx1, gx2, gw)``."""
    if kind == "fused":
        return RowLayout((True, True, not shared, True), (True, True, not shared))
    if kind == "bwd_w":
        return RowLayout((True, True, True), (not shared,))
    return RowLayout((True, True, not shared), (True,))


def _row_parallel(launch, kind: str, shared_weights: bool | None):
    """``launch`` made batch-parallel (``sharding.row_parallel``): rows of any count,
    padded per device; one wrapper per row layout."""
    made = {}

    def call(*args, block_batch, interpret):
        layout = _layout(kind, _is_shared(shared_weights, kind, launch, args))
        if layout not in made:
            made[layout] = row_parallel(launch, layout)
        return made[layout](*args, block_batch=block_batch, interpret=interpret)

    return call


def _wire(launchers, weighted, *, graph: bool, fused=None, shared_weights: bool | None = None) -> TensorProductVJP:
    ng = 1 if graph else 0  # number of non-differentiated pass-through arguments (the graph)
    if not graph:
        kinds = ("rows", "rows", "rows", "bwd_w")
        launchers = tuple(_row_parallel(f, k, shared_weights) for f, k in zip(launchers, kinds))
        if weighted is not None:
            weighted = tuple(_row_parallel(f, "rows", shared_weights) for f in weighted)
        if fused is not None:
            fused = _row_parallel(fused, "fused", shared_weights)

    def wrap(launch):
        if graph:
            @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
            def op(a, b, c, g, block_batch, interpret):
                return launch(a, b, c, g, block_batch=block_batch, interpret=interpret)
        else:
            @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
            def op(a, b, c, block_batch, interpret):
                return launch(a, b, c, block_batch=block_batch, interpret=interpret)

        return op

    fwd, bwd_x1, bwd_x2, bwd_w = (wrap(f) for f in launchers)
    fwd_w, bwd_x1_w, bwd_x2_w = (fwd, bwd_x1, bwd_x2) if weighted is None else (wrap(f) for f in weighted)
    nones = (None,) * ng
    bwd = None
    if fused is not None:
        if graph:
            @functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
            def bwd(x1, x2, w, g, gr, block_batch, interpret):
                return fused(x1, x2, w, g, gr, block_batch=block_batch, interpret=interpret)
        else:
            @functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
            def bwd(x1, x2, w, g, block_batch, interpret):
                return fused(x1, x2, w, g, block_batch=block_batch, interpret=interpret)

        def bwd_fwd(x1, x2, w, g, *rest):
            *ex, bb, it = rest
            # symbolic_zeros: every primal leaf comes as a CustomVJPPrimal (the graph's too)
            args = jax.tree.map(lambda a: a.value, (x1, x2, w, g, *ex),
                                is_leaf=lambda a: isinstance(a, jax.custom_derivatives.CustomVJPPrimal))
            return bwd(*args, bb, it), args

        def bwd_bwd(bb, it, res, k):
            # Symbolic zeros skip the terms of unused outputs: a force loss differentiates
            # dF/dx1 only, and would otherwise launch five kernels on zero cotangents.
            x1, x2, w, g, *ex = res
            k1, k2, kw = (None if isinstance(c, jax.custom_derivatives.SymbolicZero) else c for c in k)

            def call(op, *args):
                return None if any(a is None for a in args) else op(*args, *ex, bb, it)

            return (_add(call(bwd_x1, g, k2, w), call(bwd_x1_w, g, x2, kw)),
                    _add(call(bwd_x2, k1, g, w), call(bwd_x2_w, x1, g, kw)),
                    _add(call(bwd_w, k1, x2, g), call(bwd_w, x1, k2, g)),
                    _add(_add(call(fwd, k1, x2, w), call(fwd, x1, k2, w)), call(fwd_w, x1, x2, kw))) + nones

    def save(op):
        # The primal goes through ``op`` itself, not its launcher: under an outer level of
        # differentiation (grad of grad) the forward rule is traced by that level, which
        # must see the custom rule again (a bare pallas_call has no derivative).
        def rule(*args):
            return op(*args), args[:-2]

        return rule

    def family(f, b1, b2):
        """VJP rules of the derivatives (f, b1, b2) of one form, with ``bwd_w`` its W-derivative."""

        def f_bwd(bb, it, res, h):
            x1, x2, w, *ex = res
            if f is fwd and bwd is not None:  # JAX asks for all three cotangents: one pass over h
                return tuple(bwd(x1, x2, w, h, *ex, bb, it)) + nones
            return (b1(h, x2, w, *ex, bb, it), b2(x1, h, w, *ex, bb, it), bwd_w(x1, x2, h, *ex, bb, it)) + nones

        def b1_bwd(bb, it, res, h):
            g, x2, w, *ex = res
            return (f(h, x2, w, *ex, bb, it), b2(h, g, w, *ex, bb, it), bwd_w(h, x2, g, *ex, bb, it)) + nones

        def b2_bwd(bb, it, res, h):
            x1, g, w, *ex = res
            return (b1(g, h, w, *ex, bb, it), f(x1, h, w, *ex, bb, it), bwd_w(x1, h, g, *ex, bb, it)) + nones

        for op, rule in ((f, f_bwd), (b1, b1_bwd), (b2, b2_bwd)):
            op.defvjp(save(op), _sum_over_devices(rule))

    def bwd_w_bwd(bb, it, res, h):
        x1, x2, g, *ex = res
        return (bwd_x1_w(g, x2, h, *ex, bb, it), bwd_x2_w(x1, g, h, *ex, bb, it),
                fwd_w(x1, x2, h, *ex, bb, it)) + nones

    if bwd is not None:
        bwd.defvjp(bwd_fwd, _sum_over_devices(bwd_bwd), symbolic_zeros=True)
    family(fwd, bwd_x1, bwd_x2)
    if weighted is not None:
        family(fwd_w, bwd_x1_w, bwd_x2_w)
    bwd_w.defvjp(save(bwd_w), _sum_over_devices(bwd_w_bwd))
    return TensorProductVJP(fwd, bwd_x1, bwd_x2, bwd_w, fwd_w, bwd_x1_w, bwd_x2_w, bwd)


class RadialVJP(NamedTuple):
    """``conv_radial``'s kernels as mutually differentiating ``jax.custom_vjp`` functions:
    the conv's kernels that read the weights, with ``W = rf @ wr`` formed on chip. Each
    takes ``(a, b, rf, wr, graph, block, interpret)`` (``fused``: ``(x, y, rf, wr, G, graph,
    block, interpret)``), ``rf`` ``(rows, H)`` the radial features, ``wr`` ``(H, numel)``.

    With ``conv`` the conv's ``TensorProductVJP`` (its ``bwd_w`` never reads ``W``) and
    ``R(cw) = (cw @ wr.T, rf.T @ cw)`` (``radial_cotangents``) the cotangents of ``rf`` and
    ``wr`` given that of ``W``::

        fwd(x, y, rf, wr)    VJP(h): bwd_x1(h, y, .), bwd_x2(x, h, .), R(conv.bwd_w(x, y, h))
        bwd_x1(G, y, rf, wr) VJP(h): fwd(h, y, .),    bwd_x2(h, G, .), R(conv.bwd_w(h, y, G))
        bwd_x2(x, G, rf, wr) VJP(h): bwd_x1(G, h, .), fwd(x, h, .),    R(conv.bwd_w(x, h, G))
        bwd(x, y, rf, wr, G) = (bwd_x1(G, y, .), bwd_x2(x, G, .), conv.bwd_w(x, y, G))
            VJP(k1, k2, kW): bwd_x1(G, k2, .) + conv.bwd_x1_w(G, y, kW),
                             bwd_x2(k1, G, .) + conv.bwd_x2_w(x, G, kW),
                             R(conv.bwd_w(k1, y, G) + conv.bwd_w(x, k2, G)),
                             fwd(k1, y, .) + fwd(x, k2, .) + conv.fwd_w(x, y, kW)

    (``.`` = ``rf, wr``). ``conv.bwd_w``'s own VJP is the conv's, on the materialized
    cotangent ``h`` of ``W``; the matmuls are jnp's. So derivatives of every order close over
    these ops, the conv's ops and matmuls.
    """

    fwd: Callable
    bwd_x1: Callable
    bwd_x2: Callable
    bwd: Callable | None = None


def radial_cotangents(cw, rf, wr):
    """The cotangents ``(d rf, d wr) = (cw @ wr.T, rf.T @ cw)`` of ``W = rf @ wr`` given ``cw``,
    that of ``W``; in full precision (``Precision.HIGHEST``: XLA's default for float32 on
    the GPU is TF32, another function)."""
    hi = lax.Precision.HIGHEST
    return jnp.matmul(cw, wr.T, precision=hi), jnp.matmul(rf.T, cw, precision=hi)


def make_radial_vjp_ops(conv: TensorProductVJP, forward, backward_x1, backward_x2, fused=None) -> RadialVJP:
    """Wire ``conv_radial``'s launchers ``f(a, b, rf, wr, graph, *, block_batch, interpret)``
    (``fused``: ``f(x, y, rf, wr, G, graph, *, ...) -> (gx, gy, gW)``, or None) into a
    ``RadialVJP`` (see there for the rules); ``conv``: the conv's ops
    (``make_conv_vjp_ops``)."""

    def wrap(launch):
        @functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
        def op(a, b, rf, wr, gr, block_batch, interpret):
            return launch(a, b, rf, wr, gr, block_batch=block_batch, interpret=interpret)

        return op

    fwd, bwd_x1, bwd_x2 = (wrap(f) for f in (forward, backward_x1, backward_x2))
    bwd = None
    if fused is not None:
        @functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
        def bwd(x, y, rf, wr, g, gr, block_batch, interpret):
            return fused(x, y, rf, wr, g, gr, block_batch=block_batch, interpret=interpret)

        def bwd_fwd(x, y, rf, wr, g, gr, bb, it):
            # symbolic_zeros: every primal leaf comes as a CustomVJPPrimal (the graph's too)
            args = jax.tree.map(lambda a: a.value, (x, y, rf, wr, g, gr),
                                is_leaf=lambda a: isinstance(a, jax.custom_derivatives.CustomVJPPrimal))
            return bwd(*args, bb, it), args

        def bwd_bwd(bb, it, res, k):
            x, y, rf, wr, g, gr = res
            k1, k2, kw = (None if isinstance(c, jax.custom_derivatives.SymbolicZero) else c for c in k)

            def call(op, *args):
                return None if any(a is None for a in args) else op(*args, gr, bb, it)

            cw = _add(call(conv.bwd_w, k1, y, g), call(conv.bwd_w, x, k2, g))
            drf, dwr = (None, None) if cw is None else radial_cotangents(cw, rf, wr)
            return (_add(call(bwd_x1, g, k2, rf, wr), call(conv.bwd_x1_w, g, y, kw)),
                    _add(call(bwd_x2, k1, g, rf, wr), call(conv.bwd_x2_w, x, g, kw)),
                    drf, dwr,
                    _add(_add(call(fwd, k1, y, rf, wr), call(fwd, x, k2, rf, wr)), call(conv.fwd_w, x, y, kw)),
                    None)

        bwd.defvjp(bwd_fwd, _sum_over_devices(bwd_bwd), symbolic_zeros=True)

    def save(op):
        def rule(*args):  # the primal through op itself (see _wire)
            return op(*args), args[:-2]

        return rule

    def fwd_bwd(bb, it, res, h):
        x, y, rf, wr, gr = res
        if bwd is not None:  # one pass over h for all three cotangents
            gx, gy, cw = bwd(x, y, rf, wr, h, gr, bb, it)
        else:
            gx, gy = bwd_x1(h, y, rf, wr, gr, bb, it), bwd_x2(x, h, rf, wr, gr, bb, it)
            cw = conv.bwd_w(x, y, h, gr, bb, it)
        return (gx, gy, *radial_cotangents(cw, rf, wr), None)

    def bwd_x1_bwd(bb, it, res, h):
        g, y, rf, wr, gr = res
        return (fwd(h, y, rf, wr, gr, bb, it), bwd_x2(h, g, rf, wr, gr, bb, it),
                *radial_cotangents(conv.bwd_w(h, y, g, gr, bb, it), rf, wr), None)

    def bwd_x2_bwd(bb, it, res, h):
        x, g, rf, wr, gr = res
        return (bwd_x1(g, h, rf, wr, gr, bb, it), fwd(x, h, rf, wr, gr, bb, it),
                *radial_cotangents(conv.bwd_w(x, h, g, gr, bb, it), rf, wr), None)

    for op, rule in ((fwd, fwd_bwd), (bwd_x1, bwd_x1_bwd), (bwd_x2, bwd_x2_bwd)):
        op.defvjp(save(op), _sum_over_devices(rule))
    return RadialVJP(fwd, bwd_x1, bwd_x2, bwd)


def _sum_over_devices(rule):
    """A VJP rule whose cotangents are summed (``psum``) over the manual mesh axes along
    which they vary but their primal does not.

    Inside ``jax.shard_map`` (``check_vma=True``) an operand replicated over a mesh axis
    (shared weights, ``in_specs=P()``) meets rows that vary over it: each device's kernel
    gives the gradient of its own rows, and the operand's gradient is their sum over the
    devices (what JAX's own transpose of the implicit ``pcast(to="varying")`` does; JAX
    also requires the cotangent to be typed like the primal). Elsewhere nothing varies
    and the rule is unchanged."""

    def summed(bb, it, res, h):
        cts = rule(bb, it, res, h)
        out = []
        for k, ct in enumerate(cts):
            if ct is not None and k < len(res):
                extra = varying_axes((ct,)) - varying_axes((res[k],))
                if extra:
                    ct = jax.lax.psum(ct, tuple(sorted(extra)))
            out.append(ct)
        return tuple(out)

    return summed


def _add(a, b):
    """``a + b`` where either may be None (a zero cotangent); None if both are."""
    if a is None:
        return b
    return a if b is None else a + b
