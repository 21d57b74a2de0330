"""JAX runtime of a generated symmetric contraction (issue 27): launches of its Pallas
kernels and their ``jax.custom_vjp`` wiring, so that reverse-mode derivatives of every
generated order are kernels.

The generated ``pallas_kernels.py`` (``eqdsl.symmetric.pallas``) holds, for
``n = 0..LEVELS``, the partial derivatives of ``F_n(x, h_1..h_n, W, G) = D^n_x F[h_1..h_n]``,
``F(x, W, G) = sum G . out(x, W)``::

    fwd_n(x, hs, W)      = dF_n/dG     rows like out
    bwd_x_n(x, hs, W, G) = dF_n/dx     rows like x
    bwd_w_n(x, hs, G)    = dF_n/dW     (num_elements, weight_numel): the kernel body summed
                                        on chip over chunks of element-sorted rows

``F_n`` is multilinear and symmetric in the directions ``hs``, so the VJPs close over the
family (``k`` the cotangent, ``hs[d := k]`` ``hs`` with ``h_d`` replaced by ``k``,
``hs - d`` without ``h_d``, ``hs + k`` with ``k`` appended)::

    fwd_n(x, hs, W)      VJP(k): x: bwd_x_n(x, hs, W, k)    h_d: bwd_x_{n-1}(x, hs - d, W, k)
                                 W: bwd_w_n(x, hs, k)
    bwd_x_n(x, hs, W, G) VJP(k): x: bwd_x_{n+1}(x, hs + k, W, G)  h_d: bwd_x_n(x, hs[d := k], W, G)
                                 W: bwd_w_{n+1}(x, hs + k, G)     G: fwd_{n+1}(x, hs + k, W)
    bwd_w_n(x, hs, G)    VJP(k): x: bwd_x_n(x, hs, k, G)    h_d: bwd_x_{n-1}(x, hs - d, k, G)
                                 G: fwd_n(x, hs, k)

A force loss (forces ``= -bwd_x_0``, then differentiated w.r.t. ``W`` and ``x``) uses
``n <= 1``; a package generated with ``LEVELS = L`` differentiates to order ``L + 1``
(order ``L + 2`` raises ``NotImplementedError`` naming the fix), and every order where
``L`` reaches the polynomials' degree (the higher derivatives are zero: ``F_n = 0`` for
``n > DEGREE``, ``bwd_x_n = 0`` for ``n >= DEGREE``). Forward mode (``jax.jvp``) is not
supported (``jax.custom_vjp``).

Element indices. ``element`` picks each row's weights inside the kernels (a gather, no
``W[element]`` in memory). An index outside ``0..num_elements-1`` is refused with a
``ValueError`` when ``element`` is concrete; under ``jax.jit`` it cannot be checked, and
such a row reads a row of NaN (the output row is NaN, never another element's value).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .checks import as_array
from .launch import compiler_params, out_struct, run, use_interpret
from .tiles import Accumulate, Gather

__all__ = ["SymmetricContractionFunctions", "launch"]


def _width(mod, op: str) -> int:
    return {"fwd": mod.DIM_OUT * mod.MUL, "bwd_x": mod.DIM_IN * mod.MUL, "bwd_w": mod.WEIGHT_NUMEL}[op]


def _pad_rows(a, rows: int):
    return a if a.shape[0] == rows else jnp.pad(a, ((0, rows - a.shape[0]),) + ((0, 0),) * (a.ndim - 1))


def launch(mod, op: str, n: int, x, hs, w, g, elem, *, block_nodes: int, interpret: bool):
    """Run kernel ``(op, n)`` of the generated module ``mod`` (``KERNELS``): ``x``, ``hs``
    and ``g`` rows, ``w`` the weight table ``(num_elements, weight_numel)``, ``elem``
    ``(rows,)`` int32. Rows are padded to a multiple of ``block_nodes`` (zeros, element 0)
    and dropped after. ``bwd_w`` returns the per-element sums ``(num_elements,
    weight_numel)`` (``_launch_bwd_w``); an absent kernel (identically zero) returns zeros."""
    from jax.experimental import pallas as pl

    rows, dtype = x.shape[0], x.dtype
    width = _width(mod, op)
    out_rows = mod.NUM_ELEMENTS if op == "bwd_w" else rows
    kernel = mod.KERNELS.get((op, n))
    if kernel is None or rows == 0:
        return jnp.zeros((out_rows, width), dtype)
    if op == "bwd_w":
        return _launch_bwd_w(mod, kernel, x, hs, g, elem, block_nodes=block_nodes, interpret=interpret)
    r = block_nodes
    padded = -(-rows // r) * r
    num_el = mod.NUM_ELEMENTS
    # an index out of range reads the NaN row num_el (checked eagerly where concrete)
    safe = jnp.where((elem >= 0) & (elem < num_el), elem, num_el).astype(jnp.int32)
    safe = _pad_rows(safe, padded)
    row_ops = [_pad_rows(a, padded) for a in (x, *hs)] + ([_pad_rows(g, padded)] if g is not None else [])
    w_at = None
    if op in ("fwd", "bwd_x"):
        w_at = 1 + len(hs)
        w_ext = jnp.concatenate([w, jnp.full((1, w.shape[1]), jnp.nan, dtype)], axis=0)
        row_ops.insert(w_at, w_ext)

    def body(elem_ref, *refs):
        ins, out_ref = list(refs[:-1]), refs[-1]
        if w_at is not None:
            idx = elem_ref[...]
            ins[w_at] = Gather(ins[w_at], idx, idx >= 0)
        kernel(*ins, out_ref)

    body.__name__ = kernel.__name__
    in_specs = [pl.BlockSpec((r,), lambda i, j: (i,))]
    for k, a in enumerate(row_ops):
        if k == w_at:
            in_specs.append(pl.BlockSpec(tuple(a.shape), lambda i, j: (0, 0)))
        else:
            in_specs.append(pl.BlockSpec((r, a.shape[1]), lambda i, j: (i, 0)))
    operands = (safe, *row_ops)
    call = pl.pallas_call(
        body,
        out_shape=out_struct((padded, width), dtype, operands),
        grid=(padded // r, mod.CHANNEL_BLOCKS),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((r, width), lambda i, j: (i, 0)),
        interpret=interpret,
        compiler_params=compiler_params(interpret),
        name=f"{mod.NAME}_{kernel.__name__}",
    )
    return run(call, interpret, *operands)[:rows]


# Rows per program of bwd_w (a multiple of block_nodes): the rows of one element, summed on chip.
CHUNK_ROWS = 64


class _Sums(Accumulate):
    """The output of a ``bwd_w`` program: the body's stores recorded (``Accumulate``), then
    each column's total over the program's rows *assigned* (``write``): every weight column
    is stored once per program, and no other program of the grid writes it."""

    def write(self, totals) -> None:
        from jax.experimental.pallas import triton as pltriton

        for (key, columns, _), total in zip(self.records, totals):
            s = jnp.sum(total, axis=0, keepdims=True)
            if key is not None:
                self.ref[key] = s
                continue
            cols, valid = columns()
            row = jnp.zeros((1,) + (1,) * (cols.ndim - 1), jnp.int32)
            pltriton.store(self.ref.at[row, jnp.where(valid, cols, self.ref.shape[1])], s,
                           mask=jnp.broadcast_to(valid, s.shape))


def _launch_bwd_w(mod, kernel, x, hs, g, elem, *, block_nodes: int, interpret: bool):
    """``bwd_w``: ``dF/dW`` summed per element on chip. The rows are sorted by element (a
    stable ``argsort``) and cut into chunks of at most ``CHUNK_ROWS`` rows of one element;
    one program per (chunk, channel block) runs the kernel body on tiles of ``block_nodes``
    rows gathered through the permutation (``Gather``), carries each stored tile's running
    sum across its tiles (unreduced, in registers) and writes one row of totals. The chunks'
    rows are then summed per element (``segment_sum`` over at most ``rows / CHUNK_ROWS +
    num_elements + 1`` rows instead of one per row). Rows with an element index out of range
    form chunks of the sentinel element ``num_elements``, dropped by that sum."""
    from jax.experimental import pallas as pl

    rows, dtype, num_el, r = x.shape[0], x.dtype, mod.NUM_ELEMENTS, block_nodes
    chunk = max(r, CHUNK_ROWS // r * r)
    safe = jnp.where((elem >= 0) & (elem < num_el), elem, num_el).astype(jnp.int32)
    perm = jnp.argsort(safe, stable=True).astype(jnp.int32)
    es = safe[perm]
    pos = jnp.arange(rows, dtype=jnp.int32) - jnp.searchsorted(es, es, side="left").astype(jnp.int32)
    chunk_id = jnp.cumsum((pos % chunk == 0).astype(jnp.int32)) - 1  # (rows,) nondecreasing
    max_chunks = rows // chunk + num_el + 1  # a run of L rows makes at most L / chunk + 1 chunks
    rowptr = jnp.searchsorted(chunk_id, jnp.arange(max_chunks + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    chunk_elem = jnp.where(rowptr[:-1] < rows, es[jnp.minimum(rowptr[:-1], rows - 1)], num_el)
    ins = (x, *hs, g)

    def body(rowptr_ref, perm_ref, *refs):
        srcs, out_ref = refs[:-1], refs[-1]
        i, c0 = pl.program_id(0), pl.program_id(1)  # outside the loop (interpret mode)
        start, end = rowptr_ref[i], rowptr_ref[i + 1]
        lanes = jax.lax.broadcasted_iota(jnp.int32, (r,), 0)

        def tile(t):
            e = start + t * r + lanes
            rid = perm_ref[jnp.minimum(e, rows - 1)]
            acc = _Sums(out_ref)
            kernel(*(Gather(src, rid, e < end) for src in srcs), acc, c0=c0)
            return acc

        first = tile(0)  # its records say what the body stores; an empty chunk adds zeros
        totals = jax.lax.fori_loop(
            1, (end - start + r - 1) // r,
            lambda t, carry: tuple(c + v for c, (_, _, v) in zip(carry, tile(t).records)),
            tuple(v for _, _, v in first.records))
        first.write(totals)

    body.__name__ = kernel.__name__
    operands = (rowptr, perm, *ins)
    call = pl.pallas_call(
        body,
        out_shape=out_struct((max_chunks, mod.WEIGHT_NUMEL), dtype, operands),
        grid=(max_chunks, mod.CHANNEL_BLOCKS),
        in_specs=[pl.BlockSpec(tuple(a.shape), lambda i, j, nd=a.ndim: (0,) * nd) for a in operands],
        out_specs=pl.BlockSpec((1, mod.WEIGHT_NUMEL), lambda i, j: (i, 0)),
        interpret=interpret,
        compiler_params=compiler_params(interpret),
        name=f"{mod.NAME}_{kernel.__name__}",
    )
    sums = run(call, interpret, *operands)
    return jax.ops.segment_sum(sums, chunk_elem, num_segments=num_el)


# jitted per (module, op, n, block, mode) and shapes: eager calls (a VJP evaluated outside
# jax.jit, e.g. by jax.test_util.check_grads) reuse the compiled kernel instead of tracing
# and compiling the pallas_call again each time
_launch = jax.jit(launch, static_argnums=(0, 1, 2), static_argnames=("block_nodes", "interpret"))


def _replace(hs: tuple, d: int, k) -> tuple:
    return hs[:d] + (k,) + hs[d + 1:]


def _drop(hs: tuple, d: int) -> tuple:
    return hs[:d] + hs[d + 1:]


def _add(a, b):
    return b if a is None else a + b


class _Family:
    """The ``jax.custom_vjp`` ops ``(op, n)`` of one module, block size and mode, made on first use."""

    def __init__(self, mod, block_nodes: int, interpret: bool):
        self.mod, self.block_nodes, self.interpret = mod, block_nodes, interpret
        self.degree = mod.DEGREE
        self.ops: dict = {}

    def zero(self, op: str, n: int) -> bool:
        """Whether ``(op, n)`` is identically zero (all its derivatives too)."""
        if n > self.mod.LEVELS:
            return n > self.degree or (op == "bwd_x" and n >= self.degree)
        return (op, n) not in self.mod.KERNELS

    def get(self, op: str, n: int):
        if (op, n) not in self.ops:
            self.ops[(op, n)] = self._make(op, n)
        return self.ops[(op, n)]

    def _make(self, op: str, n: int):
        mod = self.mod
        if self.zero(op, n):
            def zeros(x, hs, *rest):
                rows = mod.NUM_ELEMENTS if op == "bwd_w" else x.shape[0]
                return jnp.zeros((rows, _width(mod, op)), x.dtype)

            return zeros
        if n > mod.LEVELS:
            def refuse(*args):
                raise NotImplementedError(
                    f"symmetric contraction {mod.NAME!r}: a derivative of order {n + 1} in x needs kernels "
                    f"{op}_{n}, not generated (LEVELS = {mod.LEVELS}); regenerate with levels={n} or more "
                    f"(eqdsl.symmetric.pallas.render_files)")

            return refuse
        go = functools.partial(_launch, mod, op, n, block_nodes=self.block_nodes, interpret=self.interpret)
        get = self.get
        if op == "fwd":
            @jax.custom_vjp
            def f(x, hs, w, elem):
                return go(x, hs, w, None, elem)

            def f_bwd(res, k):
                x, hs, w, elem = res
                return (get("bwd_x", n)(x, hs, w, k, elem),
                        tuple(get("bwd_x", n - 1)(x, _drop(hs, d), w, k, elem) for d in range(n)),
                        get("bwd_w", n)(x, hs, k, elem), None)
        elif op == "bwd_x":
            @jax.custom_vjp
            def f(x, hs, w, g, elem):
                return go(x, hs, w, g, elem)

            def f_bwd(res, k):
                x, hs, w, g, elem = res
                more = hs + (k,)
                return (get("bwd_x", n + 1)(x, more, w, g, elem),
                        tuple(get("bwd_x", n)(x, _replace(hs, d, k), w, g, elem) for d in range(n)),
                        get("bwd_w", n + 1)(x, more, g, elem),
                        get("fwd", n + 1)(x, more, w, elem), None)
        else:
            @jax.custom_vjp
            def f(x, hs, g, elem):
                return go(x, hs, None, g, elem)

            def f_bwd(res, k):
                x, hs, g, elem = res
                return (get("bwd_x", n)(x, hs, k, g, elem),
                        tuple(get("bwd_x", n - 1)(x, _drop(hs, d), k, g, elem) for d in range(n)),
                        get("fwd", n)(x, hs, k, elem), None)

        def f_fwd(*args):
            # the primal through ``f`` itself: an outer level of differentiation must see
            # the custom rule again (a bare pallas_call has no derivative)
            return f(*args), args

        f.defvjp(f_fwd, f_bwd)
        return f


class SymmetricContractionFunctions:
    """A generated contraction's JAX entry points, bound to its kernels module ``mod``
    (``pallas_kernels``) and supported ``dtypes``."""

    def __init__(self, mod, dtypes: tuple[str, ...]):
        self.mod, self.dtypes = mod, tuple(dtypes)
        self._families: dict = {}

    def family(self, block_nodes: int | None, interpret: bool | None) -> _Family:
        r = self.mod.BLOCK_NODES if block_nodes is None else int(block_nodes)
        if r < 1 or r & (r - 1):
            raise ValueError(f"block_nodes must be a power of two, got {block_nodes}")
        key = (r, use_interpret(interpret))
        if key not in self._families:
            self._families[key] = _Family(self.mod, *key)
        return self._families[key]

    def check(self, x, weights, element):
        """Shapes and dtypes at trace time; element indices where concrete.

        Raises:
            TypeError: a non-array, a dtype not in ``dtypes``, ``x`` and ``weights`` of two
                dtypes, or a non-integer ``element``.
            ValueError: a wrong shape, or a concrete element index out of range.
        """
        mod = self.mod
        x, weights, element = as_array(x, "x"), as_array(weights, "weights"), as_array(element, "element")
        if x.ndim != 2 or x.shape[1] != mod.DIM_IN * mod.MUL:
            raise ValueError(f"x must have shape (num_nodes, {mod.DIM_IN * mod.MUL}), got {tuple(x.shape)}")
        if tuple(weights.shape) != (mod.NUM_ELEMENTS, mod.WEIGHT_NUMEL):
            raise ValueError(f"weights must have shape ({mod.NUM_ELEMENTS}, {mod.WEIGHT_NUMEL}) "
                             f"(num_elements, weight_numel), got {tuple(weights.shape)}")
        if element.shape != (x.shape[0],):
            raise ValueError(f"element must have shape ({x.shape[0]},) (one index per row of x), "
                             f"got {tuple(element.shape)}")
        if not jnp.issubdtype(element.dtype, jnp.integer):
            raise TypeError(f"element must hold integer indices, got dtype {element.dtype}")
        for name, a in (("x", x), ("weights", weights)):
            if str(a.dtype) not in self.dtypes:
                raise TypeError(f"{name} has dtype {a.dtype}; this contraction supports {', '.join(self.dtypes)}")
        if x.dtype != weights.dtype:
            raise TypeError(f"x and weights must have one dtype, got {x.dtype} and {weights.dtype}")
        if not isinstance(element, jax.core.Tracer) and element.size:
            e = np.asarray(element)
            if e.min() < 0 or e.max() >= mod.NUM_ELEMENTS:
                raise ValueError(f"element indices must lie in 0..{mod.NUM_ELEMENTS - 1}, "
                                 f"got min {e.min()}, max {e.max()}")
        return x, weights, element

    def symmetric_contraction(self, x, weights, element, *, block_nodes: int | None = None,
                              interpret: bool | None = None):
        """``out = W[element] . P(x)`` (``eqdsl.symmetric.ir``), differentiable in reverse mode.

        Args:
            x: ``(num_nodes, dim_in * mul)`` in the package's layout.
            weights: ``(num_elements, weight_numel)``, the IR's weight layout.
            element: ``(num_nodes,)`` integer element of each row.
            block_nodes: rows per program (a power of two; default ``BLOCK_NODES``).
            interpret: Pallas interpret mode (default: when JAX's backend is the CPU).

        Returns:
            ``(num_nodes, dim_out * mul)``, the dtype of ``x``.

        Raises:
            TypeError, ValueError: see ``check``.
        """
        x, weights, element = self.check(x, weights, element)
        fam = self.family(block_nodes, interpret)
        return fam.get("fwd", 0)(x, (), weights, element.astype(jnp.int32))
