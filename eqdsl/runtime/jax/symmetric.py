"""JAX runtime of a generated symmetric contraction (issue 27): the kernels' term tables, the
launches of its Pallas kernels and their ``jax.custom_vjp`` wiring, so that reverse-mode
derivatives of every order are kernels.

The generated ``pallas_kernels.py`` (``eqdsl.symmetric.pallas``) holds, for
``n = 0..LEVELS``, the partial derivatives of ``F_n(x, h_1..h_n, W, G) = D^n_x F[h_1..h_n]``,
``F(x, W, G) = sum G . out(x, W)``, as program bodies that loop over term tables::

    fwd_n(x, hs, W)      = dF_n/dG     rows like out
    bwd_x_n(x, hs, W, G) = dF_n/dx     rows like x
    bwd_w_n(x, hs, G)    = dF_n/dW     (num_elements, weight_numel): the body's per-node rows
                                        summed on chip over chunks of element-sorted rows

Tables. ``eqdsl.symmetric.tables.op_tables(fold.ir, op, n, "ir_mul")`` of the folded IR
(``eqdsl.symmetric.fold``) of the IR read back from the package's ``__init__`` and ``terms.py``
(``PackageTables``): ``fwd`` and ``bwd_x`` read the folded weights (``fold_weights``, one
matmul a launch), ``bwd_w`` writes their gradient, which ``unfold_weights`` turns into ``dW``; as int32 arrays of base columns
(every stride is 1 on ``ir_mul`` rows) and the coefficients in the operands' dtype; built once
per package, op and dtype (``table_arrays``) and passed to every launch as constants. The
kernels run on ``ir_mul`` rows: a ``mul_ir`` contraction's ``x`` is permuted into ``ir_mul``
once (a transpose of each irrep block, ``to_ir_mul``) and the result back, so every
derivative kernel reads and writes contiguous channel tiles (on an H100 the Helion kernels of
the same tables took 1.7 ms on ``ir_mul`` rows against 2.6 ms on ``mul_ir`` rows).

Grids (``launch``). ``fwd`` / ``bwd_x``: one program per (result slot, ``block_nodes`` rows,
``BLOCK_CHANNELS`` channels); the body's tile is stored at the slot's columns (rows past the
end and padded lanes masked). ``bwd_w``: the rows are sorted by element (a stable ``argsort``)
and cut into chunks of at most ``CHUNK_ROWS`` rows of one element; one program per (weight
row, chunk, channel block) runs the body on the chunk's tiles of ``block_nodes`` rows
(gathered through the permutation), sums them on chip and writes one row of the chunk's
totals; a ``segment_sum`` over the chunks (at most ``rows / CHUNK_ROWS + num_elements + 1``
rows) gives ``dW``. Deterministic, no atomics, no per-node ``dW`` in memory.

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
``L`` reaches the polynomials' degree (the default; the higher derivatives are zero:
``F_n = 0`` for ``n > DEGREE``, ``bwd_x_n = 0`` for ``n >= DEGREE``). Forward mode
(``jax.jvp``) is not supported (``jax.custom_vjp``).

Element indices. ``element`` picks each row's weights inside the kernels (a gather, no
``W[element]`` in memory). An index outside ``0..num_elements-1`` is refused with a
``ValueError`` when ``element`` is concrete; under ``jax.jit`` it cannot be checked, and
such a row reads a row of NaN (its output row is NaN, never another element's value; it adds
nothing to ``dW``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from eqdsl.irreps import Irreps
from eqdsl.symmetric.tables import PackageTables

from .checks import as_array
from .launch import compiler_params, out_struct, run, use_interpret

__all__ = ["SymmetricContractionFunctions", "KernelTables", "table_arrays", "launch", "launch_jit", "to_ir_mul",
           "from_ir_mul", "CHUNK_ROWS"]

# Rows per bwd_w program: at most this many rows of one element, summed on chip (a multiple
# of block_nodes). MACE-MP at 3,072 nodes: ~48 chunks + one per element present, x 86 weight
# rows x channel blocks programs.
CHUNK_ROWS = 64

_PACKAGE_TABLES: dict[str, PackageTables] = {}
_ARRAYS: dict[tuple, "KernelTables"] = {}
_FOLD_MATRICES: dict[tuple, np.ndarray] = {}


class KernelTables:
    """One kernel's tables as arrays (``table_arrays``): ``slots`` ``(S,)`` the result slots'
    base columns, ``mono_ptr`` ``(S * groups + 1,)``, ``mono`` ``(M, n + Q)`` each monomial's
    factor columns (``h_1..h_n``, then its ``x`` factors), ``mono_terms`` ``(M + 1,)``,
    ``heads`` ``(T, H)`` each term's head columns (``w``, ``g``: those the kind has), int32;
    ``coeff`` ``(T,)`` in the operands' dtype. Every array has one spare zero row at its end
    (no empty operand); the kernels never index it."""

    FIELDS = ("slots", "mono_ptr", "mono", "mono_terms", "heads", "coeff")

    def __init__(self, **arrays):
        for f in self.FIELDS:
            setattr(self, f, arrays[f])

    def arrays(self) -> tuple:
        return tuple(getattr(self, f) for f in self.FIELDS)


class _Refs:
    """The kernel's view of its tables: ``mono_ptr``, ``mono``, ``mono_terms``, ``heads``,
    ``coeff`` refs (what the generated bodies read as ``tables.<name>``)."""

    def __init__(self, mono_ptr, mono, mono_terms, heads, coeff):
        self.mono_ptr, self.mono, self.mono_terms, self.heads, self.coeff = mono_ptr, mono, mono_terms, heads, coeff


def _package_tables(mod) -> PackageTables:
    # keyed by the kernels file: two packages of one name in two directories (two imports
    # under one name, e.g. test runs) never share tables
    key = getattr(mod, "__file__", None) or mod.__name__
    got = _PACKAGE_TABLES.get(key)
    if got is None:
        got = _PACKAGE_TABLES[key] = PackageTables(mod.__package__ or mod.__name__.rpartition(".")[0])
    return got


def table_arrays(mod, op: str, n: int, dtype) -> KernelTables:
    """The tables of kernel ``(op, n)`` of the generated kernels module ``mod`` on ``ir_mul``
    rows, as numpy arrays (``KernelTables``), built once per (package, op, n, dtype) from the
    package's ``terms.py`` (``eqdsl.symmetric.tables.PackageTables``).

    Raises:
        AssertionError: tables whose group count or strides disagree with the kernels
            (a package whose files come from two generator versions).
    """
    dtype = jnp.dtype(dtype)
    pt = _package_tables(mod)
    key = (getattr(mod, "__file__", None) or mod.__name__, op, n, dtype.name)
    got = _ARRAYS.get(key)
    if got is not None:
        return got
    t = pt.get(op, n, "ir_mul", folded=True)
    if t.groups != mod.GROUPS[(op, n)]:
        raise AssertionError(f"{mod.NAME} {op}_{n}: tables have {t.groups} term groups, the kernel "
                             f"{mod.GROUPS[(op, n)]}: regenerate the package")
    names = t.columns
    head_at = [i for i, c in enumerate(names[:t.head_width]) if c in ("w", "g")]
    stride_at = [i for i, c in enumerate(names[:t.head_width]) if c.endswith("_stride")]

    def ints(rows, width):
        a = np.zeros((len(rows) + 1, width), np.int32)
        if rows:
            a[:-1] = np.asarray(rows, np.int64).reshape(len(rows), width)
        return a

    cols = ints(t.cols, len(names))
    mono_cols = ints(t.mono_cols, len(names) - t.head_width)
    slots = ints(t.slots, 2)
    # ir_mul rows: every stride 1 (0 in a monomial's unused x columns)
    if not (np.all(slots[:-1, 1] == 1) and np.all(cols[:-1][:, stride_at] == 1)
            and np.all(np.isin(mono_cols[:-1, 1::2], (0, 1)))):
        raise AssertionError(f"{mod.NAME} {op}_{n}: ir_mul tables with a column stride other than 1")
    coeff = np.zeros(len(t.coeff) + 1, dtype)
    coeff[:-1] = t.coeff
    got = KernelTables(slots=np.ascontiguousarray(slots[:, 0]), mono_ptr=np.asarray(t.mono_ptr + (0,), np.int32),
                       mono=np.ascontiguousarray(mono_cols[:, 0::2]),
                       mono_terms=np.asarray(t.mono_terms + (0,), np.int32),
                       heads=np.ascontiguousarray(cols[:, head_at]), coeff=coeff)
    _ARRAYS[key] = got
    return got


# ------------------------------------------------------------------ layouts


def _blocks(mod, which: str) -> tuple[int, ...]:
    ir = _package_tables(mod).ir
    irreps = ir.irreps_in if which == "in" else ir.irreps_out
    return tuple(mi.ir.dim for mi in Irreps(irreps))


def _layout(mod) -> str:
    return _package_tables(mod).ir.layout


def to_ir_mul(mod, a, which: str):
    """Rows ``a`` ``(N, dim * mul)`` of the package's layout in ``ir_mul`` (``which``: ``"in"``,
    x-shaped, or ``"out"``): each ``mul_ir`` irrep block ``(mul, 2l+1)`` transposed; ``a``
    itself for an ``ir_mul`` package. Differentiable (its VJP is the inverse transpose)."""
    if _layout(mod) == "ir_mul":
        return a
    mul, parts, s = mod.MUL, [], 0
    for d in _blocks(mod, which):
        b = a[:, s:s + d * mul]
        parts.append(b if d == 1 else b.reshape(-1, mul, d).transpose(0, 2, 1).reshape(-1, d * mul))
        s += d * mul
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def from_ir_mul(mod, a, which: str):
    """Inverse of ``to_ir_mul``."""
    if _layout(mod) == "ir_mul":
        return a
    mul, parts, s = mod.MUL, [], 0
    for d in _blocks(mod, which):
        b = a[:, s:s + d * mul]
        parts.append(b if d == 1 else b.reshape(-1, d, mul).transpose(0, 2, 1).reshape(-1, d * mul))
        s += d * mul
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


# ------------------------------------------------------------------ launches


def _width(mod, op: str) -> int:
    return {"fwd": mod.DIM_OUT * mod.MUL, "bwd_x": mod.DIM_IN * mod.MUL, "bwd_w": mod.WEIGHT_NUMEL}[op]


def _fold_matrix(mod, dtype) -> np.ndarray:
    """The ``(P, K)`` fold matrix of ``mod``'s package (``eqdsl.symmetric.fold``) in ``dtype``, once."""
    key = (getattr(mod, "__file__", None) or mod.__name__, jnp.dtype(dtype).name)
    got = _FOLD_MATRICES.get(key)
    if got is None:
        fold = _package_tables(mod).fold
        got = np.zeros((fold.rows, fold.cols), np.float64)
        for p, kk, v in fold.entries:
            got[p, kk] += v
        got = _FOLD_MATRICES[key] = got.astype(dtype)
    return got


def fold_weights(mod, w):
    """The folded weights ``A`` ``(num_elements, P * mul)`` of ``w`` ``(num_elements,
    weight_numel)``: ``A[e, p] = sum_kk F[p, kk] w[e, kk]`` over rows of ``mul`` channels
    (``eqdsl.symmetric.fold``; ``Precision.HIGHEST``: never a reduced-precision matmul)."""
    f = _fold_matrix(mod, w.dtype)
    e = w.shape[0]
    a = jnp.einsum("pk,ekc->epc", f, w.reshape(e, f.shape[1], mod.MUL), precision=lax.Precision.HIGHEST)
    return a.reshape(e, f.shape[0] * mod.MUL)


def unfold_weights(mod, ga):
    """``dW`` ``(num_elements, weight_numel)`` of ``ga``, a gradient with respect to the folded
    weights ``(num_elements, P * mul)``: ``F^T`` per element."""
    f = _fold_matrix(mod, ga.dtype)
    e = ga.shape[0]
    w = jnp.einsum("pk,epc->ekc", f, ga.reshape(e, f.shape[0], mod.MUL), precision=lax.Precision.HIGHEST)
    return w.reshape(e, f.shape[1] * mod.MUL)


def _lanes(mod, j):
    """Program ``j``'s channels ``(1, lanes)`` (lanes past ``CHANNEL_COUNT`` read the last
    channel again) and which lanes are real."""
    lane = lax.broadcasted_iota(jnp.int32, (1, mod.BLOCK_CHANNELS), 1)
    ok = lane < mod.CHANNEL_COUNT
    if mod.CHANNEL_COUNT != mod.BLOCK_CHANNELS:
        lane = jnp.minimum(lane, mod.CHANNEL_COUNT - 1)
    return j * mod.BLOCK_CHANNELS + lane, ok


def _store(out_ref, rows, cols, value, mask):
    """``out[rows, cols] = value`` where ``mask``: masked lanes go to one past the row (an
    out-of-range scatter index is dropped in interpret mode, where a duplicate in-range index
    would race with the real write)."""
    from jax.experimental.pallas import triton as pltriton

    mask = jnp.broadcast_to(mask, value.shape)
    pltriton.store(out_ref.at[rows, jnp.where(mask, cols, out_ref.shape[1])], value, mask=mask)


def launch(mod, op: str, n: int, x, hs, w, g, elem, *, block_nodes: int, interpret: bool):
    """Run kernel ``(op, n)`` of the generated module ``mod`` (``KERNELS``) on ``ir_mul`` rows
    ``x``, ``hs``, ``g``; ``w`` the weight table ``(num_elements, weight_numel)``, ``elem``
    ``(rows,)`` int32. Returns rows like ``out`` / ``x`` (``fwd`` / ``bwd_x``) or the
    per-element sums ``(num_elements, weight_numel)`` (``bwd_w``); zeros for an absent
    kernel (identically zero)."""
    from jax.experimental import pallas as pl

    rows, dtype = x.shape[0], x.dtype
    width = _width(mod, op)
    kernel = mod.KERNELS.get((op, n))
    if kernel is None or rows == 0:
        return jnp.zeros((mod.NUM_ELEMENTS if op == "bwd_w" else rows, width), dtype)
    tabs = table_arrays(mod, op, n, dtype)
    num_el, r = mod.NUM_ELEMENTS, block_nodes
    if op == "bwd_w":  # the kernel writes dA, the folded weights' gradient
        width = _package_tables(mod).fold.ir.weight_numel
    else:
        w = fold_weights(mod, w)
    # an index out of range is the sentinel num_el: its weight row is NaN (fwd, bwd_x), its
    # rows form chunks that the per-element sum drops (bwd_w)
    safe = jnp.where((elem >= 0) & (elem < num_el), elem, num_el).astype(jnp.int32)
    slots = tabs.slots.shape[0] - 1
    full = lambda a: pl.BlockSpec(tuple(a.shape), lambda *_, nd=a.ndim: (0,) * nd)  # noqa: E731

    if op == "bwd_w":
        operands = (x, *hs, g)
        chunk = max(r, CHUNK_ROWS // r * r)
        perm = jnp.argsort(safe, stable=True).astype(jnp.int32)
        es = safe[perm]
        pos = jnp.arange(rows, dtype=jnp.int32) - jnp.searchsorted(es, es, side="left").astype(jnp.int32)
        chunk_id = jnp.cumsum((pos % chunk == 0).astype(jnp.int32)) - 1  # (rows,) nondecreasing
        max_chunks = rows // chunk + num_el + 1  # a run of L rows makes at most L / chunk + 1 chunks
        rowptr = jnp.searchsorted(chunk_id, jnp.arange(max_chunks + 1, dtype=jnp.int32),
                                  side="left").astype(jnp.int32)
        chunk_elem = jnp.where(rowptr[:-1] < rows, es[jnp.minimum(rowptr[:-1], rows - 1)], num_el)
        index = (rowptr, perm)
        grid = (slots, max_chunks, mod.CHANNEL_BLOCKS)
        out_rows = max_chunks
    else:
        w_ext = jnp.concatenate([w, jnp.full((1, w.shape[1]), jnp.nan, dtype)], axis=0)
        operands = (x, *hs, w_ext) + ((g,) if op == "bwd_x" else ())
        index = (safe,)
        grid = (slots, -(-rows // r), mod.CHANNEL_BLOCKS)
        out_rows = rows

    def body(slots_ref, mono_ptr_ref, mono_ref, mono_terms_ref, heads_ref, coeff_ref, *refs):
        index_refs, refs = refs[:len(index)], refs[len(index):]
        ins, out_ref = refs[:-1], refs[-1]
        tables = _Refs(mono_ptr_ref, mono_ref, mono_terms_ref, heads_ref, coeff_ref)
        slot, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)  # outside loops (interpret mode)
        c, lane_ok = _lanes(mod, j)
        cols = slots_ref[slot] + c
        lane = lax.broadcasted_iota(jnp.int32, (r,), 0)
        if op == "bwd_w":
            rowptr_ref, perm_ref = index_refs
            start, end = rowptr_ref[i], rowptr_ref[i + 1]

            def tile(t, acc):
                p = start + t * r + lane
                rid = perm_ref[jnp.minimum(p, rows - 1)][:, None]
                part = kernel(slot, rid, None, c, tables, *ins)
                return acc + jnp.where((p < end)[:, None], part, 0)

            tiles = lax.div(end - start + (r - 1), jnp.int32(r))
            acc = lax.fori_loop(0, tiles, tile, jnp.zeros((r, c.shape[1]), dtype))
            total = jnp.sum(acc, axis=0, keepdims=True)
            _store(out_ref, jnp.full((1, 1), i, jnp.int32), cols, total, lane_ok)
        else:
            (elem_ref,) = index_refs
            b = i * r + lane
            rid = jnp.minimum(b, rows - 1)
            e = elem_ref[rid][:, None]
            rid = rid[:, None]
            tile = kernel(slot, rid, e, c, tables, *ins)
            valid = (b < rows)[:, None]
            _store(out_ref, jnp.where(valid, rid, rows), cols, tile, valid & lane_ok)

    body.__name__ = kernel.__name__
    args = (*tabs.arrays(), *index, *operands)
    call = pl.pallas_call(
        body,
        out_shape=out_struct((out_rows, width), dtype, operands),
        grid=grid,
        in_specs=[full(a) for a in args],
        out_specs=pl.BlockSpec((out_rows, width), lambda *_: (0, 0)),
        interpret=interpret,
        compiler_params=compiler_params(interpret),
        name=f"{mod.NAME}_{kernel.__name__}",
    )
    out = run(call, interpret, *args)
    if op == "bwd_w":
        return unfold_weights(mod, jax.ops.segment_sum(out, chunk_elem, num_segments=num_el))
    return out


# jitted per (module, op, n, block, mode) and shapes: eager calls (a VJP evaluated outside
# jax.jit, e.g. by jax.test_util.check_grads) reuse the compiled kernel instead of tracing
# and compiling the pallas_call again each time
launch_jit = jax.jit(launch, static_argnums=(0, 1, 2), static_argnames=("block_nodes", "interpret"))


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
                    f"(eqdsl.symmetric.pallas.render_files; the default generates every order)")

            return refuse
        go = functools.partial(launch_jit, mod, op, n, block_nodes=self.block_nodes, interpret=self.interpret)
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
        # the kernels run on ir_mul rows (channels contiguous): a mul_ir x is permuted in, out back
        out = fam.get("fwd", 0)(to_ir_mul(self.mod, x, "in"), (), weights, element.astype(jnp.int32))
        return from_ir_mul(self.mod, out, "out")
