"""Shared glue for the generated JAX modules: input checks, batch padding, in-kernel
column access (``load_tile`` & co.), kernel launches and the ``jax.custom_vjp`` wiring of
the four kernels.

No physics here: the generated ``pallas_kernels.py`` holds every CG coefficient. The
kernels read and write whole rows of the spec's layout (``mul_ir`` or ``ir_mul``) and
e3nn's weight order in place (see ``eqdsl.backends.pallas``): nothing here
rearranges operands outside a kernel. All functions here run at trace time on static
shapes.
"""

from __future__ import annotations

import contextvars
import functools
import math
from typing import Callable, NamedTuple

from .versions import check as _check_versions

_check_versions("jax", "jaxlib")

import jax  # noqa: E402  (after the version check: a clear error first)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

__all__ = [
    "check_inputs", "check_grad_out", "check_block_batch", "round_up", "bucket", "pad_rows", "kernel_weights",
    "user_weights", "load_vec", "store_vec", "load_tile", "store_tile", "fma", "use_interpret", "compiler_params", "launch_rows", "launch_weight_sum", "launch_fused", "TensorProductVJP",
    "make_vjp_ops", "make_conv_vjp_ops", "ConvGraph", "conv_graph", "check_conv_inputs", "launch_segments",
    "launch_edges", "conv_backward_fused", "segment_sum_rows", "PaddedGraph", "pad_graph",
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


def pad_rows(x, rows: int):
    """``x`` ``(batch, width)`` zero padded to ``rows >= batch`` rows (no copy if equal)."""
    return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def kernel_weights(w, numel: int, shared: bool, rows: int):
    """User weights (e3nn order: ``(numel,)`` shared, ``(batch, numel)`` per row) -> the
    kernels' weight operand ``(1 | rows, max(numel, 1))``: the same columns (the kernels
    read e3nn's order in place), rows padded; one zero column when no path is weighted
    (a Pallas operand cannot be empty)."""
    n = 1 if shared else rows
    if numel == 0:
        return jnp.zeros((n, 1), w.dtype)
    return w.reshape(1, numel) if shared else pad_rows(w, rows)


def user_weights(gw, numel: int, shared: bool, batch: int):
    """Inverse of ``kernel_weights`` for a weight gradient: ``(numel,)`` if shared else
    ``(batch, numel)``."""
    y = gw[: 1 if shared else batch, :numel]
    return y.reshape(numel) if shared else y


def use_interpret(interpret: bool | None) -> bool:
    """Explicit choice, else interpret mode exactly when the default backend is the CPU."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(interpret: bool, num_warps: int | None = None):
    """Triton compiler parameters (``num_warps``, default ``NUM_WARPS``) for a compiled
    kernel; none in interpret mode. Given also without a GPU: passing them selects the
    Triton lowering of Pallas (jax 0.10 defaults to Mosaic GPU when none are given), so
    that ``jit(...).trace(...).lower(lowering_platforms=("cuda",))`` on a CPU machine runs
    the real Pallas -> Triton lowering (the tests do)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=NUM_WARPS if num_warps is None else num_warps, num_stages=NUM_STAGES)


def _varying_axes(operands) -> frozenset:
    """The manual mesh axes (inside ``jax.shard_map`` with ``check_vma=True``) along which
    any of ``operands`` varies; empty elsewhere. Raises ``ValueError`` for an operand that
    is ``unreduced`` or ``reduced`` over an axis (a partial sum pending a collective): the
    kernels are not linear in all operands at once, so it must be reduced first."""
    varying = set()
    for a in operands:
        mat = getattr(jax.typeof(a), "manual_axis_type", None)
        if mat is None:
            continue
        if mat.unreduced or mat.reduced:
            raise ValueError("an operand of the tensor product is unreduced/reduced over mesh axes "
                             f"{sorted(mat.unreduced | mat.reduced)}; reduce it (jax.lax.psum) first")
        varying |= mat.varying
    return frozenset(varying)


def out_struct(shape, dtype, operands) -> jax.ShapeDtypeStruct:
    """The ``out_shape`` of a ``pallas_call`` on ``operands``: ``(shape, dtype)``, varying
    over the mesh axes along which any operand varies.

    Inside ``jax.shard_map`` (default ``check_vma=True``) JAX types every value with the
    manual mesh axes it varies over (``jax.typeof(x).manual_axis_type``) and requires the
    ``out_shape`` of a ``pallas_call`` to say it (``manual_axis_type``, jax 0.10 and 0.11):
    a kernel's output row depends on every operand, so it varies wherever one of them
    does. Outside ``shard_map`` the field is empty and ignored.
    """
    from jax.sharding import ManualAxisType

    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=ManualAxisType(varying=_varying_axes(operands)))


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
    if isinstance(ref, _Gather):
        return ref.take(cols)
    rows = _iota((ref.shape[0],) + (1,) * (cols.ndim - 1), 0)
    return ref[rows, cols]


def _scatter(ref, columns, value):
    """``ref[r, cols] = value[r]`` where ``valid`` (a masked store), for every row ``r``;
    ``columns()`` gives ``(cols, valid)`` (a reducing output computes them after its loop)."""
    if isinstance(ref, _Accumulate):
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


# Fused multiply-adds. The Triton pipeline that compiles Pallas kernels on the GPU (XLA's,
# jax 0.11) emits no FMA for ``a * b + c``: ncu counted 0 fused and 473 M unfused FP32
# instructions in mace_large's fused conv backward kernel, 245 M fused in the Helion one
# (H100, 2026-11-25). Generated bodies with ``pallas_fma = 1`` write their sums as chains of
# ``fma``, one PTX ``fma.rn`` each on the GPU; elsewhere (interpret mode) ``a * b + c``.
_INLINE_FMA = contextvars.ContextVar("eqdsl_inline_fma", default=False)
_FMA_PTX = {
    np.dtype(np.float32): ("fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f"),
    np.dtype(np.float64): ("fma.rn.f64 $0, $1, $2, $3;", "=d,d,d,d"),
}


def fma(a, b, c):
    """In a kernel: ``a * b + c`` with one rounding (PTX ``fma.rn``) when compiled for the
    GPU, else ``a * b + c``; operands broadcast to one shape, float32 or float64."""
    dtype = jnp.result_type(a, b, c)
    ptx = _FMA_PTX.get(np.dtype(dtype)) if _INLINE_FMA.get() else None
    if ptx is None:
        return a * b + c
    from jax.experimental.pallas import triton as pltriton

    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b), jnp.shape(c))
    args = [jnp.broadcast_to(jnp.asarray(x, dtype), shape) for x in (a, b, c)]
    return pltriton.elementwise_inline_asm(ptx[0], args=args, constraints=ptx[1], pack=1,
                                           result_shape_dtypes=[jax.ShapeDtypeStruct(shape, dtype)])[0]


def _run(call, interpret: bool, *operands):
    """``call(*operands)``, a ``pallas_call``: its kernel is traced here, with ``fma`` as
    inline PTX unless in interpret mode.

    Raises ``ValueError`` in interpret mode on operands that vary over manual mesh axes
    (inside ``jax.shard_map`` with ``check_vma=True``): Pallas' HLO interpreter evaluates
    the kernel's jaxpr, traced without mesh axes, on the varying operands, and the first
    constant in the kernel fails JAX's type check ("Primitive mul requires varying manual
    axes to match", jax 0.10.2; 0.11's interpreter is the same code). Running the
    interpreted call in a ``jax.pure_callback`` instead deadlocked on forced host devices.
    Compiled kernels (the GPU) type-check and run under ``check_vma=True``.
    """
    axes = _varying_axes(operands) if interpret else ()
    if axes:
        raise ValueError(
            "Pallas interpret mode cannot run inside jax.shard_map with check_vma=True (JAX's Pallas "
            f"interpreter fails on values varying over mesh axes {sorted(axes)}); on the CPU pass "
            "check_vma=False to jax.shard_map (compiled GPU kernels work with either)")
    token = _INLINE_FMA.set(not interpret)
    try:
        return call(*operands)
    finally:
        _INLINE_FMA.reset(token)


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
                interpret: bool,
                num_warps: int | None = None):
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
            out_shape=out_struct((rows, width), args[0].dtype, args),
            grid=(rows // block_batch,),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((block_batch, width), row_block),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + kernel.__name__,
        )
        pieces.append(_run(call, interpret, *args))
    return _concat(pieces)


def launch_weight_sum(name: str, kernels, args, *, out_width: int, block_batch: int, interpret: bool,
                num_warps: int | None = None):
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
                out_shape=out_struct((n, width), args[0].dtype, args),
                grid=(n,),
                in_specs=in_specs,
                out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
                interpret=interpret,
                compiler_params=compiler_params(interpret, num_warps),
                name=name + kernel.__name__,
            )
            part = jnp.sum(_run(call, interpret, *args), axis=0, keepdims=True)
            total = part if total is None else total + part
        pieces.append(total)
    return _concat(pieces)


def launch_fused(name: str, kernels, args, *, dim_in2: int, gw_segments, block_batch: int, interpret: bool,
                 num_warps: int | None = None, gx1_segments=None):
    """Run the fused backward kernels (``eqdsl.backends.pallas.fused``) of a channelwise product.

    ``args``: ``(x1, x2, w, g)``, ``(rows, width)`` each (per-row weights), blocked by
    ``block_batch`` rows. ``kernels``: ``(kernel, gx1 width, weight width)`` triples; each
    kernel writes three outputs: its ``x1`` blocks' gradient columns, a whole
    ``(rows, dim_in2)`` row of ``gx2`` partial sums and its paths' weight-gradient
    columns. Returns ``(gx1, gx2, gw)``: the ``gx1`` and ``gw`` pieces concatenated (``gw``
    reordered by ``gw_segments``, ``(start, width)`` per path in e3nn's order, when not
    None; ``gx1`` summed per ``x1`` block over its ``gx1_segments`` ranges when not None),
    the ``gx2`` partials added in kernel order (deterministic, no atomics).
    """
    from jax.experimental import pallas as pl

    rows = args[0].shape[0]
    _check_rows(rows, block_batch)
    dtype = args[0].dtype
    row_block = lambda i: (i, 0)  # noqa: E731
    in_specs = [pl.BlockSpec((block_batch, a.shape[1]), row_block) for a in args]
    pieces = []
    for kernel, width1, width_w in kernels:
        widths = (width1, dim_in2, width_w)
        call = pl.pallas_call(
            kernel,
            out_shape=tuple(out_struct((rows, n), dtype, args) for n in widths),
            grid=(rows // block_batch,),
            in_specs=in_specs,
            out_specs=tuple(pl.BlockSpec((block_batch, n), row_block) for n in widths),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + kernel.__name__,
        )
        pieces.append(_run(call, interpret, *args))
    gx1, gx2, gw = _join_fused(pieces, gw_segments)
    return _sum_segments(gx1, gx1_segments), gx2, gw


def _sum_segments(a, segments):
    """``a`` with its column ranges summed per output block: for each block, the sum of
    ``a[:, start:start + width]`` over its ``(start, width)`` ranges, in order; ``a`` itself
    when ``segments`` is None."""
    if segments is None:
        return a
    blocks = []
    for ranges in segments:
        total = a[:, ranges[0][0]:ranges[0][0] + ranges[0][1]]
        for start, width in ranges[1:]:
            total = total + a[:, start:start + width]
        blocks.append(total)
    return _concat(blocks)


def _join_fused(pieces, gw_segments):
    """The fused kernels' ``(gx1, gx2, gw)`` outputs, one triple per kernel, joined: the
    ``gx1`` and ``gw`` column pieces concatenated (``gw`` put in e3nn's order by
    ``gw_segments`` when not None), the ``gx2`` partial rows added in kernel order."""
    gx2 = pieces[0][1]
    for _, b, _ in pieces[1:]:
        gx2 = gx2 + b
    gw = _concat([c for _, _, c in pieces])
    if gw_segments is not None:
        gw = _concat([gw[:, s:s + n] for s, n in gw_segments])
    return _concat([a for a, _, _ in pieces]), gx2, gw


# ------------------------------------------------------------------ custom_vjp wiring


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
    (``eqdsl.runtime.jax_sharding.row_parallel``). ``shared_weights``: whether the weight
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
    """Row layout (``jax_sharding.RowLayout``) of a launch of the plain product: operands
    ``(a, b, c)``, ``c`` the weights (one row if shared) except for ``bwd_w`` (``c`` the
    output cotangent; the output one row if shared); ``fused``: ``(x1, x2, w, g) ->
    (gx1, gx2, gw)``."""
    from eqdsl.runtime.jax_sharding import RowLayout

    if kind == "fused":
        return RowLayout((True, True, not shared, True), (True, True, not shared))
    if kind == "bwd_w":
        return RowLayout((True, True, True), (not shared,))
    return RowLayout((True, True, not shared), (True,))


def _row_parallel(launch, kind: str, shared_weights: bool | None):
    """``launch`` made batch-parallel (``jax_sharding.row_parallel``): rows of any count,
    padded per device; one wrapper per row layout."""
    from eqdsl.runtime.jax_sharding import row_parallel

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
                extra = _varying_axes((ct,)) - _varying_axes((res[k],))
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


# ------------------------------------------------------------------ fused graph convolution
#
# ``conv(x, y, W)[n] = sum_{e: dst_e = n} TP(x[src_e], y_e, W_e)`` reuses the generated
# kernel bodies of the plain tensor product unchanged: a body only reads
# ``ref[:, pl.ds(start, size)]`` column tiles of its operands (and ``ref.shape[0]``) and
# writes ``out_ref[:, pl.ds(start, size)] = tile``. The conv kernels hand it
#
# * ``_Gather`` operands, whose column tiles are gathered rows ``ref[idx, pl.ds(...)]``
#   (node rows by ``src``/``dst``, edge rows by the sort permutation) with the rows of
#   invalid edges zeroed, and
# * for the reductions an ``_Accumulate`` output, which records each stored
#   ``(edges, size)`` tile; the segment loop keeps their running sums and adds each one's
#   column sum to the node's ``(1, size)`` output row once.
#
# So no per-edge message reaches HBM (except the dF/dx messages of the fused backward,
# ``conv_backward_fused``): the gathers and the reduction happen inside one kernel. The
# reduction is over dst-sorted (or src-sorted) CSR segments: one program per node walks
# its contiguous edge range ``block_edges`` edges per step (a ``fori_loop`` with a trip
# count read from the row pointers), carrying each stored tile's running sum in
# registers, in a fixed order: deterministic, bitwise reproducible, free of atomics.


class ConvGraph(NamedTuple):
    """Integer arrays describing a graph for the conv kernels (``rows`` = padded edge
    count, ``N`` = num_nodes). Invalid edges (an index out of ``[0, N)``, or padding
    rows) carry the sentinel ``N`` in ``src`` and ``dst``: they are in no segment and
    their gathered node rows are zero, so they contribute nothing.

    ``src``, ``dst`` ``(rows,)``; ``perm_dst`` the stable argsort of ``dst`` and
    ``rowptr_dst`` ``(N + 1,)`` its CSR row pointers, ``gather_dst = src[perm_dst]``;
    ``perm_src``, ``rowptr_src``, ``gather_src = dst[perm_src]`` the same sorted by
    ``src``; ``inv_degree`` ``(N,)`` ``1 / max(in-degree, 1)`` (float)."""

    src: jax.Array
    dst: jax.Array
    perm_dst: jax.Array
    rowptr_dst: jax.Array
    gather_dst: jax.Array
    perm_src: jax.Array
    rowptr_src: jax.Array
    gather_src: jax.Array
    inv_degree: jax.Array


def conv_graph(src, dst, num_nodes: int, rows: int, dtype) -> ConvGraph:
    """Sort and index a graph (jit-friendly jnp: two stable argsorts; the row pointers are
    the prefix sums of the in-degrees, counted with an integer scatter-add, which is exact
    in any order. ``jnp.searchsorted`` ran as an XLA while loop, one step per bit of the
    node count: about 1 ms per call on the H100 whatever the graph's size, 2026-11-25)."""
    n = num_nodes
    src, dst = src.astype(jnp.int32), dst.astype(jnp.int32)
    valid = (src >= 0) & (src < n) & (dst >= 0) & (dst < n)
    src = jnp.where(valid, src, n)
    dst = jnp.where(valid, dst, n)
    pad = rows - src.shape[0]
    if pad:
        src = jnp.pad(src, (0, pad), constant_values=n)
        dst = jnp.pad(dst, (0, pad), constant_values=n)
    def csr(key, other):
        perm = jnp.argsort(key, stable=True).astype(jnp.int32)
        counts = jnp.zeros((n + 1,), jnp.int32).at[key].add(1)  # the sentinel n counted last, dropped
        rowptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts[:n], dtype=jnp.int32)])
        return perm, rowptr, other[perm]

    pd, rd, gd = csr(dst, src)
    ps, rs, gs = csr(src, dst)
    degree = rd[1:] - rd[:-1]
    inv = 1.0 / jnp.maximum(degree, 1).astype(dtype)
    return ConvGraph(src, dst, pd, rd, gd, ps, rs, gs, inv)


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_conv_inputs(node_features, edge_attr, weights, src, dst, num_nodes, *, dim_in1: int, dim_in2: int,
                      weight_numel: int, shared_weights: bool, dtypes: tuple[str, ...], check: bool = True):
    """Check a conv call; ``ValueError`` / ``TypeError`` naming the argument.

    Always (also under ``jax.jit``, at trace time): ``num_nodes`` a non-negative Python
    int equal to ``node_features.shape[0]``; shapes ``(num_nodes, dim_in1)``,
    ``(num_edges, dim_in2)``, weights ``(num_edges, numel)`` or ``(numel,)`` if shared;
    ``src``/``dst`` integer ``(num_edges,)``; float dtypes of the spec, one dtype.
    With ``check`` and concrete (non-traced) ``src``/``dst``: every index in
    ``[0, num_nodes)`` (one device-to-host copy of the indices; pass ``check=False`` in
    hot loops). Traced indices cannot be checked: out-of-range edges are dropped.
    """
    if isinstance(num_nodes, (bool, np.bool_)) or not isinstance(num_nodes, (int, np.integer)):
        raise TypeError(f"num_nodes must be a Python int (static), got {type(num_nodes).__name__}")
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    x = _as_array(node_features, "node_features")
    y = _as_array(edge_attr, "edge_attr")
    w = _as_array(weights, "weights")
    src, dst = _as_array(src, "src"), _as_array(dst, "dst")
    if x.ndim != 2 or x.shape[1] != dim_in1:
        raise ValueError(f"node_features must have shape (num_nodes, {dim_in1}), got {tuple(x.shape)}")
    if x.shape[0] != num_nodes:
        raise ValueError(f"num_nodes={num_nodes} but node_features has {x.shape[0]} rows; they must match")
    if y.ndim != 2 or y.shape[1] != dim_in2:
        raise ValueError(f"edge_attr must have shape (num_edges, {dim_in2}), got {tuple(y.shape)}")
    num_edges = y.shape[0]
    for name, idx in (("src", src), ("dst", dst)):
        if not jnp.issubdtype(idx.dtype, jnp.integer):
            raise TypeError(f"{name} must be an integer index array, got dtype {idx.dtype}")
        if tuple(idx.shape) != (num_edges,):
            raise ValueError(f"{name} must have shape (num_edges,) = ({num_edges},) like edge_attr, "
                             f"got {tuple(idx.shape)}")
    want = (weight_numel,) if shared_weights else (num_edges, weight_numel)
    if tuple(w.shape) != want:
        kind = "shared weights" if shared_weights else "per-edge weights"
        raise ValueError(f"weights ({kind}) must have shape {want}, got {tuple(w.shape)}")
    for name, a in (("node_features", x), ("edge_attr", y), ("weights", w)):
        if str(a.dtype) not in dtypes:
            raise TypeError(f"{name} has dtype {a.dtype}; this tensor product supports {', '.join(dtypes)}")
    if not x.dtype == y.dtype == w.dtype:
        raise TypeError(f"node_features, edge_attr and weights must have one dtype, got {x.dtype}, {y.dtype}, {w.dtype}")
    if check and num_edges:
        for name, idx in (("src", src), ("dst", dst)):
            if _is_concrete(idx):
                v = np.asarray(idx)
                lo, hi = int(v.min()), int(v.max())
                if lo < 0 or hi >= num_nodes:
                    bad = lo if lo < 0 else hi
                    raise ValueError(f"{name} holds index {bad}, out of range for num_nodes={num_nodes}")
    return x, y, w, src, dst, num_nodes


class _Gather:
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


class _Accumulate:
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


class _ShapeOf:
    """Stand-in for an operand ref in ``_body_stores``'s abstract trace: indexing it gives
    zeros of the shape indexing the ref would give (rows ``:`` or an index array; columns
    ``pl.ds`` or an index array)."""

    def __init__(self, ref):
        self.shape, self.dtype = tuple(ref.shape), ref.dtype

    def __getitem__(self, key):
        rows, cols = key
        lead = (self.shape[0],) if isinstance(rows, slice) else tuple(jnp.shape(rows))
        if hasattr(cols, "size") and not hasattr(cols, "shape"):  # a pl.ds slice
            shape = lead + (cols.size,)
        else:
            shape = jnp.broadcast_shapes(lead, tuple(jnp.shape(cols)))
        return jnp.zeros(shape, self.dtype)


def _body_stores(body, ins, shared_arg: int | None, be: int, out_ref):
    """The stores of one edge tile of a reducing ``body``: ``(records, shapes)``, the
    ``_Accumulate`` records (their values abstract) and the stored values' shapes, from
    one abstract trace on stand-in operands (``jax.eval_shape``: nothing is emitted into
    the kernel)."""
    seen = {}

    def run():
        idx, mask = jnp.zeros((be,), jnp.int32), jnp.ones((be,), jnp.bool_)
        ops = [_ShapeOf(r) if k == shared_arg else _Gather(_ShapeOf(r), idx, mask) for k, r in enumerate(ins)]
        acc = _Accumulate(out_ref)
        body(*ops, acc)
        seen["records"] = acc.records
        return [v for _, _, v in acc.records]

    shapes = jax.eval_shape(run)
    return seen["records"], shapes


def _full_spec(a):
    from jax.experimental import pallas as pl

    nd = a.ndim
    return pl.BlockSpec(tuple(a.shape), lambda i: (0,) * nd)


def launch_segments(name, kernels, args, *, node_arg: int | None, shared_arg: int | None, perm, rowptr, gather,
                    num_nodes: int, out_width: int, block_edges: int, interpret: bool,
                num_warps: int | None = None):
    """Reduction kernels (``conv`` forward, ``conv`` backward_x1): one program per node ``n``
    sums the kernel body over the edges ``perm[rowptr[n]:rowptr[n + 1]]`` (sorted order), in
    tiles of ``block_edges``. ``args[node_arg]`` (if not None) is a node array gathered by
    ``gather`` (``(rows,)``, in sorted order; edges whose entry is the sentinel
    ``num_nodes`` count for nothing); the others are edge arrays gathered by ``perm``,
    except ``args[shared_arg]`` (shared weights, ``(1, width)``). Returns ``(num_nodes, out_width)``."""
    from jax.experimental import pallas as pl

    rows = perm.shape[0]
    if not kernels or not rows or not num_nodes:
        return jnp.zeros((num_nodes, out_width), args[0].dtype)
    be = block_edges

    def make(body):
        def kernel(rowptr_ref, perm_ref, gather_ref, *refs):
            *ins, out_ref = refs
            i = pl.program_id(0)
            start, end = rowptr_ref[i], rowptr_ref[i + 1]
            # zero the row in power-of-two column chunks (the Triton lowering wants pow2 shapes)
            col, width = 0, out_ref.shape[1]
            while col < width:
                size = 1 << ((width - col).bit_length() - 1)
                out_ref[:, pl.ds(col, size)] = jnp.zeros((1, size), out_ref.dtype)
                col += size
            lanes = lax.broadcasted_iota(jnp.int32, (be,), 0)

            def tile(t):
                e = start + t * be + lanes
                ec = jnp.minimum(e, rows - 1)
                eid = perm_ref[ec]
                nid = gather_ref[ec]
                mask = (e < end) & (nid < num_nodes)
                ops = []
                for k, r in enumerate(ins):
                    if k == shared_arg:
                        ops.append(r)
                    elif k == node_arg:
                        ops.append(_Gather(r, jnp.minimum(nid, num_nodes - 1), mask))
                    else:
                        ops.append(_Gather(r, eid, mask))
                acc = _Accumulate(out_ref)
                body(*ops, acc)
                return acc

            # The loop carries the running sum of each store of the body in registers,
            # unreduced: no cross-warp sum and no read-modify-write of the node's row per
            # tile, one of each per node (``_Accumulate.write``).
            records, shapes = _body_stores(body, ins, shared_arg, be, out_ref)
            totals = lax.fori_loop(
                0, (end - start + be - 1) // be,
                lambda t, carry: tuple(c + v for c, (_, _, v) in zip(carry, tile(t).records)),
                tuple(jnp.zeros(a.shape, a.dtype) for a in shapes),
            )
            out = _Accumulate(out_ref)
            out.records = records
            out.write(totals)

        kernel.__name__ = body.__name__
        return kernel

    operands = (rowptr, perm, gather, *args)
    pieces = []
    for body, width in kernels:
        call = pl.pallas_call(
            make(body),
            out_shape=out_struct((num_nodes, width), args[0].dtype, operands),
            grid=(num_nodes,),
            in_specs=[_full_spec(a) for a in operands],
            out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + "_conv" + body.__name__,
        )
        pieces.append(_run(call, interpret, *operands))
    return _concat(pieces)


def launch_edges(name, kernels, args, *, gathers: dict, shared_arg: int | None, shared_out: bool,
                 num_nodes: int, out_width: int, block_edges: int, interpret: bool,
                num_warps: int | None = None):
    """Per-edge kernels (``conv`` backward_x2 and backward_w): one program per
    ``block_edges`` edges (original order). ``gathers``: ``{arg: index (rows,)}`` for the
    node arrays among ``args`` (gathered rows, zero where the index is the sentinel
    ``num_nodes``); the other args are ``(rows, width)`` edge arrays, except
    ``args[shared_arg]``. Returns ``(rows, out_width)``, or with ``shared_out`` the
    ``(1, out_width)`` sum over edges (per-program partial sums, then one sum in a fixed
    order: deterministic)."""
    from jax.experimental import pallas as pl

    gather_args = sorted(gathers)
    rows = gathers[gather_args[0]].shape[0]
    _check_rows(rows, block_edges)
    if not kernels:
        return jnp.zeros((1 if shared_out else rows, out_width), args[0].dtype)
    be, blocks = block_edges, rows // block_edges
    ni = len(gather_args)

    def make(body):
        def kernel(*refs):
            idx_refs, ins, out_ref = refs[:ni], refs[ni:-1], refs[-1]
            ops = []
            for k, r in enumerate(ins):
                if k in gathers:
                    nid = idx_refs[gather_args.index(k)][...]
                    ops.append(_Gather(r, jnp.minimum(nid, num_nodes - 1), nid < num_nodes))
                else:
                    ops.append(r)
            body(*ops, out_ref)

        kernel.__name__ = body.__name__
        return kernel

    in_specs = [pl.BlockSpec((be,), lambda i: (i,)) for _ in gather_args]
    for k, a in enumerate(args):
        if k in gathers or k == shared_arg:
            in_specs.append(_full_spec(a))
        else:
            in_specs.append(pl.BlockSpec((be, a.shape[1]), lambda i: (i, 0)))
    operands = (*(gathers[k] for k in gather_args), *args)
    pieces = []
    for body, width in kernels:
        call = pl.pallas_call(
            make(body),
            out_shape=out_struct((blocks if shared_out else rows, width), args[0].dtype, operands),
            grid=(blocks,),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((1 if shared_out else be, width), lambda i: (i, 0)),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + "_conv" + body.__name__,
        )
        out = _run(call, interpret, *operands)
        pieces.append(jnp.sum(out, axis=0, keepdims=True) if shared_out else out)
    return _concat(pieces)


def conv_backward_fused(name, kernels, args, graph, *, num_nodes: int, dim_in2: int, gw_segments,
                        block_edges: int, segment_edges: int, interpret: bool, num_warps: int | None = None,
                        gx1_segments=None):
    """The conv's three gradients from one gather of each operand per edge (a channelwise
    product's fused backward kernels, ``eqdsl.backends.pallas.fused``).

    ``args``: ``(x, y, W, G)``, node features ``(N, dim_in1)``, edge rows ``(rows, .)``,
    per-edge weights, node cotangents ``(N, dim_out)``; ``graph`` a ``ConvGraph``. One
    program per ``block_edges`` edges gathers ``x[src]`` and ``G[dst]`` and runs the fused
    body, which writes ``dF/dy`` and ``dF/dW`` of its edges and each edge's ``dF/dx``
    message; a segment kernel then sums the messages into their ``src`` nodes
    (``segment_sum_rows``: a fixed order, no atomics). The three-kernel backward gathers
    ``G``, the widest operand, once per kernel. Kernels that own part of an ``x1`` block's
    paths write partial messages: their node sums are added per block after the segment
    sum (``gx1_segments``, as ``launch_fused``). Returns ``(gx (N, dim_in1), gy, gW)``
    (``gW`` in the kernel weight layout, as ``backward_w``).
    """
    from jax.experimental import pallas as pl

    x, y, w, g = args
    rows = y.shape[0]
    _check_rows(rows, block_edges)
    be, blocks, dtype = block_edges, rows // block_edges, y.dtype

    def make(body):
        def kernel(src_ref, dst_ref, x_ref, y_ref, w_ref, g_ref, *outs):
            s, d = src_ref[...], dst_ref[...]
            xs = _Gather(x_ref, jnp.minimum(s, num_nodes - 1), s < num_nodes)
            gd = _Gather(g_ref, jnp.minimum(d, num_nodes - 1), d < num_nodes)
            body(xs, y_ref, w_ref, gd, *outs)

        kernel.__name__ = body.__name__
        return kernel

    edge_block = lambda i: (i, 0)  # noqa: E731
    in_specs = [pl.BlockSpec((be,), lambda i: (i,))] * 2
    in_specs += [_full_spec(x), pl.BlockSpec((be, y.shape[1]), edge_block), pl.BlockSpec((be, w.shape[1]), edge_block),
                 _full_spec(g)]
    pieces = []
    for kernel, width1, width_w in kernels:
        widths = (width1, dim_in2, width_w)
        call = pl.pallas_call(
            make(kernel),
            out_shape=tuple(out_struct((rows, n), dtype, (graph.src, graph.dst, x, y, w, g)) for n in widths),
            grid=(blocks,),
            in_specs=in_specs,
            out_specs=tuple(pl.BlockSpec((be, n), edge_block) for n in widths),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + "_conv" + kernel.__name__,
        )
        pieces.append(_run(call, interpret, graph.src, graph.dst, x, y, w, g))
    msgs, gy, gw = _join_fused(pieces, gw_segments)
    gx = segment_sum_rows(name, msgs, perm=graph.perm_src, rowptr=graph.rowptr_src,
                          gather=graph.gather_src, num_nodes=num_nodes, block_edges=segment_edges,
                          interpret=interpret, num_warps=num_warps)
    return _sum_segments(gx, gx1_segments), gy, gw


def segment_sum_rows(name, rows_array, *, perm, rowptr, gather, num_nodes: int, block_edges: int, interpret: bool,
                     num_warps: int | None = None):
    """``out[n] = sum of rows_array[perm[rowptr[n]:rowptr[n + 1]]]`` (``launch_segments``
    with a body that stores its tile: the sum runs in a fixed order). ``(num_nodes, width)``."""
    from jax.experimental import pallas as pl

    width = rows_array.shape[1]

    def _segment_rows(m_ref, out_ref):
        col = 0
        while col < width:  # power-of-two column chunks (the Triton lowering wants pow2 shapes)
            size = 1 << ((width - col).bit_length() - 1)
            out_ref[:, pl.ds(col, size)] = m_ref[:, pl.ds(col, size)]
            col += size

    return launch_segments(name, [(_segment_rows, width)], (rows_array,), node_arg=None, shared_arg=None, perm=perm,
                           rowptr=rowptr, gather=gather, num_nodes=num_nodes, out_width=width,
                           block_edges=block_edges, interpret=interpret, num_warps=num_warps)


class PaddedGraph(NamedTuple):
    """A graph padded to bucket sizes by ``pad_graph`` (see there)."""

    node_features: jax.Array
    edge_attr: jax.Array
    weights: jax.Array
    src: jax.Array
    dst: jax.Array
    num_nodes: int
    num_real_nodes: int
    num_real_edges: int
    node_mask: jax.Array
    edge_mask: jax.Array


def pad_graph(node_features, edge_attr, weights, src, dst, num_nodes: int, *, shared_weights: bool,
              min_nodes: int = 16, min_edges: int = 64) -> PaddedGraph:
    """Pad a graph to bucket sizes so that ``jax.jit``-compiled code sees few shapes.

    Nodes are padded to ``bucket(num_nodes + 1, min_nodes)`` rows (at least one dummy
    node), edges to ``bucket(num_edges, min_edges)`` (powers of two up to 65536, then
    multiples of 65536: less than 2x the work, a handful of distinct shapes over a
    whole MD run). Padded nodes have zero features; padded edges point from and to the
    last (dummy) node and carry zero ``edge_attr`` and zero weights, so the rows of the
    real nodes of ``conv(...)`` and all gradients with respect to real inputs are
    unchanged (also with ``reduce = "mean"``: only the dummy node's degree changes).
    Take ``out[:num_real_nodes]`` or multiply by ``node_mask``. Call it outside ``jit``
    (the sizes are Python ints)."""
    n, e = int(num_nodes), int(np.shape(src)[0])
    n_pad, e_pad = bucket(n + 1, min_nodes), bucket(e, min_edges)
    dummy = n_pad - 1
    arrays = (node_features, edge_attr, weights, src, dst)
    # host arrays are padded with numpy: eager jnp ops would compile once per input shape
    xp = jnp if any(isinstance(a, jax.Array) for a in arrays) else np
    x = xp.pad(xp.asarray(node_features), ((0, n_pad - n), (0, 0)))
    y = xp.pad(xp.asarray(edge_attr), ((0, e_pad - e), (0, 0)))
    w = xp.asarray(weights)
    if not shared_weights:
        w = xp.pad(w, ((0, e_pad - e), (0, 0)))
    s, d = xp.asarray(src), xp.asarray(dst)
    if not np.issubdtype(s.dtype, np.integer) or not np.issubdtype(d.dtype, np.integer):
        raise TypeError(f"src and dst must be integer index arrays, got dtypes {s.dtype}, {d.dtype}")
    s = xp.pad(s, (0, e_pad - e), constant_values=dummy)
    d = xp.pad(d, (0, e_pad - e), constant_values=dummy)
    return PaddedGraph(x, y, w, s, d, n_pad, n, e, np.arange(n_pad) < n, np.arange(e_pad) < e)
