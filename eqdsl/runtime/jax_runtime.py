"""Shared glue for the generated JAX modules: input checks, layout conversion, padding.

No physics here: the generated ``pallas_kernels.py`` holds every CG coefficient. The
kernel layout (see ``eqdsl.codegen.pallas_backend``) stores each irreps block
``mul x l`` as ``2l+1`` rows of ``P = next_pow2(mul)`` contiguous channels; blocks
are described as ``(offset, mul, dim, P)`` tuples with ``offset`` in the spec's layout.
All functions here run at trace time on static shapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_inputs", "check_block_batch", "round_up", "bucket", "pack", "unpack", "pack_weights",
    "use_interpret", "compiler_params",
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


def unpack(pieces, blocks, layout: str, batch: int, *, identity: bool):
    """Kernel-layout output pieces (concatenated over columns) -> ``(batch, dim)`` in ``layout``."""
    y = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)
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
