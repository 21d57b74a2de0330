"""Tuning of the Helion kernels: block sizes and launch parameters, and the spec keys that set them.

A spec's ``[tensor_product.tuning]`` table (``TensorProductSpec.tuning``: sorted ``(key,
value)`` pairs, a sub-table's keys as ``"<op>.<key>"``) reaches the backends as data;
``KEYS`` are this backend's keys (the ``Tuning`` fields a spec may set), ``validate`` checks
one, ``tuning_for`` reads them for one op (``OPS``: the ops a sub-table may tune apart);
``dtype_tuning`` makes one dtype's table from a sub-table's per-dtype keys (``DTYPE_KEYS``:
``block_b_float64``, ...), whose kernels ``assemble`` writes as ``<kernel>__<dtype>`` copies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

__all__ = ["KEYS", "OPS", "DTYPES", "DTYPE_KEYS", "TWIN", "validate", "Tuning", "DEFAULT_TUNING", "TuningTable", "tuning_for",
           "tuning_of", "dtype_tuning", "tuned_dtypes"]


def _pow2(lo: int, hi: int):
    return lambda v: lo <= v <= hi and v & (v - 1) == 0, f"a power of two in [{lo}, {hi}]"


# key -> (test, what the test accepts): the ``Tuning`` fields a spec may pin, at the top
# level of its tuning table (every op) or in a sub-table per op (``OPS``)
KEYS = {
    "block_b": _pow2(1, 256),
    "block_c": _pow2(1, 256),
    "block_r": _pow2(1, 256),
    "block_r_pair": _pow2(1, 256),
    "tile_elems": _pow2(64, 1 << 16),
    "num_warps": (lambda v: v in (1, 2, 4, 8, 16), "one of 1, 2, 4, 8, 16"),
    "num_stages": (lambda v: 1 <= v <= 8, "in [1, 8]"),
    "max_terms": (lambda v: v >= 16, "at least 16"),
    "maxnreg_partials": (lambda v: v in (0, 32, 64, 128, 256), "0 (off), 32, 64, 128 or 256"),
    "grid_c": (lambda v: v in (0, 1), "0 (a channel loop in each program) or 1 (channel tiles as a grid axis)"),
    "hoist_components": (lambda v: 0 <= v <= 4096, "in [0, 4096]"),
    "hoist_weights": (lambda v: v in (0, 1), "0 (each weight tile loaded where first used) or 1 (at the top of the tile)"),
    "fuse_bwd": (lambda v: v in (0, 1), "0 (three backward ops) or 1 (one fused backward kernel where the product is channelwise)"),
    "segment": (lambda v: v in (0, 1), "0 (hl.atomic_add scatter) or 1 (a sorted segment reduction; conv_fwd, conv_bwd_x, "
                "conv_radial_fwd and conv_radial_bwd_x)"),
    "segment_min_edges": (lambda v: 0 <= v <= 1 << 31, "in [0, 2**31] (graphs with fewer edges use the atomic kernels)"),
    "materialize": (lambda v: v in (0, 1), "0 (conv_radial's weights formed on chip) or 1 (formed with a matmul, then the "
                    "conv op's kernels)"),
    "radial_dot": (lambda v: v in (0, 1), "0 (conv_radial's on-chip products in IEEE float32) or 1 (tf32x3: three TF32 "
                   "tensor-core products, about float32 accuracy)"),
}
# The dtypes a per-dtype key may name, and those keys: ``block_b_float64`` -> ``("block_b", "float64")``,
# set in an op's sub-table only. They give that dtype's kernels of the op other blocks and warps than
# the op's other dtypes (float64 values take twice the registers: nequip_toluene's fused backward at
# float32's 8 rows and 4 warps spills in float64; at 2 rows and 2 warps its fwd+bwd took 1,380 against
# 1,595 us, H200, 2026-11-28, one call, benchmarks/results/s13). Only keys that change no more than the
# kernels' code: the ops' outputs and launchers stay the dtypes' common ones.
DTYPES = ("float32", "float64")
# the name of a kernel's copy tuned for one dtype: ``<kernel>__<dtype>`` (``assemble``; its Triton code
# for that dtype is lowered from it: ``eqdsl.codegen.triton_lowering.helion_kernel``)
TWIN = "__"
DTYPE_KEYS = {f"{key}_{dtype}": (key, dtype) for key in ("block_b", "num_warps", "num_stages") for dtype in DTYPES}
KEYS.update({key: KEYS[base] for key, (base, _) in DTYPE_KEYS.items()})
# ops whose kernels a sub-table ([tensor_product.tuning.<op>]) may tune apart from the rest:
# the tensor product's four kernel ops, its fused backward, the convolution's, and
# conv_radial's
OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w", "bwd", "conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w", "conv_bwd",
       "conv_radial_fwd", "conv_radial_bwd_x", "conv_radial_bwd_y", "conv_radial_bwd")


def validate(key: str, value) -> None:
    """Check one tuning entry of this backend (top level or in an op's sub-table).

    Args:
        key: a key of ``KEYS``.
        value: the spec's value.

    Raises:
        KeyError: ``key`` is not a Helion key.
        ValueError: ``value`` is not an integer that ``key`` accepts (the message says what is).
    """
    test, accepts = KEYS[key]
    if not isinstance(value, int) or isinstance(value, bool) or not test(value):
        raise ValueError(f"expected an integer, {accepts}; got {value!r}")


@dataclass(frozen=True)
class Tuning:
    """Block sizes and launch parameters (literals in the generated code).

    ``block_c`` is the channel tile: 32 float32 channels make one 128-byte line, so
    every component load/store of an ``ir_mul`` tile is one coalesced line.
    ``block_b`` batch rows per program; fewer (down to ``block_b_min``) when a kernel
    holds 3-D ``(batch, r, c)`` tiles, so that they stay within ``tile_elems``. Few rows
    and wide channel tiles suit ``mul_ir`` blocks: Triton's coalescing pass orders a
    ``(rows, channels, 2l+1)`` store's dimensions by contiguity, rows and channels tie,
    and threads fill rows first, so 8-row tiles store 4 rows x 1 channel per warp
    instruction and 2-row tiles 2 x 2 (H100, 2026-11-23: mace_large's forward 470 -> 346
    us with ``block_b`` 2, ``block_c`` 64; the specs' tuned values).
    ``block_r`` is the reduction tile when another channel is unrolled (``uvw``),
    ``block_r_pair`` when both inputs share the reduced channel (nothing unrolled).
    ``max_terms`` bounds the unrolled multiply-adds in one kernel; output blocks beyond
    it go to another kernel (each kernel re-reads the inputs it needs, never an
    output). An input operand whose channel-tiled components (padded) number at most
    ``hoist_components`` is loaded at the top of the channel loop (loads issued
    together); a larger one is loaded where each tile is first used (fewer tiles live
    at once). ``hoist_weights`` (1) loads the weight tiles of a block kernel's channel
    tile at its top too: Triton keeps the program order of loads and stores to tensors it
    cannot prove distinct, so a weight load written after an output block's store is
    issued after it, and its latency is exposed once per path. ``wsum_rows``
    (shared-weight ``bwd_w``): batch rows reduced per program,
    a power of two in ``[wsum_min_rows, wsum_max_rows]`` chosen so that the partial
    sums cost little next to the inputs they are computed from. ``maxnreg_partials``
    (Triton's ``maxnreg``, CUDA only; a launch option in ``TRITON_OPTIONS``, since Helion
    takes it only on persistent kernels) is set on kernels that accumulate ``(batch, r)``
    partial sums of one-channel outputs: without it ptxas (CUDA 12.8) gave
    nequip_toluene's ``bwd_x2`` 32 registers and 9.9 KB of spills per thread (ncu: 2.5 ms,
    3.6 GB read for 0.77 GB of operands); with it, 255 registers and 3.4 KB.

    ``grid_c`` (1: on, 0: off) makes the channel tiles a second grid axis where that is
    legal (``kernels.grid_c``): a program then computes ``block_b`` rows x ``block_c`` channels
    instead of looping over the channel tiles of its rows. A 512-edge mace_large conv
    otherwise runs 32 programs on the H100's 132 SMs (289 us of device time, GPU-bound,
    BENCHMARKS.md); with the axis, 128. What the loop shared between channel tiles (the
    per-row scalars such as ``x2`` / edge-attribute components, the gathered row
    indices) is then loaded by each program: a few values per row next to the
    ``block_c``-wide tiles of every component. On by default for the plain tensor product
    too: its small batches (molecular dynamics) have the same 32-program problem, and at
    20,000 rows the per-row scalars re-read are under 3% of a mace_large program's bytes
    while each program holds the same tiles as one iteration of the loop did.

    ``fuse_bwd`` (1: on, 0: off): a channelwise product (``eqdsl.analysis.fused_bwd_reason``)
    also gets the fused backward kernels (op ``bwd``), which read ``g`` once for all three
    gradients; off, only the three backward ops exist.

    ``segment`` (1: on, 0: off; read for the conv ops ``conv_fwd`` and ``conv_bwd_x`` and
    their radial ops ``conv_radial_fwd`` and ``conv_radial_bwd_x``):
    that op scatters into nodes by a segment reduction (edges sorted by the scatter
    index, one program per node and channel tile, ``conv``) even where the spec
    allows atomics (``deterministic = false``; ``deterministic = true`` makes every node
    scatter a segment reduction). One edge per loop step (``block_b`` 1, the default of
    a segment op that does not set it) leaves no cross-warp sum per step: mace_large's
    forward on a 114,688-edge graph took 1,292 us against the atomic kernel's 1,853 us
    (H100, 2026-11-23; with 4 edges per step, 4,970 us: 355 ``bar.sync`` per step).
    ``segment_min_edges``: a graph with fewer edges is not sorted and the op launches
    atomic kernels instead (not with ``deterministic = true``): the sort costs host time,
    about 100 us per call on the H100 machine's host (mace_large on 512 edges: 220 against
    118 us), that the segment kernel wins back only on larger graphs (on 32,768 edges
    348 against 543 us). A radial op (``conv_radial_fwd``, ``conv_radial_bwd_x``) with
    ``segment = 1`` steps ``block_b`` edges at a time (16 by default: its on-chip product
    needs 16 rows for a dot) and sums each step's rows into one running row per output
    component; the atomic alternative adds every edge's whole output row into memory
    (mace_large's forward: ``num_edges x 9,088`` atomic adds, four times the per-edge
    weights it saves reading).

    ``materialize`` (read by the ``conv_radial_*`` ops; 0 by default): 1 gives that op no
    radial kernels: it forms ``W = radial_features @ radial_weight`` with a matmul and runs
    the conv op's kernels (for ``conv_radial_bwd``, the conv's fused backward), the same
    function with the conv's memory traffic. For an op whose on-chip products cost more than
    the weights' round trip through memory (measured per spec: ``radial_torch_check.py``).

    ``radial_dot`` (read by the ``conv_radial_*`` ops): their on-chip products
    ``rf_tile @ radial_weight[:, cols]`` with Helion's ``dot_precision="ieee"`` (0, the
    default: IEEE float32, the function asked for) or ``"tf32x3"`` (1: three TF32
    tensor-core products, faster, about float32 accuracy but not IEEE's rounding; an opt-in
    trade-off). float64 dots are float64 whatever it says.
    """

    block_b: int = 16
    block_b_min: int = 4
    tile_elems: int = 2048
    block_c: int = 32
    block_r: int = 16
    block_r_pair: int = 32
    num_warps: int = 4
    num_stages: int = 1
    max_terms: int = 1024
    hoist_components: int = 32
    hoist_weights: int = 0
    wsum_min_rows: int = 64
    wsum_max_rows: int = 1024
    maxnreg_partials: int | None = 256
    grid_c: int = 1
    fuse_bwd: int = 1
    segment: int = 0
    segment_min_edges: int = 8192
    materialize: int = 0
    radial_dot: int = 0


DEFAULT_TUNING = Tuning()


def tuning_for(pairs: tuple[tuple[str, int], ...], op: str | None = None) -> Tuning:
    """``DEFAULT_TUNING`` with a spec's ``tuning`` table (``TensorProductSpec.tuning``, validated):
    its top-level keys, then (for ``op``, one of ``OPS``) its ``<op>.<key>`` sub-table. Per-dtype
    keys (``DTYPE_KEYS``) are not read here: ``dtype_tuning`` makes a dtype's table."""
    fields = {f.name for f in dataclasses.fields(Tuning)}  # other backends' keys (pallas_*) are not ours
    values = {k: v for k, v in pairs if k in fields}
    if op is not None:
        values.update({k.partition(".")[2]: v for k, v in pairs if k.partition(".")[0] == op and k.partition(".")[2] in fields})
    if values.get("maxnreg_partials") == 0:
        values["maxnreg_partials"] = None
    if "block_b" in values:  # a smaller block_b than the 3-D floor is a request for it
        values["block_b_min"] = min(DEFAULT_TUNING.block_b_min, values["block_b"])
    return replace(DEFAULT_TUNING, **values)


def tuned_dtypes(pairs: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """The dtypes some per-dtype key of ``pairs`` names (``DTYPES`` order)."""
    named = {DTYPE_KEYS[k.partition(".")[2]][1] for k, _ in pairs if k.partition(".")[2] in DTYPE_KEYS}
    return tuple(d for d in DTYPES if d in named)


def dtype_tuning(pairs: tuple[tuple[str, int], ...], dtype: str) -> tuple[tuple[str, int], ...]:
    """The tuning table of ``dtype``'s kernels: ``pairs`` with each ``<op>.<key>_<dtype>`` as
    ``<op>.<key>`` (over the shared value) and every per-dtype key dropped (sorted pairs)."""
    values = {k: v for k, v in pairs if k.partition(".")[2] not in DTYPE_KEYS}
    for k, v in pairs:
        op, _, sub = k.partition(".")
        if sub in DTYPE_KEYS and DTYPE_KEYS[sub][1] == dtype:
            values[f"{op}.{DTYPE_KEYS[sub][0]}"] = v
    return tuple(sorted(values.items()))


TuningTable = Tuning | tuple[tuple[str, int], ...]  # one Tuning for every op, or a spec's pairs


def tuning_of(tuning: TuningTable, op: str) -> Tuning:
    """The ``Tuning`` of one op's kernels (``op`` as in ``OPS``)."""
    return tuning if isinstance(tuning, Tuning) else tuning_for(tuning, op)
