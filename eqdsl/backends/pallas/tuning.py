"""Tuning of the Pallas kernels: the ``pallas_*`` spec keys, their validation and defaults.

A spec's ``[tensor_product.tuning]`` table reaches the backends as sorted ``(key, value)``
pairs (``TensorProductSpec.tuning``); ``tuning_of`` reads this backend's keys into a
``PallasTuning``. The Pallas keys apply to every kernel of a product (no per-op
sub-tables).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KEYS", "validate", "PallasTuning", "tuning_of", "BLOCK_ELEMS", "MIN_BLOCK_BATCH", "MAX_BLOCK_BATCH",
           "DEFAULT_NUM_WARPS", "DEFAULT_SEGMENT_EDGES", "DTYPES",
           "DTYPE_KEYS"]

# Target elements per (block_batch, P) tile: sets the default batch block from the
# widest channel tile (512 -> 4 rows x 128 channels, the best first Pallas config seen).
BLOCK_ELEMS = 512
MIN_BLOCK_BATCH, MAX_BLOCK_BATCH = 4, 64
# Triton warps per program unless the spec's tuning says otherwise.
DEFAULT_NUM_WARPS = 4
# conv segment kernels: edges per loop step (spec key pallas_segment_edges). Forward on
# bulk Si (114,688 edges; H100, 2026-11-25), 1 / 2 / 4 edges: mace_large 3,572 / 1,824 /
# 7,811 us, nequip_toluene 6,336 / 1,236 / 2,304 us. Four carry four rows of every running
# sum (spills); one leaves half of nequip_toluene's 64-channel tiles' threads idle
DEFAULT_SEGMENT_EDGES = 2
# dtypes a per-dtype key may name, and those keys: ``pallas_block_batch_float64`` -> ``float64``
DTYPES = ("float32", "float64")
DTYPE_KEYS = {f"{key}_{dtype}": dtype
              for key in ("pallas_block_batch", "pallas_segment_edges", "pallas_conv_max_terms",
                          "pallas_conv_fused_max_terms", "pallas_num_warps")
              for dtype in DTYPES}


def _pow2(lo: int, hi: int):
    return lambda v: lo <= v <= hi and v & (v - 1) == 0, f"a power of two in [{lo}, {hi}]"


# key -> (test, what the test accepts)
KEYS = {
    # batch rows per program and Triton warps per program
    "pallas_block_batch": _pow2(1, 256),
    "pallas_num_warps": (lambda v: v in (1, 2, 4, 8, 16), "one of 1, 2, 4, 8, 16"),
    "pallas_segment_edges": _pow2(1, 256),
    "pallas_conv_max_terms": (lambda v: v >= 1, "at least 1"),
    "pallas_conv_fused_max_terms": (lambda v: v >= 1, "at least 1"),
    "pallas_fma": (lambda v: v in (0, 1), "0 (a * b + c) or 1 (the kernels' sums as fused multiply-add chains)"),
    "pallas_factor": (lambda v: v in (0, 1, 2), "0 (one term per CG nonzero), 1 (the kernels' sums factored) or 2 "
                      "(the backward kernels' only)"),
    "pallas_fuse_bwd": (lambda v: v in (0, 1), "0 (three backward kernels) or 1 (the fused backward where the "
                        "product is channelwise)"),
    "pallas_conv_fuse_bwd": (lambda v: v in (0, 1), "0 (three backward kernels) or 1 (the conv's fused backward where "
                             "the product is channelwise)"),
    "pallas_unroll": (lambda v: v in (1, 2, 4, 8), "one of 1, 2, 4, 8 (channel-loop steps per iteration, their reads "
                      "first)"),
    "pallas_radial_dot": (lambda v: v in (0, 1), "0 (conv_radial's on-chip products in IEEE float32) or 1 (TF32x3: "
                          "three TF32 tensor-core products, about float32 accuracy)"),
    "pallas_radial_materialize": (lambda v: v in (0, 1), "0 (conv_radial's weights formed on chip) or 1 (formed "
                                  "with a matmul, then the conv's kernels)"),
}
# the per-dtype keys (DTYPE_KEYS) accept what their key does, for one dtype only (float64
# values take twice the registers: mace_large's fused backward at 4 rows spilled)
KEYS.update({key: KEYS[key.rsplit("_", 1)[0]] for key in DTYPE_KEYS})


def validate(key: str, value) -> None:
    """Check one ``[tensor_product.tuning]`` entry of this backend.

    Args:
        key: a key of ``KEYS``.
        value: the spec's value.

    Raises:
        KeyError: ``key`` is not a Pallas key.
        ValueError: ``value`` is not an integer that ``key`` accepts (the message says what is).
    """
    test, accepts = KEYS[key]
    if not isinstance(value, int) or isinstance(value, bool) or not test(value):
        raise ValueError(f"expected an integer, {accepts}; got {value!r}")


@dataclass(frozen=True)
class PallasTuning:
    """The Pallas keys of a spec, defaults filled in.

    ``block_batch``: rows per program, None for the size rule of ``assemble`` (``BLOCK_ELEMS``
    over the widest tile, clamped to ``[MIN_BLOCK_BATCH, MAX_BLOCK_BATCH]``).
    ``factor``: 0 (one term per CG nonzero), 1 (sums factored, ``passes.factor_kernel``; the
    fused backward in its ``q_j`` form) or 2 (the backward kernels only). ``fma``: sums as
    ``rt.fma`` chains. ``unroll``: channel-loop steps per loop iteration, their reads first
    (``passes.unroll_kernel``; 1: none). ``fuse_bwd`` / ``conv_fuse_bwd``: the fused backward of a channelwise
    product for the plain product / the conv. ``conv_max_terms`` / ``conv_fused_max_terms``:
    None, or the conv's own kernels split within that many CG terms each. ``radial_dot``:
    ``conv_radial``'s on-chip products (``rf_rows @ radial_weight[:, cols]``) in IEEE float32
    (0) or ``DotAlgorithmPreset.TF32_TF32_F32_X3`` (1: Triton ``tf32x3``, faster, about float32
    accuracy, not bitwise IEEE; float32 on the GPU only, ``eqdsl.runtime.jax.tiles``).
    ``radial_materialize``: ``conv_radial`` generates no radial kernels and runs
    ``conv(x, y, rf @ wr)`` (a full-precision matmul, then the conv's kernels).
    ``block_batch_by_dtype`` / ``segment_edges_by_dtype``: ``(dtype, value)`` pairs of the
    ``pallas_block_batch_<dtype>`` / ``pallas_segment_edges_<dtype>`` keys, which replace
    ``block_batch`` / ``segment_edges`` for that dtype's calls. ``conv_max_terms_by_dtype``:
    the ``pallas_conv_max_terms_<dtype>`` keys, each a conv kernel family of that dtype's own
    (split within that many CG terms per kernel) in place of the conv's for that dtype.
    ``conv_fused_max_terms_by_dtype``: the ``pallas_conv_fused_max_terms_<dtype>`` keys, that
    dtype's family with its fused backward split within that many terms (down to part of an
    x1 block's paths), its other kernels as ``conv_max_terms_by_dtype`` or the conv's.
    ``num_warps_by_dtype``: the ``pallas_num_warps_<dtype>`` keys, Triton warps per program of
    every kernel that dtype's calls launch, in place of ``num_warps``.
    """

    block_batch: int | None = None
    num_warps: int = DEFAULT_NUM_WARPS
    segment_edges: int = DEFAULT_SEGMENT_EDGES
    factor: int = 0
    fma: bool = False
    fuse_bwd: bool = True
    conv_fuse_bwd: bool = True
    conv_max_terms: int | None = None
    conv_fused_max_terms: int | None = None
    unroll: int = 1
    radial_dot: int = 0
    radial_materialize: bool = False
    block_batch_by_dtype: tuple[tuple[str, int], ...] = ()
    segment_edges_by_dtype: tuple[tuple[str, int], ...] = ()
    conv_max_terms_by_dtype: tuple[tuple[str, int], ...] = ()
    conv_fused_max_terms_by_dtype: tuple[tuple[str, int], ...] = ()
    num_warps_by_dtype: tuple[tuple[str, int], ...] = ()


def tuning_of(pairs=()) -> PallasTuning:
    """``PallasTuning`` of a spec's tuning pairs (other backends' keys ignored; the values are
    checked by ``validate``, through ``eqdsl.backends.check_tuning``, before generating)."""
    v = dict(pairs)
    return PallasTuning(
        block_batch=v.get("pallas_block_batch"),
        num_warps=int(v.get("pallas_num_warps", DEFAULT_NUM_WARPS)),
        segment_edges=int(v.get("pallas_segment_edges", DEFAULT_SEGMENT_EDGES)),
        # pallas_factor: measured per problem, so not the default. On the H100 (2026-11-25) it
        # took mace_large's JAX conv fwd+bwd on bulk Si from 5,131 to 4,642 us and
        # nequip_benzene's TP fwd+bwd from 4,756 to 3,968, but nequip_toluene's conv fwd+bwd
        # from 3,447 to 4,196 and most forwards 4-11% slower; pallas_factor = 2 keeps the
        # forward kernels unfactored
        factor=int(v.get("pallas_factor", 0)),
        # pallas_fma: XLA's Triton pipeline fuses no a * b + c
        fma=bool(v.get("pallas_fma", 0)),
        # pallas_fuse_bwd = 0: the three backward kernels instead (mace_large's fused Pallas
        # backward measured slower than them on the H100, 2026-11-23: 2208 against 1808 us
        # fwd+bwd). The conv's backward gathers G, its widest operand, once per kernel: its
        # fused form (pallas_conv_fuse_bwd) gathers it once
        fuse_bwd=bool(v.get("pallas_fuse_bwd", 1)),
        conv_fuse_bwd=bool(v.get("pallas_conv_fuse_bwd", 1)),
        conv_max_terms=v.get("pallas_conv_max_terms"),
        conv_fused_max_terms=v.get("pallas_conv_fused_max_terms"),
        # pallas_unroll: channel-loop steps per iteration, their reads first (passes.unroll_kernel)
        unroll=int(v.get("pallas_unroll", 1)),
        # pallas_radial_dot: an opt-in speed / accuracy trade-off (another rounding of the
        # product than IEEE float32), so off by default
        radial_dot=int(v.get("pallas_radial_dot", 0)),
        # pallas_radial_materialize: measured per problem. On bulk Si (H100, 2026-11-26) the
        # on-chip JAX conv_radial took 11,936 / 24,136 us (mace_large fwd / fwd+bwd) against
        # 2,554 / 7,543 for the matmul + conv, so a spec may choose the latter
        radial_materialize=bool(v.get("pallas_radial_materialize", 0)),
        # per-dtype blocks (H100, 2026-11-27, exp jax_sweep): mace_large's TP fwd+bwd in float64
        # took 3,363 us at 4 rows (the fused backward spilling) and 2,264 at 2; nequip_toluene's
        # float64 conv forward 11,602 us at 2 edges per step and 9,198 at 1. Their float32
        # kernels keep the defaults, so the keys are per dtype
        block_batch_by_dtype=_by_dtype(v, "pallas_block_batch"),
        segment_edges_by_dtype=_by_dtype(v, "pallas_segment_edges"),
        # per-dtype conv splits (H200, 2026-11-28, nequip_toluene, bulk Si): float64's running
        # sums spill unless split finely (conv fwd 7,584 us in one kernel, 4,791 within 48
        # terms per kernel), float32's are fastest split in two (1,201 / 984 at 140 terms /
        # 1,117 at 48)
        conv_max_terms_by_dtype=_by_dtype(v, "pallas_conv_max_terms"),
        # and of its fused backward, which float64 leaves at 255 registers and spilling when it
        # is one kernel per x1 block (mace_large, compiled for sm_90: benchmarks/results/RUN_s20.md)
        conv_fused_max_terms_by_dtype=_by_dtype(v, "pallas_conv_fused_max_terms"),
        # per-dtype warps (H200, 2026-11-28, nequip_toluene's JAX conv, bulk Si, fwd / fwd+bwd):
        # float64 at 2 edges per step ran 2,796 / 6,515 us with 4 warps, 1,974 / 5,877 with 2;
        # float32 1,185 / 3,066 with 2 against 970 / 2,901 with 4
        num_warps_by_dtype=_by_dtype(v, "pallas_num_warps"),
    )


def _by_dtype(v: dict, key: str) -> tuple[tuple[str, int], ...]:
    return tuple((dtype, int(v[f"{key}_{dtype}"])) for dtype in DTYPES if f"{key}_{dtype}" in v)
