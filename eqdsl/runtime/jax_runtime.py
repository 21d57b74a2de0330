"""Shared glue for the generated JAX modules: input checks, layout conversion, padding,
kernel launches and the ``jax.custom_vjp`` wiring of the four kernels.

No physics here: the generated ``pallas_kernels.py`` holds every CG coefficient. The
kernel layout (see ``eqdsl.codegen.pallas_backend``) stores each irreps block
``mul x l`` as ``2l+1`` rows of ``P = next_pow2(mul)`` contiguous channels; blocks
are described as ``(offset, mul, dim, P)`` tuples with ``offset`` in the spec's layout.
All functions here run at trace time on static shapes.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_inputs", "check_grad_out", "check_block_batch", "round_up", "bucket", "pack", "unpack", "pack_weights",
    "unpack_weights", "use_interpret", "compiler_params", "launch_rows", "launch_weight_sum", "TensorProductVJP",
    "make_vjp_ops",
]

NUM_WARPS = 4
NUM_STAGES = 1


def _as_array(x, name: str):
    if isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "shape") and hasattr(x, "dtype"):
        return x if isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) else jnp.asarray(x)
    raise TypeError(f"{name} must be an array, got {type(x).__name__}")


def check_inputs(x1, x2, weights, *, dim_in1: int, dim_in2: int, weight_numel: int, shared_weights: bool,
                 dtypes: tuple[str, ...]):
    """Check shapes and dtypes (``ValueError`` / ``TypeError`` naming the argument)."""
    x1, x2, weights = _as_array(x1, "x1"), _as_array(x2, "x2"), _as_array(weights, "weights")
    for name, x, dim in (("x1", x1, dim_in1), ("x2", x2, dim_in2)):
        if x.ndim != 2 or x.shape[1] != dim:
            raise ValueError(f"{name} must have shape (batch, {dim}), got {tuple(x.shape)}")
    batch = x1.shape[0]
    if x2.shape[0] != batch:
        raise ValueError(f"x2 has batch size {x2.shape[0]} but x1 has {batch}")
    want = (weight_numel,) if shared_weights else (batch, weight_numel)
    if tuple(weights.shape) != want:
        kind = "shared weights" if shared_weights else "per-batch weights"
        raise ValueError(f"weights ({kind}) must have shape {want}, got {tuple(weights.shape)}")
    for name, x in (("x1", x1), ("x2", x2), ("weights", weights)):
        if str(x.dtype) not in dtypes:
            raise TypeError(f"{name} has dtype {x.dtype}; this tensor product supports {', '.join(dtypes)}")
    if not x1.dtype == x2.dtype == weights.dtype:
        raise TypeError(f"x1, x2 and weights must have one dtype, got {x1.dtype}, {x2.dtype}, {weights.dtype}")
    return x1, x2, weights


def check_grad_out(grad_out, *, batch: int, dim_out: int, dtype):
    """Check the output cotangent of an explicit ``tensor_product_vjp`` call."""
    grad_out = _as_array(grad_out, "grad_out")
    if tuple(grad_out.shape) != (batch, dim_out):
        raise ValueError(f"grad_out must have shape ({batch}, {dim_out}), got {tuple(grad_out.shape)}")
    if grad_out.dtype != dtype:
        raise TypeError(f"grad_out has dtype {grad_out.dtype} but x1 has {dtype}")
    return grad_out


def check_block_batch(block_batch: int | None, default: int) -> int:
    if block_batch is None:
        return default
    if not isinstance(block_batch, int) or block_batch < 1 or block_batch & (block_batch - 1):
        raise ValueError(f"block_batch must be a positive power of two, got {block_batch!r}")
    return block_batch


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def bucket(n: int, minimum: int = 64) -> int:
    """A bucket size >= ``n``: powers of two up to 65536, then multiples of 65536.

    Padding a varying batch (edge count) to ``bucket(n)`` bounds the number of distinct
    shapes, hence compilations, at a cost of less than 2x (small) or 65536 rows (large).
    """
    if n <= minimum:
        return minimum
    if n <= 65536:
        return 1 << (n - 1).bit_length()
    return round_up(n, 65536)


def _pad_rows(x, rows: int):
    return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def pack(x, blocks, layout: str, rows: int, *, identity: bool):
    """``(batch, dim)`` in ``layout`` -> ``(rows, idim)`` kernel layout, zero padded."""
    if identity:
        return _pad_rows(x, rows)
    batch = x.shape[0]
    parts = []
    for offset, mul, dim, pad in blocks:
        seg = x[:, offset : offset + mul * dim]
        if layout == "mul_ir":
            seg = seg.reshape(batch, mul, dim).transpose(0, 2, 1)
        else:
            seg = seg.reshape(batch, dim, mul)
        seg = jnp.pad(seg, ((0, rows - batch), (0, 0), (0, pad - mul)))
        parts.append(seg.reshape(rows, dim * pad))
    return jnp.concatenate(parts, axis=1)


def unpack(y, blocks, layout: str, batch: int, *, identity: bool):
    """Kernel-layout ``(rows, idim)`` -> ``(batch, dim)`` in ``layout`` (padding dropped)."""
    y = y[:batch]
    if identity:
        return y
    parts, col = [], 0
    for _, mul, dim, pad in blocks:
        seg = y[:, col : col + dim * pad].reshape(batch, dim, pad)[:, :, :mul]
        if layout == "mul_ir":
            seg = seg.transpose(0, 2, 1)
        parts.append(seg.reshape(batch, mul * dim))
        col += dim * pad
    return jnp.concatenate(parts, axis=1)


def pack_weights(w, blocks, inumel: int, shared: bool, rows: int, *, identity: bool):
    """e3nn-ordered weights -> ``(1 | rows, inumel)`` kernel layout.

    Per weighted path ``(offset, shape, perm, pad)``: the block is transposed to
    ``perm`` (the vectorized channel innermost) and its last axis zero padded to ``pad``.
    """
    w2 = w.reshape(1, -1) if shared else w
    n = 1 if shared else rows
    if not blocks:
        return jnp.zeros((n, inumel), w.dtype)
    if identity:
        return w2 if shared else _pad_rows(w2, rows)
    batch = w2.shape[0]
    parts = []
    for offset, shape, perm, pad in blocks:
        seg = w2[:, offset : offset + math.prod(shape)].reshape(batch, *shape)
        seg = seg.transpose(0, *(a + 1 for a in perm))
        widths = [(0, n - batch)] + [(0, 0)] * (len(shape) - 1) + [(0, pad - seg.shape[-1])]
        seg = jnp.pad(seg, widths)
        parts.append(seg.reshape(n, -1))
    return jnp.concatenate(parts, axis=1)


def unpack_weights(w, blocks, numel: int, shared: bool, batch: int, *, identity: bool):
    """Kernel-layout weights ``(1 | rows, inumel)`` -> e3nn order ``(numel,)`` if shared else
    ``(batch, numel)``: the inverse of ``pack_weights`` (padding dropped)."""
    n = 1 if shared else batch
    w2 = w[:n]
    if not blocks:
        y = jnp.zeros((n, numel), w.dtype)
    elif identity:
        y = w2[:, :numel]
    else:
        parts, col = [], 0
        for _, shape, perm, pad in blocks:
            kshape = tuple(shape[a] for a in perm)
            width = math.prod(kshape[:-1]) * pad
            seg = w2[:, col : col + width].reshape(n, *kshape[:-1], pad)[..., : kshape[-1]]
            inv = [perm.index(a) for a in range(len(perm))]
            parts.append(seg.transpose(0, *(a + 1 for a in inv)).reshape(n, -1))
            col += width
        y = jnp.concatenate(parts, axis=1)
    return y.reshape(numel) if shared else y


def use_interpret(interpret: bool | None) -> bool:
    """Explicit choice, else interpret mode exactly when the default backend is the CPU."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(interpret: bool):
    """Triton compiler parameters on GPU; none in interpret mode."""
    if interpret or jax.default_backend() != "gpu":
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


# ------------------------------------------------------------------ kernel launches

# Shared-weight gradients are reduced over the batch with per-program partial sums
# (one row per program, then one sum): deterministic, no atomics. The partial sums of
# one launch hold at most max(REDUCE_MIN_PROGRAMS, REDUCE_PARTIAL_ELEMS // width) rows;
# a larger batch is covered by several launches over consecutive row blocks.
REDUCE_PARTIAL_ELEMS = 1 << 25
REDUCE_MIN_PROGRAMS = 256


def _check_rows(rows: int, block_batch: int) -> None:
    if rows % block_batch:
        raise ValueError(f"rows={rows} is not a multiple of block_batch={block_batch}")


def _concat(pieces):
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)


def launch_rows(name: str, kernels, args, *, out_width: int, shared_arg: int | None, block_batch: int,
                interpret: bool):
    """Run a kernel set whose output has one row per input row.

    ``args``: ``(rows, width)`` operands, blocked by ``block_batch`` rows, except
    ``args[shared_arg]`` (shared weights, ``(1, width)``), given whole to every program.
    ``kernels``: ``(kernel, output width)`` pairs; their outputs are concatenated over
    columns (``out_width`` in all; no kernels: zeros). Grid: one program per
    ``block_batch`` rows.
    """
    from jax.experimental import pallas as pl

    rows = next(a.shape[0] for i, a in enumerate(args) if i != shared_arg)
    _check_rows(rows, block_batch)
    if not kernels:
        return jnp.zeros((rows, out_width), args[0].dtype)
    row_block = lambda i: (i, 0)  # noqa: E731
    in_specs = [
        pl.BlockSpec((1, a.shape[1]), lambda i: (0, 0)) if k == shared_arg
        else pl.BlockSpec((block_batch, a.shape[1]), row_block)
        for k, a in enumerate(args)
    ]
    pieces = []
    for kernel, width in kernels:
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((rows, width), args[0].dtype),
            grid=(rows // block_batch,),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((block_batch, width), row_block),
            interpret=interpret,
            compiler_params=compiler_params(interpret),
            name=name + kernel.__name__,
        )
        pieces.append(call(*args))
    return _concat(pieces)


def launch_weight_sum(name: str, kernels, args, *, out_width: int, block_batch: int, interpret: bool):
    """Run a ``backward_w`` kernel set with shared weights: every program writes the sum
    over its ``block_batch`` rows as one partial-sum row; the partial sums are added up
    (in a fixed order) to one ``(1, out_width)`` row (no kernels: zeros)."""
    from jax.experimental import pallas as pl

    rows = args[0].shape[0]
    _check_rows(rows, block_batch)
    if not kernels:
        return jnp.zeros((1, out_width), args[0].dtype)
    blocks = rows // block_batch
    pieces = []
    for kernel, width in kernels:
        chunk = max(REDUCE_MIN_PROGRAMS, REDUCE_PARTIAL_ELEMS // max(width, 1))
        total = None
        for start in range(0, blocks, chunk):
            n = min(chunk, blocks - start)
            in_specs = [pl.BlockSpec((block_batch, a.shape[1]), lambda i, s=start: (i + s, 0)) for a in args]
            call = pl.pallas_call(
                kernel,
                out_shape=jax.ShapeDtypeStruct((n, width), args[0].dtype),
                grid=(n,),
                in_specs=in_specs,
                out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
                interpret=interpret,
                compiler_params=compiler_params(interpret),
                name=name + kernel.__name__,
            )
            part = jnp.sum(call(*args), axis=0, keepdims=True)
            total = part if total is None else total + part
        pieces.append(total)
    return _concat(pieces)


# ------------------------------------------------------------------ custom_vjp wiring


class TensorProductVJP(NamedTuple):
    """The kernels of a tensor product as mutually differentiating ``jax.custom_vjp``
    functions on kernel-layout arrays; each takes ``(a, b, c, block_batch, interpret)``
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
    """

    fwd: Callable
    bwd_x1: Callable
    bwd_x2: Callable
    bwd_w: Callable
    fwd_w: Callable
    bwd_x1_w: Callable
    bwd_x2_w: Callable


def make_vjp_ops(forward, backward_x1, backward_x2, backward_w, weighted=None) -> TensorProductVJP:
    """Wire kernel launchers ``f(a, b, c, *, block_batch, interpret)`` into
    ``TensorProductVJP`` (see there for the rules). ``weighted``: the launchers
    ``(forward, backward_x1, backward_x2)`` over the weighted paths only, or ``None``
    when every path is weighted."""

    def wrap(launch):
        @functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
        def op(a, b, c, block_batch, interpret):
            return launch(a, b, c, block_batch=block_batch, interpret=interpret)

        return op

    fwd, bwd_x1, bwd_x2, bwd_w = (wrap(f) for f in (forward, backward_x1, backward_x2, backward_w))
    fwd_w, bwd_x1_w, bwd_x2_w = (fwd, bwd_x1, bwd_x2) if weighted is None else (wrap(f) for f in weighted)

    def save(op):
        # The primal goes through ``op`` itself, not its launcher: under an outer level of
        # differentiation (grad of grad) the forward rule is traced by that level, which
        # must see the custom rule again (a bare pallas_call has no derivative).
        def rule(a, b, c, block_batch, interpret):
            return op(a, b, c, block_batch, interpret), (a, b, c)

        return rule

    def family(f, b1, b2):
        """VJP rules of the derivatives (f, b1, b2) of one form, with ``bwd_w`` its W-derivative."""

        def f_bwd(bb, it, res, h):
            x1, x2, w = res
            return b1(h, x2, w, bb, it), b2(x1, h, w, bb, it), bwd_w(x1, x2, h, bb, it)

        def b1_bwd(bb, it, res, h):
            g, x2, w = res
            return f(h, x2, w, bb, it), b2(h, g, w, bb, it), bwd_w(h, x2, g, bb, it)

        def b2_bwd(bb, it, res, h):
            x1, g, w = res
            return b1(g, h, w, bb, it), f(x1, h, w, bb, it), bwd_w(x1, h, g, bb, it)

        for op, rule in ((f, f_bwd), (b1, b1_bwd), (b2, b2_bwd)):
            op.defvjp(save(op), rule)

    def bwd_w_bwd(bb, it, res, h):
        x1, x2, g = res
        return bwd_x1_w(g, x2, h, bb, it), bwd_x2_w(x1, g, h, bb, it), fwd_w(x1, x2, h, bb, it)

    family(fwd, bwd_x1, bwd_x2)
    if weighted is not None:
        family(fwd_w, bwd_x1_w, bwd_x2_w)
    bwd_w.defvjp(save(bwd_w), bwd_w_bwd)
    return TensorProductVJP(fwd, bwd_x1, bwd_x2, bwd_w, fwd_w, bwd_x1_w, bwd_x2_w)
