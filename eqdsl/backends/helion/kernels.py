"""Helion kernel builders: ``TensorProductIR`` -> the statements of every operand and weight kernel.

Four kernel families, one four-linear form. A tensor product is the derivative of
``F(x1, x2, W, g) = sum_z sum_paths W C x1 x2 g`` (einsum subscripts per mode in
``eqdsl.reference.SUBSCRIPTS``); the generated kernels are its four partial
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
derivatives of ``F_W``); ``eqdsl.runtime.torch.autograd.register_autograd`` wires them.

The operand kernels compute the blocks of one operand; they share one builder
(``_BlockKernel``): for the computed operand ``o`` and the two others ``a`` and ``b`` of
a path, the channel letters of the mode decide the loop structure::

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
(``grid_c``): ``for tile_c, tile_b in hl.tile([M, batch])``, the per-batch scalars loaded
by each program, the body the same. Channel tiles vary fastest in the launch order, so
the programs of one batch tile run side by side and share its rows in L2.

``tp_bwd_w`` tiles over the channel of ``g`` (the innermost weight index for ``uvw``
and ``uvv``) and unrolls the other one (``uvu``, ``uvv``) or tiles it too (``uvw``:
an outer product per batch row, ``(tile_b, tile_r, tile_c)``). With shared weights each
program reduces ``wsum_rows`` batch rows (a static loop of masked sub-tiles, so no
data-dependent loop bound: Triton's interpreter cannot run a loop whose bound is an
argument, triton#9171 with numpy >= 2.4) into its own row of a ``(cdiv(batch, wsum_rows),
weight_numel)`` buffer that the op sums: no atomics, the same bits every run.

Operands are whole ``(rows, dim)`` tensors addressed by column (``printer.Access``),
weights in e3nn's order. Component ``k``, channel ``u`` of an ``ir_mul`` block is column
``offset + k * mul + u``: every component tile is contiguous over the channels. With
``native`` (the plain tensor product of a ``mul_ir`` spec) ``mul_ir`` blocks are read
and written in place, column ``offset + u * (2l+1) + k``: one masked ``(batch, channels,
2l+1)`` load split into components on chip (``native_load``), and outputs joined into
one store (``native_store``); per-component access would stride by ``2l+1`` (23% of the
copy bandwidth against 92%, docs/architecture.md). The convolution's kernels are these
builders with another ``Operands`` (``conv``): node rows gathered per edge, node
outputs scattered, on ``ir_mul`` rows, which each op of a ``mul_ir`` conv converts to and
from (``eqdsl.runtime.torch.conv.ColumnPermutation``; read in place they measured slower).
Block sizes are literals in the generated code and the config is pinned, so nothing is
autotuned and a new batch size never recompiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...analysis import has_unweighted
from ...ir import Block, PathIR, TensorProductIR
from ...reference import SUBSCRIPTS
from .printer import (
    Access, Arange, Assign, AtomicAdd, Comment, Loop, MaskedLoad, MaskedStore, Matmul, Read, Row, Stmt, Store, Tile,
    Zeros, natural, plural, print_stmts, ranges, sum_expr, wrap,
)
from .tuning import DEFAULT_TUNING, Tuning, TuningTable, tuning_of

__all__ = [
    "FAMILIES", "LINEAR_FAMILIES", "ALL_FAMILIES", "Operands", "TP_OPERANDS", "kernel_context", "wsum_rows",
    "pow2", "split_costs", "grid_c", "block_b", "config", "block_label", "path_comment", "blocks_of",
    "is_native", "tile_load", "native_load", "native_store", "block_access", "element_access", "TILE_B",
    "Radial", "RadialTileShape", "radial_features_load", "radial_weight_tile", "RADIAL_LOCAL",
]

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
ALL_FAMILIES = FAMILIES + LINEAR_FAMILIES
# The role of each family's computed tensor (``Operands`` names it).
_OUT_ROLE = {"fwd": "out", "bwd_x1": "gx1", "bwd_x2": "gx2", "bwd_w": "gw"}
for _f in ("fwd", "bwd_x1", "bwd_x2"):
    _OUT_ROLE[_f + "_lin"] = _OUT_ROLE[_f]
# Prefix of the local names of loaded values (``a0_1``: x1 block 0 component 1).
_LOCAL = {"x1": "a", "x2": "b", "g": "g"}

TILE_B = Row("tile_b")


class RadialTileShape(ValueError):
    """A kernel reads a weight tile that is not ``(rows, one channel tile)`` (the 3-D
    ``(rows, r, c)`` tiles of ``uvw`` / ``uvv`` reductions): ``conv_radial`` cannot form it
    with one on-chip product, and that op materializes the weights instead (``conv``)."""


@dataclass(frozen=True)
class Radial:
    """``conv_radial``'s weight source: each per-edge weight tile formed on chip.

    Where a convolution kernel reads ``weights[rows, cols]`` (a ``(rows, channel tile)``
    tile of per-edge weights), the radial kernel computes it as ``radial_features[rows, :H]
    @ radial_weight[:H, cols]`` (``Matmul``): the ``(rows, H)`` features tile is loaded
    once per row tile (``radial_features_load``), each weight tile reads ``H`` rows of
    ``radial_weight`` columns, which every program shares in L2. ``H`` is padded to
    ``padded`` (a power of two of at least 16, the smallest ``K`` of ``tl.dot``), the
    padding masked to zeros on both sides.

    Attributes:
        h: the radial MLP's hidden width (``TensorProductIR.radial_features``).
        features, weight: the kernel parameters (``(num_edges, H)``, ``(H, weight_numel)``).
    """

    h: int
    features: str = "radial_features"
    weight: str = "radial_weight"

    @property
    def padded(self) -> int:
        return max(16, pow2(self.h))

    def mask(self, lead: bool) -> str | None:
        """The padding mask of the ``H`` axis (first or last), or None without padding."""
        if self.padded == self.h:
            return None
        return f"(hl.arange({self.padded}) < {self.h})[{':, None' if lead else 'None, :'}]"


# local name of a radial kernel's (rows, H) radial-features tile
RADIAL_LOCAL = "rfh"
# tl.dot's smallest M and N (rows and columns of the product) for float32 and float64
DOT_MIN = 16


def radial_features_load(ops: "Operands") -> Assign:
    """``rfh = radial_features[rows, :H]`` (padded, masked) at the weight row of ``ops``."""
    r = ops.radial
    access = Access(r.features, ops.row("w"), 0, ((Arange(r.padded), 1),))
    mask = r.mask(lead=False)
    return Assign(RADIAL_LOCAL, Read(access) if mask is None else MaskedLoad(access, mask))


def radial_weight_tile(ops: "Operands", columns: Access, rows: int, cols: int) -> Matmul:
    """The weight tile at ``columns`` (a per-edge weight access, one tiled channel axis)
    formed on chip: ``rfh @ radial_weight[:H, columns]``, a dot when the tile has at least
    ``DOT_MIN`` ``rows`` and ``cols``, else multiply-adds.

    Raises:
        RadialTileShape: ``columns`` has no or several tiled axes.
    """
    if len(columns.axes) != 1:
        raise RadialTileShape(f"a weight tile of {len(columns.axes)} tiled axes")
    r = ops.radial
    access = replace(columns, tensor=r.weight, row=Row(f"hl.arange({r.padded})", outer=True))
    mask = r.mask(lead=True)
    rhs = Read(access) if mask is None else MaskedLoad(access, mask)
    return Matmul(RADIAL_LOCAL, rhs, dot=rows >= DOT_MIN and cols >= DOT_MIN)


@dataclass(frozen=True)
class Operands:
    """How a kernel addresses its operands: the one parameter that makes the tensor
    product's kernels the convolution's.

    Attributes:
        tensors: ``(role, tensor)`` pairs: the whole-row kernel parameter of each role
            (``x1``, ``x2``, ``g``, ``w``; the computed ``out``, ``gx1``, ``gx2``, ``gw``;
            the fused backward's ``gx2p`` partial sums).
        rows: ``(role, Row)``: the row each input (``x1``, ``x2``, ``g``, ``w``; ``w``
            also the per-row ``gw``) is read at inside a batch (edge) tile: ``tile_b``
            for the tensor product; the convolution gathers node rows by ``s_idx`` /
            ``d_idx`` and reads edge rows at ``tile_b`` or, sorted, ``eid``.
        sub_rows: ``(role, Row)``: the same inside a shared-weight partial sum's row
            sub-tile (``rows``; the convolution's ``srows`` / ``drows``).
        scatter: how computed operand blocks are written: ``store`` (one row each:
            ``T[row, ...] = acc``), ``atomic`` (``hl.atomic_add`` at ``scatter_row``, a
            node written by several edges) or ``segment`` (summed over a node's edge
            range in registers, ``tot`` accumulators, and stored once at ``node``).
        scatter_row: the row index of an ``atomic`` scatter.
        radial: ``conv_radial``'s weight source (``Radial``): the weights of role ``w``
            are formed on chip from ``radial_features`` and ``radial_weight``, never read;
            None: read from the ``w`` tensor.
    """

    tensors: tuple[tuple[str, str], ...]
    rows: tuple[tuple[str, Row], ...] = (("x1", TILE_B), ("x2", TILE_B), ("g", TILE_B), ("w", TILE_B))
    sub_rows: tuple[tuple[str, Row], ...] = (("x1", Row("rows")), ("x2", Row("rows")), ("g", Row("rows")))
    scatter: str = "store"
    scatter_row: Row | None = None
    radial: Radial | None = None

    def tensor(self, role: str) -> str:
        return dict(self.tensors)[role]

    def weight_params(self) -> list[str]:
        """The kernel parameters a weight read needs: the ``w`` tensor, or ``Radial``'s two."""
        return [self.radial.features, self.radial.weight] if self.radial else [self.tensor("w")]

    def row(self, role: str) -> Row:
        return dict(self.rows)[role]

    def sub_row(self, role: str) -> Row:
        return dict(self.sub_rows)[role]


# The plain tensor product: every operand a row of its batch tile.
TP_OPERANDS = Operands(tuple((r, r) for r in ("x1", "x2", "g", "out", "gx1", "gx2", "gw", "gx2p")) + (("w", "weights"),))


def pow2(n: int) -> int:
    """The least power of two ``>= n``."""
    p = 1
    while p < n:
        p *= 2
    return p


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _ix(index: str) -> Tile | int:
    """An index the builders write as text (``tile_c``, ``3``) as a column index."""
    return Tile(index) if index.startswith("tile_") else int(index)


def element_access(tensor: str, row: Row | None, offset: int, shape: tuple[int, ...], index: tuple) -> Access:
    """Element ``index`` (ints, ``Tile``s, ``Arange``s) of the row-major ``shape`` block at
    column ``offset`` of ``tensor``'s row ``row``: literal indices fold into the offset,
    each tiled one keeps its stride."""
    if len(index) != len(shape):
        raise ValueError(f"{tensor}: {len(index)} indices for block shape {shape}")
    offset, axes = offset, []
    for j, i in enumerate(index):
        stride = 1
        for n in shape[j + 1:]:
            stride *= n
        if isinstance(i, int):
            offset += i * stride
        else:
            axes.append((i, stride))
    return Access(tensor, row, offset, tuple(axes))


def _split_tree(var: str, names: list[str]) -> list[Stmt]:
    """Statements unpacking ``var`` (trailing dims ``2 x ... x 2``, flat order ``names``) with ``hl.split``.

    ``hl.split`` halves the last (least significant) dim: even flat indices, then odd.
    """
    even, odd = names[0::2], names[1::2]
    if len(names) == 2:
        return [Assign(f"{even[0]}, {odd[0]}", f"hl.split({var})")]
    return [Assign(f"{var}e, {var}o", f"hl.split({var})")] + _split_tree(var + "e", even) + _split_tree(var + "o", odd)


def _join_tree(names: list[str]) -> str:
    """Inverse of ``_split_tree``: one expression joining ``names`` (a power of two of them)."""
    if len(names) == 1:
        return names[0]
    return f"hl.join({_join_tree(names[0::2])}, {_join_tree(names[1::2])})"


def _pad_mask(pad: int, dim: int) -> str:
    return f"(hl.arange({pad}) < {dim})[None, None, :]"


def native_load(access: Access, local: str, dim: int, tile: str) -> list[Stmt]:
    """A ``mul_ir`` block tile read as one ``(batch, channels, 2l+1)`` load, split on chip.

    The components of a channel are adjacent in ``mul_ir``, so one masked 3-D load
    (last dim padded to a power of two) reads whole contiguous runs; ``hl.split``
    (a register shuffle) then gives one ``(batch, channels)`` tile per component, the
    shape the unrolled products use. Per-component loads would stride by ``2l+1``.
    ``access``: the block's ``(channel tile, padded component)`` columns.
    """
    pad = pow2(dim)
    stmts: list[Stmt] = [
        Assign(local, MaskedLoad(access, _pad_mask(pad, dim))),
        Assign(f"{local}t", f"{local}.reshape([tile_b, {tile}{', 2' * (pad.bit_length() - 1)}])"),
    ]
    return stmts + _split_tree(f"{local}t", [f"{local}_{m}" for m in range(pad)])


def native_store(access: Access, accs: list[str], dim: int) -> list[Stmt]:
    """Components ``accs`` of a ``mul_ir`` block joined on chip and written in one masked store."""
    pad = pow2(dim)
    joined = _join_tree(accs + [accs[0]] * (pad - dim))  # padding lanes are masked off
    return [MaskedStore(access, f"({joined}).reshape([tile_b, tile_c, {pad}])", _pad_mask(pad, dim))]


# ------------------------------------------------------------------ path algebra


def blocks_of(ir: TensorProductIR, op: str) -> tuple[Block, ...]:
    """The blocks of operand ``op`` (``x1``, ``x2``, ``g``)."""
    return {"x1": ir.in1, "x2": ir.in2, "g": ir.out}[op]


def _bidx(p: PathIR, op: str) -> int:
    return {"x1": p.i_in1, "x2": p.i_in2, "g": p.i_out}[op]


def _block(ir: TensorProductIR, p: PathIR, op: str) -> Block:
    return blocks_of(ir, op)[_bidx(p, op)]


def _comp(n, op: str) -> int:
    return {"x1": n.i, "x2": n.j, "g": n.k}[op]


def _letter(p: PathIR, op: str) -> str:
    """Channel letter of operand ``op`` in the path's four-linear form."""
    sw, s1, s2, so = SUBSCRIPTS[p.mode]
    return {"x1": s1[1], "x2": s2[1], "g": so[1], "w": sw[1:]}[op]


def is_native(native: bool, b: Block) -> bool:
    """Whether block ``b`` is accessed in ``mul_ir`` order in a native kernel (layouts differ)."""
    return native and b.mul > 1 and b.dim > 1


def block_access(ir: TensorProductIR, tensor: str, row: Row | None, op: str, blk: int, comp, chan, native: bool) -> Access:
    """Component ``comp``, channel ``chan`` (each an int, ``Tile`` or ``Arange``) of block
    ``blk`` of operand ``op``, in ``tensor``'s row ``row``: column ``offset + chan * (2l+1)
    + comp`` for a native ``mul_ir`` block, else ``offset + comp * mul + chan``."""
    b = blocks_of(ir, op)[blk]
    if is_native(native, b):
        return element_access(tensor, row, b.offset, (b.mul, b.dim), (chan, comp))
    return element_access(tensor, row, b.offset, (b.dim, b.mul), (comp, chan))


def _weight_access(ir: TensorProductIR, tensor: str, row: Row | None, p: PathIR, index: dict[str, str]) -> Access:
    """Path ``p``'s weight block element (its letters' ``index``: tiles or literals), e3nn order."""
    return element_access(tensor, row, p.weight_offset, tuple(p.path_shape), tuple(_ix(index[x]) for x in _letter(p, "w")))


# ------------------------------------------------------------------ formatting


def block_label(b: Block) -> str:
    """``32x1o``."""
    return f"{b.mul}x{b.l}{'e' if b.parity == 1 else 'o'}"


def path_comment(ir: TensorProductIR, p: PathIR) -> Comment:
    """``# path 3: uvu 32x1o x 1x0e -> 32x1o, 3 nonzeros, weighted``."""
    w = "weighted" if p.has_weight else "unweighted"
    return Comment(
        f"path {p.index}: {p.mode} {block_label(ir.in1[p.i_in1])} x {block_label(ir.in2[p.i_in2])}"
        f" -> {block_label(ir.out[p.i_out])}, {plural(len(p.nonzeros), 'nonzero')}, {w}"
    )


def _sorted_stmts(d: dict[str, Stmt | list[Stmt]]) -> list[Stmt]:
    """The statements of ``d`` (one, or a list) in the natural order of their keys."""
    out: list[Stmt] = []
    for n in sorted(d, key=natural):
        out += d[n] if isinstance(d[n], list) else [d[n]]
    return out


def _assigns(lines: list[Stmt], name: str) -> bool:
    return any(isinstance(s, Assign) and s.target == name for s in lines)


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


def split_costs(costs: list[int], tuning: Tuning) -> list[list[int]]:
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


def grid_c(tuning: Tuning, groups: list[dict], partial_sums: bool = False) -> bool:
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


def block_b(tuning: Tuning, elems_3d: int) -> int:
    """Batch rows per program: ``block_b``, fewer when 3-D tiles of ``elems_3d`` per row exist."""
    if elems_3d <= 0:
        return tuning.block_b
    return max(tuning.block_b_min, min(tuning.block_b, _pow2_floor(max(1, tuning.tile_elems // elems_3d))))


def config(t: Tuning) -> str:
    """Arguments of the kernel's pinned ``helion.Config``."""
    return f"num_warps={t.num_warps}, num_stages={t.num_stages}"


def _hoisted(ir: TensorProductIR, op: str, native: bool, tuning: Tuning) -> bool:
    """Whether operand ``op``'s channel tiles are loaded together at the top of the loop."""
    n = sum(pow2(b.dim) if is_native(native, b) else b.dim for b in blocks_of(ir, op) if b.mul > 1)
    return n <= tuning.hoist_components


def tile_load(ir: TensorProductIR, tensor: str, row: Row, op: str, blk: int, m: int, native: bool, local: str,
              tile: str) -> tuple[str, list[Stmt]]:
    """``(key, statements)`` loading component ``m`` of ``op`` block ``blk`` over ``tile`` as ``{local}_{m}``.

    A native ``mul_ir`` block loads all its components at once (key ``local``); an
    ``ir_mul`` block one component (key ``{local}_{m}``).
    """
    b = blocks_of(ir, op)[blk]
    if is_native(native, b):
        return local, native_load(block_access(ir, tensor, row, op, blk, Arange(pow2(b.dim)), Tile(tile), native),
                                  local, b.dim, tile)
    return f"{local}_{m}", [Assign(f"{local}_{m}", Read(block_access(ir, tensor, row, op, blk, m, Tile(tile), native)))]


def _once(done: set, lines: list[Stmt], key: str, new: list[Stmt]) -> None:
    """Append ``new`` to ``lines`` the first time ``key`` is seen (a load at its first use)."""
    if key not in done:
        done.add(key)
        lines.extend(new)


def _paths_into(ir: TensorProductIR, family: str, out_op: str, o: int) -> list[PathIR]:
    """Paths contributing to block ``o`` of ``out_op`` in ``family`` (``*_lin``: weighted only)."""
    lin = family.endswith("_lin")
    return [p for p in ir.paths if _bidx(p, out_op) == o and (p.has_weight or not lin)]


def _acc(o: int, k: int, s: str, wexpr: str | None) -> Assign:
    rhs = f"{wexpr} * {s}" if wexpr else s
    return Assign(f"acc{o}_{k}", f"acc{o}_{k} + {rhs}")


# ------------------------------------------------------------------ fwd, bwd_x1, bwd_x2

_DOC = {
    "fwd": "Forward (dF/dg)",
    "bwd_x1": "Gradient with respect to x1 (dF/dx1)",
    "bwd_x2": "Gradient with respect to x2 (dF/dx2)",
    "bwd_w": "Gradient with respect to the weights (dF/dW)",
    "fwd_lin": "Forward of the weighted paths only (dF_W/dg)",
    "bwd_x1_lin": "Gradient with respect to x1, weighted paths only (dF_W/dx1)",
    "bwd_x2_lin": "Gradient with respect to x2, weighted paths only (dF_W/dx2)",
}


@dataclass
class _BlockKernel:
    """Builder of one kernel that computes blocks of operand ``out_op`` (``g``, ``x1`` or ``x2``)."""

    ir: TensorProductIR
    family: str
    out_op: str
    in_ops: tuple[str, str]
    out_blocks: list[int]
    tuning: Tuning
    native: bool = False  # mul_ir operands read and written in place (see native_load)
    ops: Operands = TP_OPERANDS
    prefix: str = "tp"  # kernel names: <prefix>_<family>_<n>
    params: dict = field(default_factory=lambda: {"x1": set(), "x2": set(), "g": set(), "w": set()})
    scalars: dict = field(default_factory=dict)  # name -> statement (hoisted per batch tile)
    elems_3d: int = 0
    rows_used: set = field(default_factory=set)

    def paths_into(self, o: int) -> list[PathIR]:
        return _paths_into(self.ir, self.family, self.out_op, o)

    def _row(self, op: str) -> Row:
        row = self.ops.row(op)
        self.rows_used.add(row.expr)
        return row

    def _out_stores(self, o: int, finals: list[dict]) -> list[Stmt]:
        """The statements writing output block ``o``'s accumulators (``Operands.scatter``);
        a segment scatter's per-node totals and their final store go to ``finals``."""
        ir, bo = self.ir, blocks_of(self.ir, self.out_op)[o]
        tensor = self.ops.tensor(_OUT_ROLE[self.family])
        accs = [f"acc{o}_{kk}" for kk in range(bo.dim)]
        if is_native(self.native, bo):
            if self.ops.scatter != "store":
                raise ValueError("a native mul_ir block is stored in place, never scattered")
            access = block_access(ir, tensor, TILE_B, self.out_op, o, Arange(pow2(bo.dim)), Tile("tile_c"), True)
            return native_store(access, accs, bo.dim)
        out: list[Stmt] = []
        for kk, acc in enumerate(accs):
            if self.ops.scatter == "store":
                out.append(Store(block_access(ir, tensor, TILE_B, self.out_op, o, kk, Tile("tile_c"), False), acc))
            elif self.ops.scatter == "atomic":
                self.rows_used.add(self.ops.scatter_row.expr)
                out.append(AtomicAdd(block_access(ir, tensor, self.ops.scatter_row, self.out_op, o, kk, Tile("tile_c"),
                                                  False), acc))
            else:  # segment: masked rows (past the node's edge range) contribute nothing
                tot = "tot" + acc[len("acc"):]
                finals.append({
                    "init": Assign(tot, Zeros("[tile_c]", tensor)),
                    "store": Store(block_access(ir, tensor, Row("node"), self.out_op, o, kk, Tile("tile_c"), False), tot),
                })
                out.append(Assign(tot, f"{tot} + torch.where(ok, {acc}, 0).sum(0)"))
        return out

    def context(self, index: int) -> dict:
        ir, t = self.ir, self.tuning
        blocks = blocks_of(ir, self.out_op)
        out_tensor = self.ops.tensor(_OUT_ROLE[self.family])
        by_mul: dict[int, list[int]] = {}
        for o in self.out_blocks:
            by_mul.setdefault(blocks[o].mul, []).append(o)
        groups = []
        for mul, outs in by_mul.items():
            g = {"mul": mul, "block_c": min(pow2(mul), t.block_c), "loads": {}, "outs": [], "reductions": {}}
            deferred, finals, entries = [], [], []
            for o in outs:
                bo = blocks[o]
                paths = self.paths_into(o)
                updates: list[Stmt] = []
                reduced = False
                for p in paths:
                    reduced |= self._emit(p, g, updates)
                entries.append((o, bo, paths, updates, reduced))
            # stores in the order they are written: each block's after its updates, then
            # those deferred past the reduction loops (a segment's totals: in that order too)
            stores = {o: self._out_stores(o, finals) for o, _, _, _, reduced in entries if not reduced}
            stores |= {o: self._out_stores(o, finals) for o, _, _, _, reduced in entries if reduced}
            for o, bo, paths, updates, reduced in entries:
                g["outs"].append(
                    {
                        "comment": print_stmts([Comment(f"{self.out_op} block {o}: {block_label(bo)} "
                                                        f"({plural(len(paths), 'path')})")])[0],
                        "accs": [f"acc{o}_{kk}" for kk in range(bo.dim)],
                        "dtype_of": out_tensor,
                        "updates": print_stmts(updates),
                        "stores": [] if reduced else print_stmts(stores[o]),
                    }
                )
                if reduced:
                    deferred += stores[o]
            g["loads"] = print_stmts(_sorted_stmts(g["loads"]))
            g["reductions"] = [
                dict(r, loads=print_stmts(_sorted_stmts(r["loads"])), has_partials=bool(r.get("partials")),
                     updates=print_stmts(r["updates"] + [
                         Assign(acc, f"{acc} + {part}.sum(1)[:, None]") for part, acc in r.get("partials", {}).items()
                     ]))
                for r in g["reductions"].values()
            ]
            g["deferred_stores"] = print_stmts(deferred)
            g["finals"] = [{"init": print_stmts([f["init"]])[0], "store": print_stmts([f["store"]])[0]} for f in finals]
            groups.append(g)
        params = [self.ops.tensor(op) for op in self.in_ops if self.params[op]]
        params += (self.ops.weight_params() if self.params["w"] else []) + [out_tensor]
        path_ids = sorted(p.index for o in self.out_blocks for p in self.paths_into(o))
        return {
            "name": f"{self.prefix}_{self.family}_{index}",
            "kind": "block",
            "family": self.family,
            "detail": f"{self.out_op} blocks {ranges(self.out_blocks)}; paths {ranges(path_ids) or 'none'}.",
            "doc": f"{_DOC[self.family]}: {self.out_op} blocks {ranges(self.out_blocks)}; "
                   f"paths {ranges(path_ids) or 'none'}.",
            "params": list(dict.fromkeys(params)),
            "batch_param": params[0],
            "out_param": out_tensor,
            "rows_used": frozenset(self.rows_used),
            "block_b": block_b(t, self.elems_3d),
            "num_warps": t.num_warps,
            "num_stages": t.num_stages,
            "config": config(t),
            # Helion accepts maxnreg only on persistent kernels, which its CPU interpreter
            # cannot run: the CUDA launch adds it (the lowered module's TRITON_OPTIONS)
            "triton_options": (
                f'{{"maxnreg": {t.maxnreg_partials}}}'
                if t.maxnreg_partials and any(r["has_partials"] for g in groups for r in g["reductions"])
                else ""
            ),
            "scalars": print_stmts(_sorted_stmts(self.scalars)),
            "channel_groups": groups,
            "grid_c": grid_c(t, groups),
        }

    def _emit(self, p: PathIR, g: dict, updates: list[Stmt]) -> bool:
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

        def load(op: str, blk: int, m: int, local: str, tile: str) -> tuple[str, list[Stmt]]:
            return tile_load(ir, self.ops.tensor(op), self._row(op), op, blk, m, self.native, local, tile)

        def tiled(op: str, blk: int, m: int) -> str:
            key, lines = load(op, blk, m, f"{_LOCAL[op]}{blk}", "tile_c")
            if _hoisted(ir, op, self.native, t):
                g["loads"].setdefault(key, lines)
            else:
                _once(loaded, updates, key, lines)
            return f"{_LOCAL[op]}{blk}_{m}"

        def scalar(op: str, blk: int, m: int, ch: int) -> str:
            name = f"s{_LOCAL[op]}{blk}_{m}_{ch}"
            if name not in self.scalars:
                access = block_access(ir, self.ops.tensor(op), self._row(op), op, blk, m, ch, self.native)
                self.scalars[name] = Assign(name, Read(access, "[:, None]"))
            return name

        comment = path_comment(ir, p)
        if la == lo and lb == lo:  # uuu: everything indexed by the output channel
            wexpr = self._weight_row(p, {lo: "tile_c"}, updates, g)
            updates.append(comment)
            for kk, nzs in sorted(by_o.items()):
                s = sum_expr([(c, [tiled(ao, ai, i), tiled(bo, bi, j)]) for c, i, j in nzs])
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
                    updates.append(_acc(o, kk, sum_expr(terms), wexpr))
        else:  # reduction over a channel the output does not carry
            pair = la == lb
            if pair:  # both inputs carry it (uvu dx2, uvv dx1): nothing unrolled
                red_mul, block_r, lr = ab.mul, min(pow2(ab.mul), t.block_r_pair), la
                n_unroll, lu = 1, None
            else:  # uvw: reduce over the larger input, unroll the smaller
                over_a = ab.mul >= bb.mul
                red_mul = ab.mul if over_a else bb.mul
                block_r = min(pow2(red_mul), t.block_r)
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
                        updates.append(_acc(o, kk, sum_expr(terms), wexpr))
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
                _once(rloaded, rlines, *load(op, blk, m, f"r{_LOCAL[op]}{blk}", "tile_r"))
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
                    red["updates"].append(Assign("t", sum_expr(terms)))
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
                    red["updates"].append(Assign("t", sum_expr(terms)))
                    if pair and _block(ir, p, oo).mul == 1:
                        self._partial(p, red, lo, lr, f"s{o}_{kk}", f"acc{o}_{kk}")
                        continue
                    contrib = self._contract(p, index, block_r, red["updates"])
                    red["updates"].append(Assign(f"acc{o}_{kk}", f"acc{o}_{kk} + {contrib}"))
            return True
        return False

    def _weight(self, p: PathIR, index: dict[str, str], suffix: str, cols: int | None = None) -> Read | Matmul:
        """Path ``p``'s weight element ``index`` (per-row weights at the weight row;
        shared ones the vector, with ``suffix``, e.g. ``[None, :]``). With ``Operands.radial``
        the ``(rows, cols)`` tile formed on chip (``radial_weight_tile``; ``cols``: the
        width of its one channel tile, None for a 3-D tile, which raises ``RadialTileShape``)."""
        shared = self.ir.shared_weights
        row = None if shared else self._row("w")
        access = _weight_access(self.ir, self.ops.tensor("w"), row, p, index)
        if self.ops.radial is not None:
            if cols is None:
                raise RadialTileShape(f"path {p.index}: a 3-D weight tile")
            self.scalars[RADIAL_LOCAL] = radial_features_load(self.ops)
            return radial_weight_tile(self.ops, access, self.tuning.block_b, cols)
        return Read(access, suffix if shared else "")

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
        block_s = min(pow2(mul), t.block_r)
        self.elems_3d = max(self.elems_3d, block_r * block_s)
        wl = _letter(p, "w")
        r_first = wl.index(lr) < wl.index(ls)
        wname = f"ws{p.index}"
        body: list[Stmt] = [Assign(wname, self._weight(p, {lo: "0", lr: "tile_r", ls: "tile_s"}, "[None, :, :]"))]
        loaded: set = set()
        local = f"v{_LOCAL[vop]}{vblk}"
        names = {m: f"acch{p.index}_{m}" for m in comps}
        for m in comps:
            _once(loaded, body, *tile_load(ir, self.ops.tensor(vop), self._row(vop), vop, vblk, m, self.native, local,
                                           "tile_s"))
            prod = f"{wname} * {local}_{m}[:, None, :]" if r_first else f"{wname} * {local}_{m}[:, :, None]"
            body.append(Assign(names[m], f"{names[m]} + ({prod}).sum({2 if r_first else 1})"))
        dtype_of = self.ops.tensor(_OUT_ROLE[self.family])
        red["updates"] += [Assign(n, Zeros("[tile_b, tile_r]", dtype_of)) for n in names.values()]
        red["updates"].append(Loop(f"tile_s in hl.tile({mul}, block_size={block_s})", tuple(body)))
        return names

    def _partial(self, p: PathIR, red: dict, lo: str, lr: str, part: str, acc: str, weighted: bool = True) -> None:
        """Add ``t * W`` (``t`` if not ``weighted``) to the ``(batch, r)`` partial sum ``part``
        of a one-channel output.

        Contracted once per reduction step, after every path (``acc += part.sum(1)``),
        not once per path and component: a cross-lane sum costs far more than an add.
        """
        lines = red["updates"]
        if p.has_weight and weighted:
            wname = f"wq{p.index}"
            _once(red.setdefault("loaded", set()), lines, wname,
                  [Assign(wname, self._weight(p, {lo: "0", lr: "tile_r"}, "[None, :]", red["block_r"]))])
            term = f"t * {wname}"
        else:
            term = "t"
        partials = red.setdefault("partials", {})
        if part in partials:
            lines.append(Assign(part, f"{part} + {term}"))
        else:
            partials[part] = acc
            lines.append(Assign(part, term))

    def _weight_row(self, p: PathIR, index: dict[str, str], lines: list[Stmt], g: dict) -> str | None:
        """Weight factor of an update indexed by ``tile_c`` (and unrolled channels): (b or 1, c).

        Loaded once (``wt<path>_<channel>``), used by every component: where first needed
        (appended to ``lines``), or with ``Tuning.hoist_weights`` among channel group
        ``g``'s loads at the top of the tile, before any store.
        """
        if not p.has_weight:
            return None
        letters = _letter(p, "w")
        name = "_".join([f"wt{p.index}"] + [index[x] for x in letters if not index[x].startswith("tile_")])
        if self.tuning.hoist_weights:
            if name not in g["loads"]:
                g["loads"][name] = [Assign(name, self._weight(p, index, "[None, :]", g["block_c"]))]
        elif not _assigns(lines, name):
            lines.append(Assign(name, self._weight(p, index, "[None, :]", g["block_c"])))
        return name

    def _contract(self, p: PathIR, index: dict[str, str], block_r: int, lines: list[Stmt]) -> str:
        """``sum_r t[b, r] W[.., r, .., c]`` as an expression of shape (b, c).

        The weight tile is loaded once per reduction step (``wr<path>_<channel>``, the
        load inserted before the ``t = ...`` statement just added, where first needed).
        """
        if not p.has_weight:
            return "t.sum(1)[:, None]"
        letters = _letter(p, "w")
        tiles = [index[letter] for letter in letters if index[letter].startswith("tile_")]
        texpr, axis = ("t[:, :, None]", 1) if tiles == ["tile_r", "tile_c"] else ("t[:, None, :]", 2)
        name = "_".join([f"wr{p.index}"] + [index[x] for x in letters if not index[x].startswith("tile_")])
        if not self.ir.shared_weights:
            c = min(pow2(_block(self.ir, p, self.out_op).mul), self.tuning.block_c)
            self.elems_3d = max(self.elems_3d, block_r * c)
        if not _assigns(lines, name):
            lines.insert(len(lines) - 1, Assign(name, self._weight(p, index, "[None, :, :]")))
        return f"({texpr} * {name}).sum({axis})"


def _block_family(ir: TensorProductIR, family: str, out_op: str, in_ops: tuple[str, str], tuning: Tuning, native: bool,
                  ops: Operands, prefix: str) -> list[dict]:
    n_out = len(blocks_of(ir, out_op))
    costs = [
        sum(len(p.nonzeros) * _unroll(ir, p, out_op) for p in _paths_into(ir, family, out_op, o))
        for o in range(n_out)
    ]
    return [
        _BlockKernel(ir, family, out_op, in_ops, blocks, tuning, native, ops, prefix).context(idx)
        for idx, blocks in enumerate(split_costs(costs, tuning))
    ]


# ------------------------------------------------------------------ bwd_w


def wsum_rows(ir: TensorProductIR, tuning: Tuning = DEFAULT_TUNING) -> int:
    """Batch rows one shared-weight ``bwd_w`` program reduces (one partial-sum row each).

    A power of two at least twice ``weight_numel / (dim_in1 + dim_in2 + dim_out)``, so
    the partial sums written cost at most about half of the inputs read, clamped to
    ``[wsum_min_rows, wsum_max_rows]`` (more rows per program: fewer programs).
    """
    row = max(1, ir.dim_in1 + ir.dim_in2 + ir.dim_out)
    want = pow2(-(-2 * ir.weight_numel // row))
    return max(tuning.wsum_min_rows, min(tuning.wsum_max_rows, want))


@dataclass
class _WeightKernel:
    """Builder of one ``bwd_w`` kernel: the weight gradients of some weighted paths."""

    ir: TensorProductIR
    paths: list[PathIR]
    tuning: Tuning
    native: bool = False  # mul_ir operands read in place (see native_load)
    ops: Operands = TP_OPERANDS
    prefix: str = "tp"  # kernel names: <prefix>_bwd_w_<n>
    params: dict = field(default_factory=lambda: {"x1": set(), "x2": set(), "g": set()})
    scalars: dict = field(default_factory=dict)  # per-batch mode: hoisted per batch tile
    elems_3d: int = 0
    rows_used: set = field(default_factory=set)

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
        tensor = self.ops.tensor(op)
        if self.shared:  # inside the masked sub-tile loop of a partial sum (mul_ir: strided reads)
            row = self.ops.sub_row(op)
            self.rows_used.add(row.expr)
            access = block_access(self.ir, tensor, row, op, blk, m, _ix(col), self.native)
            value = MaskedLoad(access, "ok", "[:, None]") if kind == "s" else MaskedLoad(access, "okc")
            _once(scope.setdefault("loaded", set()), scope["updates"], name, [Assign(name, value)])
            return name
        row = self.ops.row(op)
        self.rows_used.add(row.expr)
        if kind == "s":
            if name not in self.scalars:
                self.scalars[name] = Assign(name, Read(block_access(self.ir, tensor, row, op, blk, m, int(chan),
                                                                    self.native), "[:, None]"))
        else:
            key, lines = tile_load(self.ir, tensor, row, op, blk, m, self.native, name[: -len(f"_{m}")], col)
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
            block_c = min(pow2(mul), t.block_c)
            direct = {"loads": {}, "accs": [], "updates": [], "stores": []}
            reductions: dict[tuple[int, int], dict] = {}
            for p in paths:
                self._emit(p, block_c, direct, reductions)

            def scope(s: dict) -> dict:
                return dict(s, loads=print_stmts(_sorted_stmts(s["loads"])),
                            **{k: print_stmts(s[k]) for k in ("accs", "updates", "stores")})

            groups.append(
                {
                    "mul": mul,
                    "block_c": block_c,
                    "direct": scope(direct) if direct["updates"] or direct["loads"] else None,
                    "reductions": [scope(r) for r in reductions.values()],
                }
            )
        params = [self.ops.tensor(op) for op in ("x1", "x2", "g") if self.params[op]] + [self.ops.tensor("gw")]
        detail = f"paths {ranges([p.index for p in self.paths])}" + (
            f"; sums over {rows} batch rows per program." if self.shared else ".")
        return {
            "name": f"{self.prefix}_bwd_w_{index}",
            "kind": "wsum" if self.shared else "weight",
            "family": "bwd_w",
            "detail": detail,
            "doc": f"{_DOC['bwd_w']}: {detail}",
            "params": params,
            "batch_param": params[0],
            "out_param": self.ops.tensor("gw"),
            "rows_used": frozenset(self.rows_used),
            "shared": self.shared,
            "rows": rows,
            "block_b": block_b(t, self.elems_3d),
            "config": config(t),
            "triton_options": "",
            "num_warps": t.num_warps,
            "num_stages": t.num_stages,
            "scalars": print_stmts(_sorted_stmts(self.scalars)),
            "channel_groups": groups,
            "grid_c": grid_c(t, groups, partial_sums=self.shared),
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
        comment = path_comment(ir, p)
        if l1 != lg and l2 != lg:  # uvw: outer product over (r, c) per unrolled channel
            over_1 = b1.mul >= b2.mul
            red_mul = b1.mul if over_1 else b2.mul
            block_r = min(pow2(red_mul), t.block_r)
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
                    red["updates"].append(Assign(f"o{kk}", sum_expr(terms)))
                    # g's channel tile does not depend on tile_r: per-row weights load it in
                    # the channel loop (once, and under the same name as the direct paths);
                    # shared weights reload it in the reduction loop's own row sub-tiles.
                    gk = self._load(red if self.shared else direct, "g", io, kk, "", "c")
                    parts.append(f"o{kk}[:, :, None] * {gk}[:, None, :]")
                self._finish(red, p, wl, index, parts, "[tile_r, tile_c]")
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
                direct["updates"].append(Assign(f"q{kk}", sum_expr(terms)))
                parts.append(f"q{kk} * {self._load(direct, 'g', io, kk, '', 'c')}")
            self._finish(direct, p, wl, index, parts, "[tile_c]")

    def _finish(self, scope: dict, p: PathIR, wl: str, index: dict, parts: list[str], shape: str) -> None:
        gw = self.ops.tensor("gw")
        row = Row("tile_p.id") if self.shared else self.ops.row("w")
        target = _weight_access(self.ir, gw, row, p, index)
        expr = wrap([parts[0]] + [f"+ {x}" for x in parts[1:]])
        if self.shared:
            acc = f"acc{p.index}_{'_'.join(index[letter] for letter in wl if not index[letter].startswith('tile'))}".rstrip("_")
            scope["accs"].append(Assign(acc, Zeros(shape, gw)))
            scope["updates"].append(Assign(acc, f"{acc} + {expr}.sum(0)"))
            scope["stores"].append(Store(target, acc))
        else:
            scope["updates"].append(Store(target, expr))


def _weight_family(ir: TensorProductIR, tuning: Tuning, native: bool, ops: Operands, prefix: str) -> list[dict]:
    weighted = [p for p in ir.paths if p.has_weight and p.nonzeros]
    costs = [len(p.nonzeros) * _unroll(ir, p, "w") for p in weighted]
    rows = wsum_rows(ir, tuning)
    return [
        _WeightKernel(ir, [weighted[i] for i in idx], tuning, native, ops, prefix).context(n, rows)
        for n, idx in enumerate(split_costs(costs, tuning))
    ]


def kernel_context(
    ir: TensorProductIR,
    tuning: TuningTable = DEFAULT_TUNING,
    native: bool = False,
    op_of: Callable[[str], str] = lambda family: family.removesuffix("_lin"),
    operands: Callable[[str], Operands] = lambda family: TP_OPERANDS,
    prefix: str = "tp",
    families: tuple[str, ...] | None = None,
) -> dict[str, list[dict]]:
    """Context of every kernel of ``ir``, per family (``fwd``, ``bwd_x1``, ``bwd_x2``, ``bwd_w``,
    and ``*_lin`` when some path is unweighted).

    ``native``: a ``mul_ir`` spec's blocks are read and written in ``mul_ir`` order
    (``native_load`` / ``native_store``); otherwise every operand is ``ir_mul`` rows. A
    family's kernels take ``tuning_of(tuning, op_of(family))`` (the ``*_lin`` kernels
    tune with their op) and address their operands by ``operands(family)`` (the
    convolution's gather and scatter, ``conv``); kernels are named ``<prefix>_<family>_<n>``.
    ``families``: only these (default: all).
    """
    native = native and ir.layout == "mul_ir"
    out = {}
    for family, out_op, args in FAMILIES + (LINEAR_FAMILIES if has_unweighted(ir) else ()):
        if families is not None and family not in families:
            continue
        t = tuning_of(tuning, op_of(family))
        if family == "bwd_w":
            out[family] = _weight_family(ir, t, native, operands(family), prefix)
        else:
            out[family] = _block_family(ir, family, out_op, tuple(a for a in args if a != "w"), t, native,
                                        operands(family), prefix)
    return out
