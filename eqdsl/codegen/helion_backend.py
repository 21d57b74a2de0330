"""Helion (PyTorch) backend: ``TensorProductIR`` -> ``helion_kernels.py`` + ``torch_ops.py``.

Every decision is made here and handed to the templates as plain strings and lists.

Four kernel families, one four-linear form. A tensor product is the derivative of
``F(x1, x2, W, g) = sum_z sum_paths W C x1 x2 g`` (einsum subscripts per mode in
``eqdsl.reference._SUBSCRIPTS``); the generated kernels are its four partial
derivatives, each from the same IR in the same straight-line style (every CG nonzero
one multiply-add with its literal coefficient, transposed as needed)::

    tp_fwd_*     (x1, x2, W) = dF/dg    -> out (batch, dim_out)
    tp_bwd_x1_*  (g, x2, W)  = dF/dx1   -> gx1 (batch, dim_in1)
    tp_bwd_x2_*  (x1, g, W)  = dF/dx2   -> gx2 (batch, dim_in2)
    tp_bwd_w_*   (x1, x2, g) = dF/dW    -> gw  (batch, weight_numel), or with shared
                                           weights per-program partial sums over the
                                           batch (summed by the op: deterministic)

Unweighted paths (weight 1) make ``F`` affine in ``W``, not linear: where a weight
*cotangent* takes the place of ``W`` (the derivatives of ``bwd_w``), they must not
contribute. Specs with unweighted paths therefore also get ``tp_fwd_lin_*``,
``tp_bwd_x1_lin_*`` and ``tp_bwd_x2_lin_*``: the same over the weighted paths only (the
derivatives of ``F_W``); ``eqdsl.runtime.torch_runtime.register_autograd`` wires them.

The operand kernels compute an operand block (``(batch, 2l+1, mul)``); they share one
generator (``_BlockKernel``): for the computed operand ``o`` and the two others ``a``
and ``b`` of a path, the channel letters of the mode decide the loop structure::

    for tile_b in hl.tile(batch):                      # the grid: batch tiles
        <per-batch scalars>                             # operands unrolled over channels
        for tile_c in hl.tile(M):                      # one loop per output multiplicity M
            <channel-tiled loads>                       # each input tile loaded once, at its first use
            acc = acc + W * (c * a * b + ...)           # a, b indexed by o's channel (or one
                                                        # of them unrolled over its channels)
            for tile_r in hl.tile(M_r):                # a, b not indexed by o's channel:
                <reduction loads>                       # reduce over one, unroll the other (first use)
                t = (c * a * b + ...)                   # (uvw, or both share one channel:
                acc = acc + (t * W[.., tile_r, .., tile_c]).sum(r)   # uvu dx2, uvv dx1)
            out[tile_b, k, tile_c] = acc                # each output component written once

With ``Tuning.grid_c`` (default on) a kernel whose blocks share one multiplicity ``M``
spanning several channel tiles makes them a second grid axis instead of the loop
(``_grid_c``): ``for tile_c, tile_b in hl.tile([M, batch])``, the per-batch scalars loaded
by each program, the body the same. Channel tiles vary fastest in the launch order, so
the programs of one batch tile run side by side and share its rows in L2.

``tp_bwd_w`` tiles over the channel of ``g`` (the innermost weight index for ``uvw``
and ``uvv``) and unrolls the other one (``uvu``, ``uvv``) or tiles it too (``uvw``:
an outer product per batch row, ``(tile_b, tile_r, tile_c)``). With shared weights each
program reduces ``wsum_rows`` batch rows (a static loop of masked sub-tiles, so no
data-dependent loop bound: Triton's interpreter cannot run a loop whose bound is an
argument, triton#9171 with numpy >= 2.4) into its own row of a ``(cdiv(batch, wsum_rows),
weight_numel)`` buffer that the op sums: no atomics, the same bits every run.

The emitters index operands as per-block views, weights in e3nn's order. ``ir_mul``
blocks are ``(batch, 2l+1, mul)`` views: every component tile is contiguous over the
channels. ``mul_ir`` blocks (with ``native``, the plain tensor product) are ``(batch,
mul, 2l+1)`` views read and written in place: one masked ``(batch, channels, 2l+1)``
load split into components on chip (``_native_load``), and outputs joined into one
store (``_native_store``); per-component access would stride by ``2l+1`` (23% of the
copy bandwidth against 92%, docs/architecture.md). The kernels then take whole rows:
``flat_access`` folds each view access into column arithmetic on the ``(batch, dim)``
operands (building the views on the host cost more than the kernel, see there); so do
the convolution's (``helion_conv``), on ``ir_mul`` rows converted at their boundary
(``templates/torch_conv.py.j2``). Block sizes are literals in the
generated code and the config is pinned, so nothing is autotuned and a new batch size
never recompiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..ir import Block, PathIR, TensorProductIR
from ..reference import _SUBSCRIPTS
from .flat_access import View, flat_params, flatten_kernels
from .render import render

__all__ = [
    "render_files",
    "Tuning",
    "TuningTable",
    "tuning_of",
    "kernel_context",
    "op_namespace",
    "has_unweighted",
    "wsum_rows",
    "FAMILIES",
    "LINEAR_FAMILIES",
]


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
    legal (``_grid_c``): a program then computes ``block_b`` rows x ``block_c`` channels
    instead of looping over the channel tiles of its rows. A 512-edge mace_large conv
    otherwise runs 32 programs on the H100's 132 SMs (289 us of device time, GPU-bound,
    BENCHMARKS.md); with the axis, 128. What the loop shared between channel tiles (the
    per-row scalars such as ``x2`` / edge-attribute components, the gathered row
    indices) is then loaded by each program: a few values per row next to the
    ``block_c``-wide tiles of every component. On by default for the plain tensor product
    too: its small batches (molecular dynamics) have the same 32-program problem, and at
    20,000 rows the per-row scalars re-read are under 3% of a mace_large program's bytes
    while each program holds the same tiles as one iteration of the loop did.

    ``fuse_bwd`` (1: on, 0: off): a channelwise product (``helion_fused.fused_bwd_reason``)
    also gets the fused backward kernels (op ``bwd``), which read ``g`` once for all three
    gradients; off, only the three backward ops exist.

    ``segment`` (1: on, 0: off; read for the conv ops ``conv_fwd`` and ``conv_bwd_x``):
    that op scatters into nodes by a segment reduction (edges sorted by the scatter
    index, one program per node and channel tile, ``helion_conv``) even where the spec
    allows atomics (``deterministic = false``; ``deterministic = true`` makes every node
    scatter a segment reduction). One edge per loop step (``block_b`` 1, the default of
    a segment op that does not set it) leaves no cross-warp sum per step: mace_large's
    forward on a 114,688-edge graph took 1,292 us against the atomic kernel's 1,853 us
    (H100, 2026-11-23; with 4 edges per step, 4,970 us: 355 ``bar.sync`` per step).
    ``segment_min_edges``: a graph with fewer edges is not sorted and the op launches
    atomic kernels instead (not with ``deterministic = true``): the sort costs host time,
    about 100 us per call on the H100 machine's host (mace_large on 512 edges: 220 against
    118 us), that the segment kernel wins back only on larger graphs (on 32,768 edges
    348 against 543 us).
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


DEFAULT_TUNING = Tuning()


def tuning_for(pairs: tuple[tuple[str, int], ...], op: str | None = None) -> Tuning:
    """``DEFAULT_TUNING`` with a spec's ``tuning`` table (``TensorProductSpec.tuning``, validated):
    its top-level keys, then (for ``op``, one of ``spec.TUNING_OPS``) its ``<op>.<key>`` sub-table."""
    fields = Tuning.__dataclass_fields__  # other backends' keys (pallas_*) are not ours
    values = {k: v for k, v in pairs if k in fields}
    if op is not None:
        values.update({k.partition(".")[2]: v for k, v in pairs if k.partition(".")[0] == op and k.partition(".")[2] in fields})
    if values.get("maxnreg_partials") == 0:
        values["maxnreg_partials"] = None
    if "block_b" in values:  # a smaller block_b than the 3-D floor is a request for it
        values["block_b_min"] = min(DEFAULT_TUNING.block_b_min, values["block_b"])
    return replace(DEFAULT_TUNING, **values)


TuningTable = Tuning | tuple[tuple[str, int], ...]  # one Tuning for every op, or a spec's pairs


def tuning_of(tuning: TuningTable, op: str) -> Tuning:
    """The ``Tuning`` of one op's kernels (``op`` as in ``spec.TUNING_OPS``)."""
    return tuning if isinstance(tuning, Tuning) else tuning_for(tuning, op)


# Kernel families: (name, computed operand, operands in argument order).
FAMILIES = (
    ("fwd", "g", ("x1", "x2", "w")),
    ("bwd_x1", "x1", ("g", "x2", "w")),
    ("bwd_x2", "x2", ("x1", "g", "w")),
    ("bwd_w", "w", ("x1", "x2", "g")),
)
# Unweighted paths make F affine, not linear, in W: where a weight *cotangent* takes the
# place of W (the derivatives of bwd_w), only the weighted paths may contribute. Specs
# with unweighted paths get these three more families, over the weighted paths only.
LINEAR_FAMILIES = (
    ("fwd_lin", "g", ("x1", "x2", "w")),
    ("bwd_x1_lin", "x1", ("g", "x2", "w")),
    ("bwd_x2_lin", "x2", ("x1", "g", "w")),
)
_ALL_FAMILIES = FAMILIES + LINEAR_FAMILIES
# Kernel parameter prefix of each operand as an input (``x1_0``, ``g_3``, ``w5``) and
# of each family's output (``out_3``, ``gx1_0``, ``gx2_1``, ``gw5``).
_IN_PARAM = {"x1": "x1_", "x2": "x2_", "g": "g_", "w": "w"}
_OUT_PARAM = {"fwd": "out_", "bwd_x1": "gx1_", "bwd_x2": "gx2_", "bwd_w": "gw"}
# Tensor each parameter is a view of, in the generated op (``x1_0 = x1[:, ...]``).
_IN_TENSOR = {"x1": "x1", "x2": "x2", "g": "g", "w": "weights"}
_OUT_TENSOR = {"fwd": "out", "bwd_x1": "gx1", "bwd_x2": "gx2", "bwd_w": "gw"}
for _f in ("fwd", "bwd_x1", "bwd_x2"):
    _OUT_PARAM[_f + "_lin"], _OUT_TENSOR[_f + "_lin"] = _OUT_PARAM[_f], _OUT_TENSOR[_f]
# Prefix of the local names of loaded values (``a0_1``: x1 block 0 component 1).
_LOCAL = {"x1": "a", "x2": "b", "g": "g"}


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _split_tree(var: str, names: list[str]) -> list[str]:
    """Lines unpacking ``var`` (trailing dims ``2 x ... x 2``, flat order ``names``) with ``hl.split``.

    ``hl.split`` halves the last (least significant) dim: even flat indices, then odd.
    """
    even, odd = names[0::2], names[1::2]
    if len(names) == 2:
        return [f"{even[0]}, {odd[0]} = hl.split({var})"]
    lines = [f"{var}e, {var}o = hl.split({var})"]
    return lines + _split_tree(var + "e", even) + _split_tree(var + "o", odd)


def _join_tree(names: list[str]) -> str:
    """Inverse of ``_split_tree``: one expression joining ``names`` (a power of two of them)."""
    if len(names) == 1:
        return names[0]
    return f"hl.join({_join_tree(names[0::2])}, {_join_tree(names[1::2])})"


def _native_load(param: str, local: str, dim: int, tile: str) -> list[str]:
    """A ``mul_ir`` block tile read as one ``(batch, channels, 2l+1)`` load, split on chip.

    The components of a channel are adjacent in ``mul_ir``, so one masked 3-D load
    (last dim padded to a power of two) reads whole contiguous runs; ``hl.split``
    (a register shuffle) then gives one ``(batch, channels)`` tile per component, the
    shape the unrolled products use. Per-component loads would stride by ``2l+1``.
    """
    pad = _pow2(dim)
    lines = [
        f"{local} = hl.load({param}, [tile_b, {tile}, hl.arange({pad})], extra_mask=(hl.arange({pad}) < {dim})[None, None, :])",
        f"{local}t = {local}.reshape([tile_b, {tile}{', 2' * (pad.bit_length() - 1)}])",
    ]
    return lines + _split_tree(f"{local}t", [f"{local}_{m}" for m in range(pad)])


def _native_store(param: str, accs: list[str], dim: int) -> list[str]:
    """Components ``accs`` of a ``mul_ir`` block joined on chip and written in one masked store."""
    pad = _pow2(dim)
    joined = _join_tree(accs + [accs[0]] * (pad - dim))  # padding lanes are masked off
    return [
        f"hl.store({param}, [tile_b, tile_c, hl.arange({pad})], ({joined}).reshape([tile_b, tile_c, {pad}]), "
        f"extra_mask=(hl.arange({pad}) < {dim})[None, None, :])"
    ]


def op_namespace(name: str) -> str:
    """``torch.library`` namespace of the generated ops (the name is a validated identifier)."""
    return "eqdsl_" + "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


# ------------------------------------------------------------------ path algebra


def _blocks(ir: TensorProductIR, op: str) -> tuple[Block, ...]:
    return {"x1": ir.in1, "x2": ir.in2, "g": ir.out}[op]


def _bidx(p: PathIR, op: str) -> int:
    return {"x1": p.i_in1, "x2": p.i_in2, "g": p.i_out}[op]


def _block(ir: TensorProductIR, p: PathIR, op: str) -> Block:
    return _blocks(ir, op)[_bidx(p, op)]


def _comp(n, op: str) -> int:
    return {"x1": n.i, "x2": n.j, "g": n.k}[op]


def _letter(p: PathIR, op: str) -> str:
    """Channel letter of operand ``op`` in the path's four-linear form."""
    sw, s1, s2, so = _SUBSCRIPTS[p.mode]
    return {"x1": s1[1], "x2": s2[1], "g": so[1], "w": sw[1:]}[op]


# ------------------------------------------------------------------ formatting


def _term(coeff: float, factors: list[str], first: bool) -> str:
    # a coefficient of exactly 1 is left out (exact either way; one multiply less)
    body = " * ".join(([] if abs(coeff) == 1.0 else [repr(abs(coeff))]) + factors)
    if first:
        return ("-" if coeff < 0 else "") + body
    return ("- " if coeff < 0 else "+ ") + body


def _sum(terms: list[tuple[float, list[str]]]) -> str:
    """``c0 * a * b + c1 * ...`` as one parenthesised expression, two terms a line if long."""
    parts = [_term(c, f, i == 0) for i, (c, f) in enumerate(terms)]
    return _wrap(parts)


def _wrap(parts: list[str]) -> str:
    one = " ".join(parts)
    if len(one) <= 80:
        return f"({one})"
    lines = [" ".join(parts[i : i + 2]) for i in range(0, len(parts), 2)]
    return "(\n    " + "\n    ".join(lines) + "\n)"


def _natural(name: str) -> tuple:
    """Sort key for generated names (``sb1_10_0`` after ``sb1_2_0``)."""
    parts: list[str] = []
    for c in name:  # runs of digits and of other characters, as re.split(r"(\d+)") with its empty ends
        if not parts or c.isdigit() != parts[-1][-1].isdigit():
            parts.append("")
        parts[-1] += c
    if parts and parts[0][0].isdigit():
        parts.insert(0, "")
    if parts and parts[-1][-1].isdigit():
        parts.append("")
    return tuple(int(t) if t.isdigit() else t for t in parts)


def _ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _block_label(b: Block) -> str:
    return f"{b.mul}x{b.l}{'e' if b.parity == 1 else 'o'}"


def _path_comment(ir: TensorProductIR, p: PathIR) -> str:
    w = "weighted" if p.has_weight else "unweighted"
    return (
        f"# path {p.index}: {p.mode} {_block_label(ir.in1[p.i_in1])} x {_block_label(ir.in2[p.i_in2])}"
        f" -> {_block_label(ir.out[p.i_out])}, {_plural(len(p.nonzeros), 'nonzero')}, {w}"
    )


def _sorted_lines(d: dict[str, str | list[str]]) -> list[str]:
    """``name = expr`` per entry in natural order; a list value is a block of lines as is."""
    out: list[str] = []
    for n in sorted(d, key=_natural):
        out += d[n] if isinstance(d[n], list) else [f"{n} = {d[n]}"]
    return out


# ------------------------------------------------------------------ kernel splitting


def _unroll(ir: TensorProductIR, p: PathIR, out_op: str) -> int:
    """Channels unrolled per nonzero when computing operand ``out_op`` of path ``p``."""
    others = [op for op in ("x1", "x2", "g") if op != out_op]
    if out_op == "w":  # tile over g's channel; unroll x1 / x2 channels not shared with g
        lg = _letter(p, "g")
        free = [op for op in ("x1", "x2") if _letter(p, op) != lg]
        if len(free) == 2:  # uvw: one reduced (tiled), the other unrolled
            return min(_block(ir, p, op).mul for op in free)
        return _block(ir, p, free[0]).mul if free else 1
    lo = _letter(p, out_op)
    la, lb = (_letter(p, op) for op in others)
    if la == lo and lb == lo:
        return 1
    if la == lo or lb == lo:
        return _block(ir, p, others[1] if la == lo else others[0]).mul
    if la == lb:
        return 1
    return min(_block(ir, p, op).mul for op in others)


def _split(costs: list[int], tuning: Tuning) -> list[list[int]]:
    """Indices of ``costs`` per kernel, in order: as few kernels as ``max_terms`` allows, balanced."""
    if not costs:
        return []
    costs = [max(1, c) for c in costs]
    n_kernels = -(-sum(costs) // tuning.max_terms)
    target = sum(costs) / n_kernels
    groups: list[list[int]] = [[]]
    cost = 0
    for o, c in enumerate(costs):
        if groups[-1] and (cost + c > tuning.max_terms or cost >= target):
            groups.append([])
            cost = 0
        groups[-1].append(o)
        cost += c
    return groups


def _grid_c(tuning: Tuning, groups: list[dict], partial_sums: bool = False) -> bool:
    """Whether a kernel's channel tiles become a second grid axis (``Tuning.grid_c``).

    Legal when every program's work for one channel tile is independent of the other
    tiles: each tile writes its own output columns (accumulators are ``(batch,
    channel)`` tiles, stored or scattered in the same iteration) and nothing is summed
    across tiles. That holds for every operand and per-row weight kernel body; a
    ``tile_r`` reduction inside it runs over another operand's channels and stays a
    loop in the program. It needs one channel group (blocks of different multiplicities
    loop over different channel ranges) of more than one tile (one tile: nothing to
    spread). Shared-weight partial sums (``partial_sums``) keep their 1-D grid: their
    program index is the row of the partial-sum buffer.
    """
    if not tuning.grid_c or partial_sums or len(groups) != 1:
        return False
    return groups[0]["mul"] > groups[0]["block_c"]


def _block_b(tuning: Tuning, elems_3d: int) -> int:
    """Batch rows per program: ``block_b``, fewer when 3-D tiles of ``elems_3d`` per row exist."""
    if elems_3d <= 0:
        return tuning.block_b
    return max(tuning.block_b_min, min(tuning.block_b, _pow2_floor(max(1, tuning.tile_elems // elems_3d))))


# ------------------------------------------------------------------ fwd, bwd_x1, bwd_x2


@dataclass
class _BlockKernel:
    """Builder of one kernel that computes blocks of operand ``out_op`` (``g``, ``x1`` or ``x2``)."""

    ir: TensorProductIR
    family: str
    out_op: str
    in_ops: tuple[str, str]
    out_blocks: list[int]
    tuning: Tuning
    native: bool = False  # mul_ir operands read and written in place (see _native_load)
    params: dict = field(default_factory=lambda: {"x1": set(), "x2": set(), "g": set(), "w": set()})
    scalars: dict = field(default_factory=dict)  # name -> expr (hoisted per batch tile)
    elems_3d: int = 0

    def paths_into(self, o: int) -> list[PathIR]:
        return _paths_into(self.ir, self.family, self.out_op, o)

    def context(self, index: int) -> dict:
        ir, t = self.ir, self.tuning
        blocks = _blocks(ir, self.out_op)
        by_mul: dict[int, list[int]] = {}
        for o in self.out_blocks:
            by_mul.setdefault(blocks[o].mul, []).append(o)
        groups = []
        for mul, outs in by_mul.items():
            g = {"mul": mul, "block_c": min(_pow2(mul), t.block_c), "loads": {}, "outs": [], "reductions": {}}
            deferred = []
            for o in outs:
                bo = blocks[o]
                paths = self.paths_into(o)
                updates: list[str] = []
                reduced = False
                for p in paths:
                    reduced |= self._emit(p, g, updates)
                if _is_native(self.native, bo):
                    stores = _native_store(f"{_OUT_PARAM[self.family]}{o}", [f"acc{o}_{kk}" for kk in range(bo.dim)], bo.dim)
                else:
                    stores = [f"{_OUT_PARAM[self.family]}{o}[tile_b, {kk}, tile_c] = acc{o}_{kk}" for kk in range(bo.dim)]
                g["outs"].append(
                    {
                        "comment": f"# {self.out_op} block {o}: {_block_label(bo)} ({_plural(len(paths), 'path')})",
                        "accs": [f"acc{o}_{kk}" for kk in range(bo.dim)],
                        "dtype_of": f"{_OUT_PARAM[self.family]}{o}",
                        "updates": updates,
                        "stores": [] if reduced else stores,
                    }
                )
                if reduced:
                    deferred += stores
            g["loads"] = _sorted_lines(g["loads"])
            g["reductions"] = [
                dict(r, loads=_sorted_lines(r["loads"]), has_partials=bool(r.get("partials")), updates=r["updates"] + [
                    f"{acc} = {acc} + {part}.sum(1)[:, None]" for part, acc in r.get("partials", {}).items()
                ])
                for r in g["reductions"].values()
            ]
            g["deferred_stores"] = deferred
            groups.append(g)
        params = (
            [f"{_IN_PARAM[op]}{i}" for op in self.in_ops for i in sorted(self.params[op])]
            + [f"w{i}" for i in sorted(self.params["w"])]
            + [f"{_OUT_PARAM[self.family]}{o}" for o in self.out_blocks]
        )
        path_ids = sorted(p.index for o in self.out_blocks for p in self.paths_into(o))
        return {
            "name": f"tp_{self.family}_{index}",
            "kind": "block",
            "doc": (
                f"{_DOC[self.family]}: {self.out_op} blocks {_ranges(self.out_blocks)}; "
                f"paths {_ranges(path_ids) or 'none'}."
            ),
            "params": params,
            "batch_param": params[0],
            "block_b": _block_b(t, self.elems_3d),
            "num_warps": t.num_warps,
            "num_stages": t.num_stages,
            "config": _config(t),
            # Helion accepts maxnreg only on persistent kernels, which its CPU interpreter
            # cannot run: the CUDA launch adds it (the lowered module's TRITON_OPTIONS)
            "triton_options": (
                f'{{"maxnreg": {t.maxnreg_partials}}}'
                if t.maxnreg_partials and any(r["has_partials"] for g in groups for r in g["reductions"])
                else ""
            ),
            "scalars": _sorted_lines(self.scalars),
            "channel_groups": groups,
            "grid_c": _grid_c(t, groups),
        }

    def _emit(self, p: PathIR, g: dict, updates: list[str]) -> bool:
        """Add path ``p``'s updates to channel group ``g``; whether it went into a reduction loop."""
        ir, t = self.ir, self.tuning
        oo, (ao, bo) = self.out_op, self.in_ops
        ab, bb = _block(ir, p, ao), _block(ir, p, bo)
        ai, bi = _bidx(p, ao), _bidx(p, bo)
        lo, la, lb = _letter(p, oo), _letter(p, ao), _letter(p, bo)
        o = _bidx(p, oo)
        by_o: dict[int, list[tuple[float, int, int]]] = {}
        for n in p.nonzeros:
            by_o.setdefault(_comp(n, oo), []).append((n.coeff, _comp(n, ao), _comp(n, bo)))
        if not by_o:
            return False  # a zero path weight: contributes nothing
        self.params[ao].add(ai)
        self.params[bo].add(bi)
        if p.has_weight:
            self.params["w"].add(p.index)
        loaded = g.setdefault("loaded", set())

        def tiled(op: str, blk: int, m: int) -> str:
            key, lines = _tile_load(ir, op, blk, m, self.native, f"{_LOCAL[op]}{blk}", "tile_c")
            if _hoisted(ir, op, self.native, t):
                g["loads"].setdefault(key, lines)
            else:
                _once(loaded, updates, key, lines)
            return f"{_LOCAL[op]}{blk}_{m}"

        def scalar(op: str, blk: int, m: int, ch: int) -> str:
            name = f"s{_LOCAL[op]}{blk}_{m}_{ch}"
            idx = f"{ch}, {m}" if _is_native(self.native, _blocks(ir, op)[blk]) else f"{m}, {ch}"
            self.scalars.setdefault(name, f"{_IN_PARAM[op]}{blk}[tile_b, {idx}][:, None]")
            return name

        comment = _path_comment(ir, p)
        if la == lo and lb == lo:  # uuu: everything indexed by the output channel
            wexpr = self._weight_row(p, {lo: "tile_c"}, updates, g)
            updates.append(comment)
            for kk, nzs in sorted(by_o.items()):
                s = _sum([(c, [tiled(ao, ai, i), tiled(bo, bi, j)]) for c, i, j in nzs])
                updates.append(_acc(o, kk, s, wexpr))
        elif la == lo or lb == lo:  # one input shares the output channel, the other is unrolled
            a_tiled = la == lo
            lu, n_unroll = (lb, bb.mul) if a_tiled else (la, ab.mul)
            updates.append(comment)
            for ch in range(n_unroll):
                wexpr = self._weight_row(p, {lo: "tile_c", lu: str(ch)}, updates, g)
                for kk, nzs in sorted(by_o.items()):
                    if a_tiled:
                        terms = [(c, [tiled(ao, ai, i), scalar(bo, bi, j, ch)]) for c, i, j in nzs]
                    else:
                        terms = [(c, [scalar(ao, ai, i, ch), tiled(bo, bi, j)]) for c, i, j in nzs]
                    updates.append(_acc(o, kk, _sum(terms), wexpr))
        else:  # reduction over a channel the output does not carry
            pair = la == lb
            if pair:  # both inputs carry it (uvu dx2, uvv dx1): nothing unrolled
                red_mul, block_r, lr = ab.mul, min(_pow2(ab.mul), t.block_r_pair), la
                n_unroll, lu = 1, None
            else:  # uvw: reduce over the larger input, unroll the smaller
                over_a = ab.mul >= bb.mul
                red_mul = ab.mul if over_a else bb.mul
                block_r = min(_pow2(red_mul), t.block_r)
                lr, lu = (la, lb) if over_a else (lb, la)
                n_unroll = bb.mul if over_a else ab.mul
            if red_mul == 1:
                # One channel to reduce over (e.g. tetris' 1x l inputs): a direct update of
                # per-row scalars times the weight row. A loop over a single-channel 3-D tile
                # only adds cross-lane sums (and is the shape that miscompiled in float32).
                updates.append(comment)
                for ch in range(n_unroll):
                    chans = {lr: 0} if lu is None else {lr: 0, lu: ch}
                    wexpr = self._weight_row(p, {lo: "tile_c", **{k: str(v) for k, v in chans.items()}}, updates, g)
                    for kk, nzs in sorted(by_o.items()):
                        terms = [(c, [scalar(ao, ai, i, chans[la]), scalar(bo, bi, j, chans[lb])]) for c, i, j in nzs]
                        updates.append(_acc(o, kk, _sum(terms), wexpr))
                return False
            red = g["reductions"].setdefault(
                (red_mul, block_r),
                {
                    "comment": f"# reduction over {red_mul} channels",
                    "mul": red_mul,
                    "block_r": block_r,
                    "loads": {},
                    "updates": [],
                },
            )
            rloaded = red.setdefault("loaded", set())
            rlines = red["updates"]

            def rtiled(op: str, blk: int, m: int) -> str:
                _once(rloaded, rlines, *_tile_load(ir, op, blk, m, self.native, f"r{_LOCAL[op]}{blk}", "tile_r"))
                return f"r{_LOCAL[op]}{blk}_{m}"

            red["updates"].append(comment)
            if not pair and p.has_weight and n_unroll > 1 and _block(ir, p, oo).mul == 1:
                # A one-channel output fed by two channel-carrying inputs (uvw dF/dx2 of an
                # edge TP: sum over u and w): contract the weight with the unrolled input's
                # channel in an inner loop first (h[b, r, m] = sum_s W[b, r, s] v[b, s, m]),
                # so the cross-lane sums count per component, not per unrolled channel.
                r_is_a = lr == la
                vop, vblk = (bo, bi) if r_is_a else (ao, ai)
                vcomps = sorted({j if r_is_a else i for nzs in by_o.values() for _, i, j in nzs})
                h = self._weight_vector(p, red, (lo, lr, lu), (vop, vblk, n_unroll), vcomps, block_r, o)
                for kk, nzs in sorted(by_o.items()):
                    if r_is_a:
                        terms = [(c, [rtiled(ao, ai, i), h[j]]) for c, i, j in nzs]
                    else:
                        terms = [(c, [h[i], rtiled(bo, bi, j)]) for c, i, j in nzs]
                    red["updates"].append(f"t = {_sum(terms)}")
                    self._partial(p, red, lo, lr, f"s{o}_{kk}", f"acc{o}_{kk}", weighted=False)
                return True
            for ch in range(n_unroll):
                index = {lo: "tile_c", lr: "tile_r"}
                if lu is not None:
                    index[lu] = str(ch)
                for kk, nzs in sorted(by_o.items()):
                    if pair:
                        terms = [(c, [rtiled(ao, ai, i), rtiled(bo, bi, j)]) for c, i, j in nzs]
                    elif lr == la:
                        terms = [(c, [rtiled(ao, ai, i), scalar(bo, bi, j, ch)]) for c, i, j in nzs]
                    else:
                        terms = [(c, [scalar(ao, ai, i, ch), rtiled(bo, bi, j)]) for c, i, j in nzs]
                    # t: (tile_b, tile_r) products for this output component; then contract tile_r
                    red["updates"].append(f"t = {_sum(terms)}")
                    if pair and _block(ir, p, oo).mul == 1:
                        self._partial(p, red, lo, lr, f"s{o}_{kk}", f"acc{o}_{kk}")
                        continue
                    contrib = self._contract(p, index, block_r, red["updates"])
                    red["updates"].append(f"acc{o}_{kk} = acc{o}_{kk} + {contrib}")
            return True
        return False

    def _weight_vector(self, p: PathIR, red: dict, letters: tuple[str, str, str], vec: tuple[str, int, int],
                       comps: list[int], block_r: int, o: int) -> dict[int, str]:
        """``h[m] = sum_s W[b, r, s] v[b, s, m]`` for each component ``m`` of ``vec``, as ``(batch, r)`` tiles.

        ``letters``: the output's, the reduced and the contracted channel's letters;
        ``vec``: the operand carrying the contracted channel (op, block, multiplicity).
        Emitted as an inner ``tile_s`` loop in the reduction step; returns the names.
        """
        ir, t = self.ir, self.tuning
        lo, lr, ls = letters
        vop, vblk, mul = vec
        block_s = min(_pow2(mul), t.block_r)
        self.elems_3d = max(self.elems_3d, block_r * block_s)
        wl = _letter(p, "w")
        idx = ", ".join({lo: "0", lr: "tile_r", ls: "tile_s"}[x] for x in wl)
        r_first = wl.index(lr) < wl.index(ls)
        wname = f"ws{p.index}"
        body = [f"{wname} = " + (f"w{p.index}[{idx}][None, :, :]" if ir.shared_weights else f"w{p.index}[tile_b, {idx}]")]
        loaded: set = set()
        local = f"v{_LOCAL[vop]}{vblk}"
        names = {m: f"acch{p.index}_{m}" for m in comps}
        for m in comps:
            _once(loaded, body, *_tile_load(ir, vop, vblk, m, self.native, local, "tile_s"))
            prod = f"{wname} * {local}_{m}[:, None, :]" if r_first else f"{wname} * {local}_{m}[:, :, None]"
            body.append(f"{names[m]} = {names[m]} + ({prod}).sum({2 if r_first else 1})")
        dtype = f"{_OUT_PARAM[self.family]}{o}.dtype"
        red["updates"] += [f"{n} = hl.zeros([tile_b, tile_r], dtype={dtype})" for n in names.values()]
        red["updates"].append(
            f"for tile_s in hl.tile({mul}, block_size={block_s}):\n" + "\n".join("    " + line for line in body)
        )
        return names

    def _partial(self, p: PathIR, red: dict, lo: str, lr: str, part: str, acc: str, weighted: bool = True) -> None:
        """Add ``t * W`` (``t`` if not ``weighted``) to the ``(batch, r)`` partial sum ``part``
        of a one-channel output.

        Contracted once per reduction step, after every path (``acc += part.sum(1)``),
        not once per path and component: a cross-lane sum costs far more than an add.
        """
        lines = red["updates"]
        if p.has_weight and weighted:
            idx = ", ".join({lo: "0", lr: "tile_r"}[x] for x in _letter(p, "w"))
            wname = f"wq{p.index}"
            src = f"w{p.index}[{idx}][None, :]" if self.ir.shared_weights else f"w{p.index}[tile_b, {idx}]"
            _once(red.setdefault("loaded", set()), lines, wname, [f"{wname} = {src}"])
            term = f"t * {wname}"
        else:
            term = "t"
        partials = red.setdefault("partials", {})
        if part in partials:
            lines.append(f"{part} = {part} + {term}")
        else:
            partials[part] = acc
            lines.append(f"{part} = {term}")

    def _weight_row(self, p: PathIR, index: dict[str, str], lines: list[str], g: dict) -> str | None:
        """Weight factor of an update indexed by ``tile_c`` (and unrolled channels): (b or 1, c).

        Loaded once (``wt<path>_<channel>``), used by every component: where first needed
        (appended to ``lines``), or with ``Tuning.hoist_weights`` among channel group
        ``g``'s loads at the top of the tile, before any store.
        """
        if not p.has_weight:
            return None
        letters = _letter(p, "w")
        idx = ", ".join(index[letter] for letter in letters)
        name = "_".join([f"wt{p.index}"] + [index[x] for x in letters if not index[x].startswith("tile_")])
        src = f"w{p.index}[{idx}][None, :]" if self.ir.shared_weights else f"w{p.index}[tile_b, {idx}]"
        if self.tuning.hoist_weights:
            g["loads"].setdefault(name, [f"{name} = {src}"])
        elif not any(line.startswith(name + " = ") for line in lines):
            lines.append(f"{name} = {src}")
        return name

    def _contract(self, p: PathIR, index: dict[str, str], block_r: int, lines: list[str]) -> str:
        """``sum_r t[b, r] W[.., r, .., c]`` as an expression of shape (b, c).

        The weight tile is loaded once per reduction step (``wr<path>_<channel>``, the
        load appended to ``lines`` where first needed).
        """
        if not p.has_weight:
            return "t.sum(1)[:, None]"
        letters = _letter(p, "w")
        idx = ", ".join(index[letter] for letter in letters)
        tiles = [index[letter] for letter in letters if index[letter].startswith("tile_")]
        texpr, axis = ("t[:, :, None]", 1) if tiles == ["tile_r", "tile_c"] else ("t[:, None, :]", 2)
        name = "_".join([f"wr{p.index}"] + [index[x] for x in letters if not index[x].startswith("tile_")])
        if self.ir.shared_weights:
            src = f"w{p.index}[{idx}][None, :, :]"
        else:
            c = min(_pow2(_block(self.ir, p, self.out_op).mul), self.tuning.block_c)
            self.elems_3d = max(self.elems_3d, block_r * c)
            src = f"w{p.index}[tile_b, {idx}]"
        if not any(line.startswith(name + " = ") for line in lines):
            lines.insert(len(lines) - 1, f"{name} = {src}")  # before the ``t = ...`` line just added
        return f"({texpr} * {name}).sum({axis})"


_DOC = {
    "fwd": "Forward (dF/dg)",
    "bwd_x1": "Gradient with respect to x1 (dF/dx1)",
    "bwd_x2": "Gradient with respect to x2 (dF/dx2)",
    "bwd_w": "Gradient with respect to the weights (dF/dW)",
    "fwd_lin": "Forward of the weighted paths only (dF_W/dg)",
    "bwd_x1_lin": "Gradient with respect to x1, weighted paths only (dF_W/dx1)",
    "bwd_x2_lin": "Gradient with respect to x2, weighted paths only (dF_W/dx2)",
}


def _paths_into(ir: TensorProductIR, family: str, out_op: str, o: int) -> list[PathIR]:
    """Paths contributing to block ``o`` of ``out_op`` in ``family`` (``*_lin``: weighted only)."""
    lin = family.endswith("_lin")
    return [p for p in ir.paths if _bidx(p, out_op) == o and (p.has_weight or not lin)]


def has_unweighted(ir: TensorProductIR) -> bool:
    """Whether some unweighted path contributes (then ``F`` is affine in ``W``: ``*_lin`` kernels)."""
    return any(not p.has_weight and p.nonzeros for p in ir.paths)


def _acc(o: int, k: int, s: str, wexpr: str | None) -> str:
    rhs = f"{wexpr} * {s}" if wexpr else s
    return f"acc{o}_{k} = acc{o}_{k} + {rhs}"


def _hoisted(ir: TensorProductIR, op: str, native: bool, tuning: Tuning) -> bool:
    """Whether operand ``op``'s channel tiles are loaded together at the top of the loop."""
    n = sum(_pow2(b.dim) if _is_native(native, b) else b.dim for b in _blocks(ir, op) if b.mul > 1)
    return n <= tuning.hoist_components


def _tile_load(ir: TensorProductIR, op: str, blk: int, m: int, native: bool, local: str, tile: str) -> tuple[str, list[str]]:
    """``(key, lines)`` loading component ``m`` of ``op`` block ``blk`` over ``tile`` as ``{local}_{m}``.

    A native ``mul_ir`` block loads all its components at once (key ``local``); an
    ``ir_mul`` view loads one component (key ``{local}_{m}``).
    """
    b = _blocks(ir, op)[blk]
    param = f"{_IN_PARAM[op]}{blk}"
    if _is_native(native, b):
        return local, _native_load(param, local, b.dim, tile)
    return f"{local}_{m}", [f"{local}_{m} = {param}[tile_b, {m}, {tile}]"]


def _once(done: set, lines: list[str], key: str, new: list[str]) -> None:
    """Append ``new`` to ``lines`` the first time ``key`` is seen (a load at its first use)."""
    if key not in done:
        done.add(key)
        lines.extend(new)


def _is_native(native: bool, b: Block) -> bool:
    """Whether block ``b`` is accessed in ``mul_ir`` order in a native kernel (layouts differ)."""
    return native and b.mul > 1 and b.dim > 1


def _block_family(
    ir: TensorProductIR, family: str, out_op: str, in_ops: tuple[str, str], tuning: Tuning, native: bool
) -> list[dict]:
    n_out = len(_blocks(ir, out_op))
    costs = [
        sum(len(p.nonzeros) * _unroll(ir, p, out_op) for p in _paths_into(ir, family, out_op, o))
        for o in range(n_out)
    ]
    return [
        _BlockKernel(ir, family, out_op, in_ops, blocks, tuning, native).context(idx)
        for idx, blocks in enumerate(_split(costs, tuning))
    ]


# ------------------------------------------------------------------ bwd_w


def wsum_rows(ir: TensorProductIR, tuning: Tuning = DEFAULT_TUNING) -> int:
    """Batch rows one shared-weight ``bwd_w`` program reduces (one partial-sum row each).

    A power of two at least twice ``weight_numel / (dim_in1 + dim_in2 + dim_out)``, so
    the partial sums written cost at most about half of the inputs read, clamped to
    ``[wsum_min_rows, wsum_max_rows]`` (more rows per program: fewer programs).
    """
    row = max(1, ir.dim_in1 + ir.dim_in2 + ir.dim_out)
    want = _pow2(-(-2 * ir.weight_numel // row))
    return max(tuning.wsum_min_rows, min(tuning.wsum_max_rows, want))


@dataclass
class _WeightKernel:
    """Builder of one ``bwd_w`` kernel: the weight gradients of some weighted paths."""

    ir: TensorProductIR
    paths: list[PathIR]
    tuning: Tuning
    native: bool = False  # mul_ir operands read in place (see _native_load)
    params: dict = field(default_factory=lambda: {"x1": set(), "x2": set(), "g": set()})
    scalars: dict = field(default_factory=dict)  # per-batch mode: hoisted per batch tile
    elems_3d: int = 0

    @property
    def shared(self) -> bool:
        return self.ir.shared_weights

    def _load(self, scope: dict, op: str, blk: int, m: int, chan: str, kind: str) -> str:
        """Register a load of component ``m`` of ``op`` block ``blk`` in ``scope``; its local name.

        ``kind``: ``c`` (channel tile), ``r`` (reduction tile) or ``s`` (one channel,
        ``chan`` a literal, shaped ``(batch, 1)``).
        """
        self.params[op].add(blk)
        name = {"c": "", "r": "r", "s": "s"}[kind] + f"{_LOCAL[op]}{blk}_{m}" + (f"_{chan}" if kind == "s" else "")
        col = {"c": "tile_c", "r": "tile_r", "s": chan}[kind]
        param = f"{_IN_PARAM[op]}{blk}"
        b = _blocks(self.ir, op)[blk]
        native = _is_native(self.native, b)
        idx = f"{col}, {m}" if native else f"{m}, {col}"
        if self.shared:  # inside the masked sub-tile loop of a partial sum (mul_ir: strided reads)
            expr = (
                f"hl.load({param}, [rows, {idx}], extra_mask=ok)[:, None]"
                if kind == "s"
                else f"hl.load({param}, [rows, {idx}], extra_mask=okc)"
            )
            _once(scope.setdefault("loaded", set()), scope["updates"], name, [f"{name} = {expr}"])
        elif kind == "s":
            self.scalars.setdefault(name, f"{param}[tile_b, {idx}][:, None]")
        else:
            key, lines = _tile_load(self.ir, op, blk, m, self.native, name[: -len(f"_{m}")], col)
            if kind == "c" and _hoisted(self.ir, op, self.native, self.tuning):
                scope["loads"].setdefault(key, lines)
            else:
                _once(scope.setdefault("loaded", set()), scope["updates"], key, lines)
        return name

    def context(self, index: int, rows: int) -> dict:
        ir, t = self.ir, self.tuning
        by_mul: dict[int, list[PathIR]] = {}
        for p in self.paths:
            by_mul.setdefault(_block(ir, p, "g").mul, []).append(p)
        groups = []
        for mul, paths in by_mul.items():
            block_c = min(_pow2(mul), t.block_c)
            direct = {"loads": {}, "accs": [], "updates": [], "stores": []}
            reductions: dict[tuple[int, int], dict] = {}
            for p in paths:
                self._emit(p, block_c, direct, reductions)
            groups.append(
                {
                    "mul": mul,
                    "block_c": block_c,
                    "direct": (
                        dict(direct, loads=_sorted_lines(direct["loads"]))
                        if direct["updates"] or direct["loads"]
                        else None
                    ),
                    "reductions": [dict(r, loads=_sorted_lines(r["loads"])) for r in reductions.values()],
                }
            )
        params = [f"{_IN_PARAM[op]}{i}" for op in ("x1", "x2", "g") for i in sorted(self.params[op])] + [
            f"gw{p.index}" for p in self.paths
        ]
        block_b = _block_b(t, self.elems_3d)
        return {
            "name": f"tp_bwd_w_{index}",
            "kind": "wsum" if self.shared else "weight",
            "doc": f"{_DOC['bwd_w']}: paths {_ranges([p.index for p in self.paths])}"
            + (f"; sums over {rows} batch rows per program." if self.shared else "."),
            "params": params,
            "batch_param": params[0],
            "shared": self.shared,
            "rows": rows,
            "block_b": block_b,
            "config": _config(t),
            "triton_options": "",
            "num_warps": t.num_warps,
            "num_stages": t.num_stages,
            "scalars": _sorted_lines(self.scalars),
            "channel_groups": groups,
            "grid_c": _grid_c(t, groups, partial_sums=self.shared),
        }

    def _emit(self, p: PathIR, block_c: int, direct: dict, reductions: dict) -> None:
        ir, t = self.ir, self.tuning
        b1, b2 = _block(ir, p, "x1"), _block(ir, p, "x2")
        i1, i2, io = p.i_in1, p.i_in2, p.i_out
        l1, l2, lg = _letter(p, "x1"), _letter(p, "x2"), _letter(p, "g")
        wl = _letter(p, "w")
        by_k: dict[int, list[tuple[float, int, int]]] = {}
        for n in p.nonzeros:
            by_k.setdefault(n.k, []).append((n.coeff, n.i, n.j))
        bidx = "tile_p.id" if self.shared else "tile_b"
        comment = _path_comment(ir, p)
        if l1 != lg and l2 != lg:  # uvw: outer product over (r, c) per unrolled channel
            over_1 = b1.mul >= b2.mul
            red_mul = b1.mul if over_1 else b2.mul
            block_r = min(_pow2(red_mul), t.block_r)
            lr, lu = (l1, l2) if over_1 else (l2, l1)
            n_unroll = b2.mul if over_1 else b1.mul
            self.elems_3d = max(self.elems_3d, block_r * block_c)
            red = reductions.setdefault(
                (red_mul, block_r),
                {
                    "comment": f"# outer products over {red_mul} channels",
                    "mul": red_mul,
                    "block_r": block_r,
                    "loads": {},
                    "accs": [],
                    "updates": [],
                    "stores": [],
                },
            )
            red["updates"].append(comment)
            for ch in range(n_unroll):
                index = {lg: "tile_c", lr: "tile_r", lu: str(ch)}
                parts = []
                for kk, nzs in by_k.items():
                    if over_1:
                        terms = [(c, [self._load(red, "x1", i1, i, "", "r"),
                                      self._load(red, "x2", i2, j, str(ch), "s")]) for c, i, j in nzs]
                    else:
                        terms = [(c, [self._load(red, "x1", i1, i, str(ch), "s"),
                                      self._load(red, "x2", i2, j, "", "r")]) for c, i, j in nzs]
                    red["updates"].append(f"o{kk} = {_sum(terms)}")
                    # g's channel tile does not depend on tile_r: per-row weights load it in
                    # the channel loop (once, and under the same name as the direct paths);
                    # shared weights reload it in the reduction loop's own row sub-tiles.
                    gk = self._load(red if self.shared else direct, "g", io, kk, "", "c")
                    parts.append(f"o{kk}[:, :, None] * {gk}[:, None, :]")
                self._finish(red, p, wl, index, parts, bidx, "[tile_r, tile_c]")
            return
        # uuu / uvu / uvv: tile over g's channel, unroll x1's or x2's if not g's
        unroll_op = None if (l1 == lg and l2 == lg) else ("x2" if l1 == lg else "x1")
        n_unroll = 1 if unroll_op is None else _block(ir, p, unroll_op).mul
        direct["updates"].append(comment)
        for ch in range(n_unroll):
            index = {lg: "tile_c"}
            if unroll_op is not None:
                index[_letter(p, unroll_op)] = str(ch)
            parts = []
            for kk, nzs in by_k.items():
                terms = []
                for c, i, j in nzs:
                    f1 = self._load(direct, "x1", i1, i, str(ch), "s" if unroll_op == "x1" else "c")
                    f2 = self._load(direct, "x2", i2, j, str(ch), "s" if unroll_op == "x2" else "c")
                    terms.append((c, [f1, f2]))
                direct["updates"].append(f"q{kk} = {_sum(terms)}")
                parts.append(f"q{kk} * {self._load(direct, 'g', io, kk, '', 'c')}")
            self._finish(direct, p, wl, index, parts, bidx, "[tile_c]")

    def _finish(self, scope: dict, p: PathIR, wl: str, index: dict, parts: list[str], bidx: str, shape: str) -> None:
        idx = ", ".join(index[letter] for letter in wl)
        target = f"gw{p.index}[{bidx}, {idx}]"
        expr = _wrap([parts[0]] + [f"+ {x}" for x in parts[1:]])
        if self.shared:
            acc = f"acc{p.index}_{'_'.join(index[letter] for letter in wl if not index[letter].startswith('tile'))}".rstrip("_")
            scope["accs"].append(f"{acc} = hl.zeros({shape}, dtype=gw{p.index}.dtype)")
            scope["updates"].append(f"{acc} = {acc} + {expr}.sum(0)")
            scope["stores"].append(f"{target} = {acc}")
        else:
            scope["updates"].append(f"{target} = {expr}")


def _weight_family(ir: TensorProductIR, tuning: Tuning, native: bool) -> list[dict]:
    weighted = [p for p in ir.paths if p.has_weight and p.nonzeros]
    costs = [len(p.nonzeros) * _unroll(ir, p, "w") for p in weighted]
    rows = wsum_rows(ir, tuning)
    return [
        _WeightKernel(ir, [weighted[i] for i in idx], tuning, native).context(n, rows)
        for n, idx in enumerate(_split(costs, tuning))
    ]


# ------------------------------------------------------------------ contexts and files


def kernel_context(
    ir: TensorProductIR,
    tuning: TuningTable = DEFAULT_TUNING,
    native: bool = False,
    op_of: Callable[[str], str] = lambda family: family.removesuffix("_lin"),
) -> dict[str, list[dict]]:
    """Context of every kernel of ``ir``, per family (``fwd``, ``bwd_x1``, ``bwd_x2``, ``bwd_w``,
    and ``*_lin`` when some path is unweighted).

    ``native``: a ``mul_ir`` spec's blocks are read and written in ``mul_ir`` order, as
    ``(batch, mul, 2l+1)`` views (``_native_load`` / ``_native_store``); otherwise every
    operand is a ``(batch, 2l+1, mul)`` view of ``ir_mul`` rows. A family's kernels take
    ``tuning_of(tuning, op_of(family))``: the ``*_lin`` kernels tune with their op.
    """
    native = native and ir.layout == "mul_ir"
    out = {}
    for family, out_op, args in FAMILIES + (LINEAR_FAMILIES if has_unweighted(ir) else ()):
        t = tuning_of(tuning, op_of(family))
        if family == "bwd_w":
            out[family] = _weight_family(ir, t, native)
        else:
            out[family] = _block_family(ir, family, out_op, tuple(a for a in args if a != "w"), t, native)
    return out


def view_map(ir: TensorProductIR, native: bool) -> dict[str, View]:
    """Every per-block view the kernel emitters index (``x1_0``, ``w3``, ``out_2``, ``gw5``, ...),
    by name: what ``flat_access`` folds into columns of the whole operands."""
    views: dict[str, View] = {}

    def blocks(op: str, prefix: str, base: str) -> None:
        for b in _blocks(ir, op):
            shape = (b.mul, b.dim) if _is_native(native, b) else (b.dim, b.mul)
            views[f"{prefix}{b.index}"] = View(f"{prefix}{b.index}", base, b.offset, shape, True)

    for op in ("x1", "x2", "g"):
        blocks(op, _IN_PARAM[op], _IN_TENSOR[op])
    for family, out_op in (("fwd", "g"), ("bwd_x1", "x1"), ("bwd_x2", "x2")):
        blocks(out_op, _OUT_PARAM[family], _OUT_TENSOR[family])
    for p in ir.paths:
        if p.has_weight:
            shape = tuple(p.path_shape)
            views[f"w{p.index}"] = View(f"w{p.index}", "weights", p.weight_offset, shape, not ir.shared_weights)
            views[f"gw{p.index}"] = View(f"gw{p.index}", "gw", p.weight_offset, shape, True)
    return views


def _launcher(family: str, args: tuple[str, ...], kernels: list[dict]) -> dict:
    """Kernel calls of one family, for ``torch_ops.py``: the kernels take whole rows
    (rewritten by ``flat_access``), so the launcher builds no views."""
    names = [_IN_TENSOR[a] for a in args] + [_OUT_TENSOR[family]]
    return {
        "name": family,
        "signature": ", ".join(f"{n}: torch.Tensor" for n in names),
        "calls": [f"_k.{k['name']}({', '.join(k['params'])})" for k in kernels],
    }


_DIM = {"x1": "DIM_IN1", "x2": "DIM_IN2", "g": "DIM_OUT", "w": None}
_OP_DOC = {
    "fwd": "``out = dF/dg (x1, x2, weights)``: the tensor product of ``{layout}`` rows.",
    "bwd_x1": "``dF/dx1 (g, x2, weights)`` (``{layout}`` rows).",
    "bwd_x2": "``dF/dx2 (x1, g, weights)`` (``{layout}`` rows).",
    "fwd_lin": "``dF_W/dg (x1, x2, weights)``: the weighted paths of the tensor product only.",
    "bwd_x1_lin": "``dF_W/dx1 (g, x2, weights)``: weighted paths only.",
    "bwd_x2_lin": "``dF_W/dx2 (x1, g, weights)``: weighted paths only.",
}


def _block_op(family: str, layout: str) -> dict:
    """A custom op computing operand blocks (``fwd``, ``bwd_x1``, ``bwd_x2``, ``*_lin``), for ``torch_ops.py``."""
    out_op, args = {f: (o, a) for f, o, a in _ALL_FAMILIES}[family]
    names = [_IN_TENSOR[a] for a in args]
    return {
        "name": family,
        "doc": _OP_DOC[family].format(layout=layout),
        "signature": ", ".join(f"{n}: torch.Tensor" for n in names),
        "args": ", ".join(names),
        "operands": ", ".join(f'("{n}", {n}, {_DIM[a]})' for n, a in zip(names, args)),
        "first": names[0],
        "out_dim": _DIM[out_op],
        "contiguous": ", ".join(f"{n}.contiguous()" for n in names),
    }


def _layouts_differ(blocks: tuple[Block, ...]) -> bool:
    return any(b.mul > 1 and b.dim > 1 for b in blocks)


def op_context(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING, bwd_w_op: str = "bwd_w") -> dict:
    """Template values shared by the generated op modules (``torch_ops``, ``torch_conv``);
    ``wsum_rows`` follows the tuning of ``bwd_w_op`` (the kernels that write the partial sums)."""
    return {
        "name": ir.name,
        "namespace": op_namespace(ir.name),
        "layout": ir.layout,
        "dtypes": list(ir.dtypes),
        "torch_dtypes": "(" + ", ".join(f"torch.{d}" for d in ir.dtypes) + ("," if len(ir.dtypes) == 1 else "") + ")",
        "shared_weights": ir.shared_weights,
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "weight_numel": ir.weight_numel,
        "wsum_rows": wsum_rows(ir, tuning_of(tuning, bwd_w_op)),
        # a weighted path without nonzeros (zero path weight) writes nothing: zero-fill
        "zero_fill_w": any(p.has_weight and not p.nonzeros for p in ir.paths),
    }


def render_files(ir: TensorProductIR, header: str, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, str]:
    # The plain tensor product reads and writes mul_ir in place; the convolution's kernels
    # (helion_conv) still run on ir_mul rows converted at its boundary.
    native = ir.layout == "mul_ir"
    kernel_layout = ir.layout
    views = view_map(ir, native)
    families = {f: [_flatten(k, views) for k in ks] for f, ks in kernel_context(ir, tuning, native).items()}
    args = {f: a for f, _, a in _ALL_FAMILIES}
    ops = {
        **op_context(ir, tuning),
        "launchers": {f: _launcher(f, args[f], ks) for f, ks in families.items()},
        "native": native,
        "kernel_layout": kernel_layout,
        "block_ops": [_block_op(f, kernel_layout) for f in families if f not in ("bwd_w", "bwd")],
        "linear_ops": "fwd_lin" in families,
        "n_paths": len(ir.paths),
        "conv": ir.conv,
    }
    fused = _fused_context(ir, tuning, native, views)
    if fused is not None:
        families["bwd"] = fused.pop("kernels")
        ops["launchers"]["bwd"] = fused.pop("launcher")
    ops["fused_bwd"] = fused
    all_kernels = [k for ks in families.values() for k in ks]
    kernels_py = render(
        "helion_kernels.py.j2", header=header, name=ir.name, kernels=all_kernels,
        n_kernels={f: len(ks) for f, ks in families.items()}, **_summary(ir)
    )
    return {
        "helion_kernels.py": flatten_kernels(kernels_py, views),
        "torch_ops.py": render("torch_ops.py.j2", header=header, **ops),
    }


def _fused_context(ir: TensorProductIR, tuning: TuningTable, native: bool, views: dict[str, View]) -> dict | None:
    """The fused backward (``helion_fused``) for ``torch_ops.py``: kernels, launcher, and
    what its outputs need (``gx2`` partials to sum, columns no kernel writes to zero), or
    None when the product is not channelwise or ``fuse_bwd`` is 0."""
    # imported here: helion_fused builds on this module's emitters
    from .helion_fused import GX2_PARTIALS, fused_bwd_kernels, fused_bwd_reason

    t = tuning_of(tuning, "bwd")
    if not t.fuse_bwd or fused_bwd_reason(ir) is not None:
        return None
    kernels = fused_bwd_kernels(ir, t, native)
    if not kernels:
        return None
    parts = sum(k["parts"] for k in kernels)
    gx2 = "gx2" if parts == 1 else GX2_PARTIALS
    covered_x1 = {a for k in kernels for a in k["blocks_in1"]}
    return {
        "kernels": [_flatten(k, views) for k in kernels],
        "launcher": {
            "name": "bwd",
            "signature": ", ".join(f"{a}: torch.Tensor" for a in ("x1", "x2", "weights", "g", "gx1", gx2, "gw")),
            "calls": [f"_k.{k['name']}({', '.join(flat_params(k['params'], views))})" for k in kernels],
        },
        "partials": parts,
        "zero_gx2": any(len(k["x2_cols"]) < ir.dim_in2 for k in kernels),
        "zero_gx1": len(covered_x1) < len(ir.in1),
    }


def _config(t: Tuning) -> str:
    """Arguments of the kernel's pinned ``helion.Config``."""
    return f"num_warps={t.num_warps}, num_stages={t.num_stages}"


def _flatten(kernel: dict, views: dict[str, View]) -> dict:
    """A kernel context taking whole rows: parameters are the views' base tensors
    (``flat_access``); the body is rewritten after rendering."""
    bp = kernel["batch_param"]
    return dict(kernel, params=flat_params(kernel["params"], views), batch_param=views[bp].base if bp in views else bp)


def _summary(ir: TensorProductIR) -> dict:
    return {
        "irreps_in1": ir.irreps_in1,
        "irreps_in2": ir.irreps_in2,
        "irreps_out": ir.irreps_out,
        "n_paths": len(ir.paths),
        "n_nonzeros": sum(len(p.nonzeros) for p in ir.paths),
    }
