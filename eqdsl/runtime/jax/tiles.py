"""In-kernel column access of the generated Pallas kernels (``load_vec``, ``store_vec``,
``load_tile``, ``store_tile``), ``conv_radial``'s weights formed on chip (``radial_rows``,
``radial_vec``), and the gathered / reducing operands the conv kernels hand the same
kernel bodies (``Gather``, ``Accumulate``)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

__all__ = ["load_vec", "store_vec", "load_tile", "store_tile", "DOT_MIN", "SMEM_BUDGET", "radial_smem_bytes",
           "RadialRows", "radial_rows", "radial_vec", "Gather", "Accumulate"]


# ------------------------------------------------------------------ in-kernel column access
#
# The generated kernels read and write whole rows of the spec's layout. A tile of
# ``pad`` channels (``pad`` = mul rounded up to a power of two, as the Triton lowering of
# Pallas wants every value power-of-two shaped) is either contiguous (``ir_mul``
# layout, ``2l+1 == 1`` or ``mul == 1``: columns ``start + c``), read by the kernel as
# ``ref[:, pl.ds(start, pad)]`` when ``mul == pad``, or it is not, and then these helpers
# build the column indices in the kernel and load/store through them:
#
# * ``load_vec`` / ``store_vec``: columns ``start + c * stride`` for ``c < count``
#   (weights of ``uvu`` paths, tiles of a non-power-of-two multiplicity);
# * ``load_tile`` / ``store_tile``: a whole ``mul_ir`` block ``mul x (2l+1)``: one
#   ``(rows, pad, dpad)`` load of the block's contiguous columns (``dpad`` = 2l+1 rounded
#   up to a power of two), split into its ``2l+1`` components on chip (reshape + unstack,
#   which the Triton lowering turns into ``tt.reshape`` / ``tt.split``); the store joins
#   the components (``tt.join``) and writes the block in one masked store. This is how
#   the Helion kernels read ``mul_ir`` rows (docs/architecture.md "What layout costs"): no layout
#   conversion pass outside the kernel and no per-component strided access.
#
# Loads clamp their indices into the block (lanes past ``count`` or ``2l+1`` read a real
# column again) and zero the lanes past ``count``, so every tile has zeros in its padded
# channels, which the kernels rely on. Stores are masked and send the masked lanes to
# column ``width`` (one past the row): in interpret mode an out-of-range scatter index is
# dropped, while a duplicate in-range index would race with the real write.


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _iota(shape, axis: int):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def _split_last(t, n: int) -> list:
    """``t`` ``(..., 2, ..., 2)`` (log2 ``n`` axes of 2) -> its ``n`` slices ``t[..., m]`` of
    the flattened last axes, in order of ``m`` (the last axis is the lowest bit)."""
    if n == 1:
        return [t]
    lo, hi = jnp.unstack(t, axis=-1)  # Triton: tt.split (only size-2 last axes are lowered)
    even, odd = _split_last(lo, n // 2), _split_last(hi, n // 2)
    return [x for pair in zip(even, odd) for x in pair]


def _join_last(parts: list):
    """Inverse of ``_split_last``: ``n`` arrays -> ``(..., 2, ..., 2)``."""
    if len(parts) == 1:
        return parts[0]
    return jnp.stack([_join_last(parts[0::2]), _join_last(parts[1::2])], axis=-1)  # tt.join


def _gather(ref, cols):
    """``ref[r, cols[0, ...]]`` for every row ``r`` of the block: ``(rows, *cols.shape[1:])``."""
    if isinstance(ref, Gather):
        return ref.take(cols)
    rows = _iota((ref.shape[0],) + (1,) * (cols.ndim - 1), 0)
    return ref[rows, cols]


def _scatter(ref, columns, value):
    """``ref[r, cols] = value[r]`` where ``valid`` (a masked store), for every row ``r``;
    ``columns()`` gives ``(cols, valid)`` (a reducing output computes them after its loop)."""
    if isinstance(ref, Accumulate):
        ref.add(columns, value)
        return
    from jax.experimental.pallas import triton as pltriton

    cols, valid = columns()
    rows = _iota((ref.shape[0],) + (1,) * (cols.ndim - 1), 0)
    mask = jnp.broadcast_to(valid, value.shape)
    pltriton.store(ref.at[rows, jnp.where(valid, cols, ref.shape[1])], value, mask=mask)


def _vec_cols(start, count: int, pad: int, stride: int):
    c = _iota((1, pad), 1)
    return start + jnp.minimum(c, count - 1) * stride, c < count


def _tile_cols(start, mul: int, dim: int, pad: int):
    dpad = _next_pow2(dim)
    c, m = _iota((1, pad, dpad), 1), _iota((1, pad, dpad), 2)
    return start + jnp.minimum(c, mul - 1) * dim + jnp.minimum(m, dim - 1), (c < mul) & (m < dim)


def load_vec(ref, start, *, count: int, pad: int, stride: int = 1):
    """In a kernel: ``(rows, pad)`` tile of columns ``start + c * stride``, ``c < count``;
    zero in lanes ``c >= count``. ``start`` may be traced (a loop index)."""
    cols, valid = _vec_cols(start, count, pad, stride)
    t = _gather(ref, cols)
    return t if count == pad else jnp.where(valid, t, 0)


def store_vec(ref, start, value, *, count: int, pad: int, stride: int = 1) -> None:
    """In a kernel: write lanes ``c < count`` of ``value`` ``(rows, pad)`` to columns
    ``start + c * stride``."""
    _scatter(ref, lambda: _vec_cols(start, count, pad, stride), value)


def load_tile(ref, start, *, mul: int, dim: int, pad: int) -> list:
    """In a kernel: the ``dim`` components of the ``mul_ir`` block ``mul x dim`` at column
    ``start`` (channel ``c``, component ``m`` at ``start + c * dim + m``), each a
    ``(rows, pad)`` tile, zero in lanes ``c >= mul``. One load of the block's columns."""
    cols, valid = _tile_cols(start, mul, dim, pad)
    t = _gather(ref, cols)  # (rows, pad, dpad)
    if mul != pad:
        t = jnp.where(_iota((1, pad, 1), 1) < mul, t, 0)
    dpad = cols.shape[-1]
    t = t.reshape(t.shape[:2] + (2,) * (dpad.bit_length() - 1))
    return _split_last(t, dpad)[:dim]


def store_tile(ref, start, parts: list, *, mul: int, dim: int, pad: int) -> None:
    """In a kernel: write components ``parts`` (``dim`` tiles ``(rows, pad)``, lanes
    ``c < mul`` used) as the ``mul_ir`` block at column ``start``: one masked store."""
    dpad = _next_pow2(dim)
    parts = list(parts) + [parts[0]] * (dpad - dim)  # padded components: masked out
    t = _join_last(parts)
    _scatter(ref, lambda: _tile_cols(start, mul, dim, pad), t.reshape(t.shape[:2] + (dpad,)))


# ------------------------------------------------------------------ conv_radial: weights on chip
#
# ``conv_radial`` takes each edge's radial features ``rf`` (E, H) and the radial MLP's last
# layer ``wr`` (H, weight_numel) instead of the per-edge weights ``rf @ wr``. A kernel
# reads a path's weight tile as ``w = rf_rows @ wr[:, columns]``: a ``jnp.dot`` when the
# Triton lowering of Pallas accepts one (every dimension >= ``DOT_MIN``: its float64 dot
# needs M >= 16, N >= 8, K >= 16, jax 0.10.2 ``_dot_general_lowering``; float32 needs >= 16),
# in full precision (``Precision.HIGHEST``: IEEE float32 inputs, not TF32, which would
# compute another function); else ``H`` multiply-adds of a feature column by a row of
# ``wr`` (``fma``: one rounding each on the GPU). The choice depends only on static
# shapes, so interpret mode on the CPU runs what the GPU runs.

DOT_MIN = 16
# Shared memory one program may ask for: the H100's opt-in maximum per block, 227 KiB
# (232,448 bytes; Triton refuses a kernel that asks for more: "Shared memory size limit
# exceeded: requested 311296, available: 232448" for mace_large's first radial forward
# kernel at 16 edges, float32).
SMEM_BUDGET = 232448


def radial_smem_bytes(rows: int, pad: int, cols: int, itemsize: int) -> int:
    """Static estimate of the shared memory of a radial kernel that forms its weight tiles
    with dots: the Triton lowering keeps every ``(pad, lanes)`` slice of the radial weight
    it multiplies (``cols`` lanes in all, ``eqdsl.backends.pallas.plan.count_radial_columns``)
    in shared memory for the whole kernel, plus the ``(rows, pad)`` features tile staged
    for the dots (counted four times: the measured request of mace_large's first forward
    kernel, 1,152 columns, ``H`` 64, 16 rows, float32, is ``4 * 64 * (1152 + 4 * 16)`` =
    311,296 bytes). ``pad``: ``H`` padded; ``itemsize``: 4 or 8."""
    return itemsize * pad * (cols + 4 * rows)


def _dot_precision(fast: bool, dtype):
    """The dots' precision: IEEE float32 (``Precision.HIGHEST``, Triton ``ieee``) unless
    ``fast`` (spec key ``pallas_radial_dot = 1``) asks for ``TF32_TF32_F32_X3`` (Triton
    ``tf32x3``: three TF32 tensor-core products, about float32 accuracy) in float32 on a
    GPU. float64 ignores it; XLA's CPU dot has no such algorithm, so interpret mode on the
    CPU keeps IEEE float32."""
    import jax

    if fast and jnp.dtype(dtype) == jnp.float32 and jax.default_backend() == "gpu":
        return lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    return lax.Precision.HIGHEST


class RadialRows:
    """The radial features of a kernel's rows (``radial_rows``): ``ref`` (a ref or
    ``Gather``, ``(rows, count)``); ``tile`` the ``(rows, pad)`` rows (zero past ``count``)
    when ``radial_vec`` may form weights with a dot, else None (columns are then read
    from ``ref`` where they are used, ``column``). Dots need ``rows`` and ``pad`` of at
    least ``DOT_MIN`` and, when the kernel's dot columns ``cols`` are known, a shared-memory
    estimate (``radial_smem_bytes``) within ``SMEM_BUDGET``: a kernel over it forms every
    tile with multiply-adds (no shared memory) rather than fail to compile. ``dot``: 1 for
    ``pallas_radial_dot = 1`` (``_dot_precision``)."""

    def __init__(self, ref, count: int, pad: int, cols: int | None = None, dot: int = 0):
        self.ref, self.count, self.pad = ref, count, pad
        rows = ref.shape[0]
        use = rows >= DOT_MIN and pad >= DOT_MIN
        if use and cols is not None:
            use = radial_smem_bytes(rows, pad, cols, jnp.dtype(ref.dtype).itemsize) <= SMEM_BUDGET
        self.precision = _dot_precision(bool(dot), ref.dtype)
        self.tile = load_vec(ref, 0, count=count, pad=pad) if use else None

    def column(self, h: int):
        """Feature ``h`` of every row, ``(rows, 1)``."""
        from jax.experimental import pallas as pl

        return self.ref[:, pl.ds(h, 1)]


def radial_rows(ref, *, count: int, pad: int, cols: int | None = None, dot: int = 0) -> RadialRows:
    """In a kernel, once at its top: the radial features ``ref`` ``(rows, count)`` of its
    rows (``count`` = H, ``pad`` = H rounded up to a power of two; ``cols``, ``dot``:
    ``RadialRows``')."""
    return RadialRows(ref, count, pad, cols, dot)


def radial_vec(rows: RadialRows, wr_ref, start, *, count: int, pad: int, stride: int = 1):
    """In a kernel: the weight tile ``(rows, pad)`` that ``load_vec(w_ref, start, count=,
    pad=, stride=)`` reads from materialized weights ``w = rf @ wr``, formed on chip:
    ``rows`` (``radial_rows``) times the columns ``start + c * stride`` (``c < count``) of
    ``wr_ref`` ``(H, weight_numel)``; zero in lanes ``c >= count``. ``start`` may be traced."""
    cols, valid = _vec_cols(start, count, pad, stride)  # (1, pad)
    h_count, dtype = rows.count, wr_ref.dtype
    if rows.tile is not None and pad >= DOT_MIN:
        h = _iota((rows.pad, 1), 0)
        wt = wr_ref[jnp.minimum(h, h_count - 1), cols]  # (H pad, pad): rows past H and lanes past count zeroed
        wt = jnp.where((h < h_count) & valid, wt, 0)
        return jnp.dot(rows.tile, wt, precision=rows.precision, preferred_element_type=dtype)
    from .fma import fma

    acc = None
    for h in range(h_count):  # a short unrolled multiply-add loop over the features
        wrow = wr_ref[jnp.full((1, 1), h, jnp.int32), cols]  # (1, pad)
        acc = rows.column(h) * wrow if acc is None else fma(rows.column(h), wrow, acc)
    return acc if count == pad else jnp.where(valid, acc, 0)


class Gather:
    """Operand of a generated kernel body whose rows are gathered: ``self[:, cols]`` is
    ``ref[idx, cols]`` with the rows where ``mask`` is false zeroed; ``take(cols)`` the
    same for an index array of columns (``load_vec`` / ``load_tile``).
    ``idx``, ``mask``: ``(edges,)``."""

    def __init__(self, ref, idx, mask):
        self.ref, self.idx, self.mask = ref, idx, mask
        self.shape = (idx.shape[0], ref.shape[1])
        self.dtype = ref.dtype

    def __getitem__(self, key):
        _, cols = key
        return jnp.where(self.mask[:, None], self.ref[self.idx, cols], 0)

    def take(self, cols):
        lead = (self.idx.shape[0],) + (1,) * (cols.ndim - 1)
        return jnp.where(self.mask.reshape(lead), self.ref[self.idx.reshape(lead), cols], 0)


class Accumulate:
    """Output of a generated kernel body that reduces over a node's edges. The body's stores
    are recorded, not written (``records``: ``(key, columns, value)`` per store: ``key`` of
    ``out_ref[key] = value``, or the column thunk of ``store_vec`` / ``store_tile``):
    ``launch_segments`` keeps their running sums in registers across the node's edge tiles
    and writes each column's total once (``write``)."""

    def __init__(self, ref):
        self.ref, self.shape, self.dtype = ref, ref.shape, ref.dtype
        self.records = []

    def __setitem__(self, key, value):
        self.records.append((key, None, value))

    def add(self, columns, value):
        self.records.append((None, columns, value))

    def write(self, totals) -> None:
        """Add the edge-axis sum of each of ``totals`` (the records' running sums, in
        record order) to the output row."""
        from jax.experimental.pallas import triton as pltriton

        for (key, columns, _), total in zip(self.records, totals):
            s = jnp.sum(total, axis=0, keepdims=True)
            if key is not None:
                self.ref[key] = self.ref[key] + s
                continue
            cols, valid = columns()
            row = jnp.zeros((1,) + (1,) * (cols.ndim - 1), jnp.int32)
            pltriton.store(self.ref.at[row, jnp.where(valid, cols, self.ref.shape[1])], self.ref[row, cols] + s,
                           mask=jnp.broadcast_to(valid, s.shape))
