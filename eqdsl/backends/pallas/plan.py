"""What the Pallas kernels of a product are: operand layout, kernel kinds, kernel splits.

Internal ("kernel") layout. Each operand block ``mul x l`` is read inside the kernels
as ``2l+1`` component tiles of ``P = next_pow2(mul)`` channels, zeros in the padding,
so that every value a kernel loads or stores is a ``(block_batch, P)`` or
``(block_batch, 1)`` tile: power of two shapes, as the Triton lowering of Pallas wants,
and contiguous over channels (docs/architecture.md "What layout costs"). Weights get
the same treatment per path: the channel index the kernel vectorizes over is innermost
and padded to ``P``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir import Block, TensorProductIR

__all__ = ["KINDS", "RADIAL_KINDS", "CHANNEL", "VECTOR", "DATA", "MAX_TERMS_PER_KERNEL", "BlockPlan", "WeightPlan",
           "has_channel_loops", "next_pow2", "kernel_refs", "blocks", "weight_layout", "split", "annotate_radial", "RADIAL_SMEM_BUDGET", "radial_max_cols"]

# Budget of unrolled CG terms per kernel before the output blocks are split over kernels
# (read at call time by ``split``: tests lower it to force splits).
MAX_TERMS_PER_KERNEL = 1200

# Shared memory one radial kernel may ask for: the H100's opt-in maximum per block, 227 KiB.
# The same number as ``eqdsl.runtime.jax.tiles.SMEM_BUDGET`` (the runtime's check; the
# generator does not import jax), tests/test_jax_conv_radial.py checks they agree.
RADIAL_SMEM_BUDGET = 232448

# Kernel kinds: (name, operand refs in argument order, the operand it computes, weighted
# paths only). The ``_wo`` kinds are derivatives of the weighted part of ``F`` alone
# (``kernels``' module docstring); they exist only when a spec mixes weighted and
# unweighted paths.
KINDS = (
    ("fwd", ("x1", "x2", "w"), "g", False),
    ("bwd_x1", ("g", "x2", "w"), "x1", False),
    ("bwd_x2", ("x1", "g", "w"), "x2", False),
    ("bwd_w", ("x1", "x2", "g"), "w", True),
    ("fwd_wo", ("x1", "x2", "w"), "g", True),
    ("bwd_x1_wo", ("g", "x2", "w"), "x1", True),
    ("bwd_x2_wo", ("x1", "g", "w"), "x2", True),
)
# The kinds with a radial variant (``conv_radial``, spec key ``radial_features``): those
# that read the weights. ``bwd_w`` does not read them; the radial weight gradients are
# the conv's ``bwd_w`` followed by two matmuls (``eqdsl.runtime.jax.autodiff``).
RADIAL_KINDS = ("fwd", "bwd_x1", "bwd_x2")
# Channel index of each data operand, per mode (e3nn's einsum subscripts).
CHANNEL = {
    "uvw": {"x1": "u", "x2": "v", "g": "w"},
    "uvu": {"x1": "u", "x2": "v", "g": "u"},
    "uvv": {"x1": "u", "x2": "v", "g": "v"},
    "uuu": {"x1": "u", "x2": "u", "g": "u"},
}
# The channel a kernel vectorizes over: the innermost axis of the path's weight rows.
VECTOR = {"uvw": "w", "uvu": "u", "uvv": "v", "uuu": "u"}
DATA = ("x1", "x2", "g")


def has_channel_loops(ir: TensorProductIR) -> bool:
    """Whether some Pallas kernel of ``ir`` loops over a channel: a path whose channel other
    than the vectorized one (``VECTOR``) has more than one value (every ``uvw`` path with
    ``x1`` of several channels; ``uvu`` with several ``x2`` channels; ``uvv`` with several
    ``x1`` channels). Then the spec key ``pallas_unroll`` changes its kernels."""
    for p in ir.paths:
        m1, m2 = ir.in1[p.i_in1].mul, ir.in2[p.i_in2].mul
        if (p.mode == "uvw" and max(m1, m2) > 1) or (p.mode == "uvu" and m2 > 1) or (p.mode == "uvv" and m1 > 1):
            return True
    return False


def next_pow2(n: int) -> int:
    """The least power of two ``>= n`` (1 for ``n <= 1``)."""
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class BlockPlan:
    """How the kernels access one irreps block of an operand.

    ``index``: the block's index; ``offset``: its first column in the spec's rows; ``mul``,
    ``dim`` (``2l+1``); ``pad``: ``next_pow2(mul)``, the lanes of its tiles; ``tile``: a
    ``mul_ir`` block with ``mul > 1`` and ``dim > 1``, read and written whole
    (``rt.load_tile`` / ``rt.store_tile``), otherwise component ``m`` is contiguous over
    the channels (``ir_mul``, or a single channel or component) at ``offset + m * mul``;
    ``desc``: ``"32x1o"``.
    """

    index: int
    offset: int
    mul: int
    dim: int
    pad: int
    tile: bool
    desc: str


@dataclass(frozen=True)
class WeightPlan:
    """How the kernels read one weighted path's weights in place (e3nn's order).

    A vector over the vectorized channel has ``count`` lanes (``pad`` padded) ``stride``
    columns apart, from the path's first column ``offset``; ``numel``: the path's weights;
    ``m2``: its ``x2`` multiplicity (the row stride of ``uvv``).
    """

    path: int
    offset: int
    count: int
    pad: int
    stride: int
    numel: int
    m2: int


def kernel_refs(refs, radial: int | None) -> list[str]:
    """A kernel's operand argument names: ``<ref>_ref`` per operand of ``refs``; with
    ``radial`` (``H``) the weights ``w`` are two operands, the radial features ``rf_ref``
    ``(rows, H)`` and the radial weight ``wr_ref`` ``(H, weight_numel)``."""
    out = []
    for r in refs:
        out += ["rf_ref", "wr_ref"] if r == "w" and radial is not None else [f"{r}_ref"]
    return out


def _irrep_str(b: Block) -> str:
    return f"{b.mul}x{b.l}{'e' if b.parity == 1 else 'o'}"


def blocks(bs: tuple[Block, ...], layout: str) -> list[BlockPlan]:
    """A ``BlockPlan`` per irreps block of an operand in ``layout``."""
    return [BlockPlan(b.index, b.offset, b.mul, b.dim, next_pow2(b.mul), layout == "mul_ir" and b.mul > 1 and b.dim > 1,
                      _irrep_str(b)) for b in bs]


def weight_layout(ir: TensorProductIR, in1, in2, out) -> dict[int, WeightPlan]:
    """A ``WeightPlan`` per weighted path (by path index), for the operands' ``blocks``
    ``in1``, ``in2``, ``out``: per path a row-major block of shape ``(m1, m2, mo)`` /
    ``(m1, m2)`` / ``(m1,)``, read as vectors over the vectorized channel, one per step of
    the loop channels."""
    res = {}
    for p in ir.paths:
        if not p.has_weight:
            continue
        m1, m2, mo = in1[p.i_in1].mul, in2[p.i_in2].mul, out[p.i_out].mul
        if p.mode == "uvw":  # w innermost: row (u, v) at (u * m2 + v) * mo
            count, pad, stride = mo, out[p.i_out].pad, 1
        elif p.mode == "uvu":  # vector over u, (u, v) at u * m2 + v: strided unless m2 == 1
            count, pad, stride = m1, in1[p.i_in1].pad, m2
        elif p.mode == "uvv":  # vector over v, row u at u * m2
            count, pad, stride = m2, in2[p.i_in2].pad, 1
        else:  # uuu
            count, pad, stride = m1, in1[p.i_in1].pad, 1
        res[p.index] = WeightPlan(p.index, p.weight_offset, count, pad, stride, p.weight_numel, m2)
    return res


def split(costs: list[int], max_terms: int | None = None) -> list[list[int]]:
    """Consecutive runs of groups (indices into ``costs``, CG terms per group), balanced,
    each within ``max_terms`` terms (default ``MAX_TERMS_PER_KERNEL``) if possible."""
    max_terms = MAX_TERMS_PER_KERNEL if max_terms is None else max_terms
    total = sum(costs)
    n = max(1, -(-total // max_terms))
    target = total / n
    runs, cur, cur_terms = [], [], 0
    for i, t in enumerate(costs):
        if cur and cur_terms + t > target and len(runs) < n - 1:
            runs.append(cur)
            cur, cur_terms = [], 0
        cur.append(i)
        cur_terms += t
    if cur:
        runs.append(cur)
    return runs


def annotate_radial(kernel: dict, dot: int = 0, dot_min: int = 16) -> int:
    """Record on a radial kernel's ``RadialRows`` statements the spec's ``pallas_radial_dot``
    (``dot``) and (``cols``) the weight columns it
    forms with dots: the padded lanes of its ``RadialRead`` statements of at least ``dot_min``
    lanes (``eqdsl.runtime.jax.tiles.DOT_MIN``; narrower tiles take multiply-adds). The
    Triton lowering keeps every such ``(H padded, lanes)`` slice of the radial weight in
    shared memory for the whole kernel (mace_large's first forward kernel, 1,152 columns at
    ``H = 64``, asked for 311,296 bytes at 16 edges: ``4 * 64 * (1152 + 4 * 16)``), so the
    runtime sizes its dots by this count (``tiles.radial_smem_bytes``). Returns the count;
    the kernel's group bodies are edited in place."""
    from .stmts import RadialRead, RadialRows

    found, rows = [], []

    def walk(x):
        if isinstance(x, RadialRead):
            found.append(x)
        elif isinstance(x, list):
            for i, y in enumerate(x):
                if isinstance(y, RadialRows):
                    rows.append((x, i))
                walk(y)
        elif isinstance(x, tuple):
            for y in x:
                walk(y)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))

    for g in kernel["groups"]:
        walk(g["body"])
    cols = sum(r.pad for r in found if r.pad >= dot_min)
    for lst, i in rows:
        lst[i] = dataclasses.replace(lst[i], cols=cols, dot=dot)
    return cols


def radial_max_cols(h_pad: int, itemsize: int = 4, rows: int = 16) -> int:
    """The most dot columns a radial kernel may form within ``RADIAL_SMEM_BUDGET`` at
    ``rows`` rows per tile (the estimate of ``eqdsl.runtime.jax.tiles.radial_smem_bytes``:
    ``itemsize * h_pad * (cols + 4 * rows)``). The generator splits the radial kernels to
    this count for float32 at the smallest dot (16 rows): mace_large at ``H = 64``, 844."""
    return RADIAL_SMEM_BUDGET // (itemsize * h_pad) - 4 * rows
