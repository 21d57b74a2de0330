"""Fused Pallas backward of a channelwise tensor product: ``dF/dx1``, ``dF/dx2``, ``dF/dW`` in one pass.

``g``, the output cotangent, is by far the largest operand of a channelwise product,
and the three backward kernels of ``kernels`` read it three times; the per-row weights are
the largest of a fully connected (``uvw``) one, and two of them read those.
Eligibility is ``fused_reason`` (``eqdsl.analysis.fused_bwd_reason`` with ``FUSED_MODES``:
per-batch weights, every path ``uvu`` or every path ``uvw``, weighted, every ``x2`` block
of a path one channel) and at least one path. A ``uvw`` product's kernel loops over each
``x1`` block's channel ``u``, reading each weight row ``W[u, :]`` once and storing its
gradient in the same step (``FusedBuilder._block_uvw``; measured, H200, 2026-11-28, float32,
20,000 rows, with ``pallas_unroll``: e3tools_conv's 919 µs against 1,339 for the three
kernels, diffdock_l2's 852 against 1,526). The rest of this docstring is the ``uvu`` kernel:
for path ``p`` (``x1`` block ``a``, ``x2`` block ``s``, output block ``o``, channel
``u``, the vectorized channel of ``kernels``)::

    gx1[b, a, u, i] += sum_{j,k} C[i,j,k] W[b, p, u] x2[b, s, j] g[b, o, u, k]
    gW[b, p, u]      = sum_{i,j,k} C[i,j,k] x1[b, a, u, i] x2[b, s, j] g[b, o, u, k]
    gx2[b, s, j]    += sum_{u,i,k} C[i,j,k] W[b, p, u] x1[b, a, u, i] g[b, o, u, k]

(the partial derivatives of ``F = sum W C x1 x2 g``, ``eqdsl.reference.SUBSCRIPTS``
``uvu`` with ``v`` of one value). With one ``x2`` channel nothing is looped: every
operand is a ``(block_batch, P)`` vector over ``u`` (``x1``, ``g``, the weight row) or
a ``(block_batch, 1)`` column (``x2``). Kernel body, straight-line, per batch block::

    per x1 block a of the kernel:
        acc_a_i = 0                                    # gx1, in registers
        per path p out of a:
            <x1, x2, g operands: each read once per kernel>
            w = W row of p                             # the weight row read once
            q_j = sum_{i,k} C x1_i g_k                 # per x2 component j, shared:
            r = sum_j x2_j q_j;  gw_ref[p] = r         #   the gW row
            px2_s_j_P += w q_j                         #   gx2 lanes, summed over paths
            acc_a_i += w sum_{j,k} C x2_j g_k
        gx1_ref[a] = acc_a_*
    gx2_ref[s, j] = sum_P jnp.sum(px2_s_j_P, axis=1)  # one lane reduction per column and width

Padded lanes (``u >= mul``) are zero in every operand, so the lane sums need no mask.
With ``pallas_factor = 1`` (the body above) the sums are written so that few operations
fall on ``(block_batch, P)`` tiles: ``q_j`` serves two gradients, and ``x2``, a column,
multiplies sums rather than terms; each sum is then factored further (``passes.factor_kernel``).
Otherwise each gradient is written one term per CG nonzero (``fused_context``).
A kernel owns whole ``x1`` blocks (``gx1`` needs every path of its block) and the
paths out of them; ``x1`` blocks are split over kernels (consecutive runs,
``plan.split``) when the body would exceed ``plan.MAX_TERMS_PER_KERNEL`` terms
(the conv's: ``pallas_conv_max_terms``), counting three per CG nonzero (one per
gradient). Every kernel then writes the full ``gx2`` row as its own partial sum and the
launcher adds them up in kernel order (``eqdsl.runtime.jax.launch.launch_fused``: deterministic, no
atomics). Each kernel writes its ``gx1`` blocks' columns and its paths' weight columns at their
places in rows all kernels share (e3nn's weight order), so nothing joins or reorders the
kernels' outputs afterwards.

The conv may also split one ``x1`` block's paths over kernels (``split_blocks``, spec key
``pallas_conv_fused_max_terms``): a block too large for one program's registers (ncu,
mace_large: 252-255 registers and 12% occupancy for its ``1o`` and ``2e`` blocks, H100,
2026-11-25). Each part then writes a partial ``gx1`` message of the whole block, and
``gx1_segments`` says which concatenated columns add up to each block (after the conv's
segment sum, on node rows). For mace_large the extra messages cost more than the
registers saved: bulk Si fwd+bwd 5,264 us whole, 5,724 with ``2e`` in two parts, 6,303
with ``1o`` in two and ``2e`` in three (H100, 2026-11-25); no example spec sets it.

``conv_radial`` (spec key ``radial_features``) gets the same kernels with operands
``x1, x2, rf, wr, g``: each path's weight row is formed on chip from the edges' radial
features and the radial weight (``radial``, ``operands.Operands.wload``); ``gW`` is written as
here (it never reads the weights), and the radial gradients are matmuls of it
(``eqdsl.runtime.jax.autodiff.RadialVJP``).

Everything is decided here, as statements (``stmts``); ``printer`` writes them.
"""

from __future__ import annotations

from ...analysis import fused_bwd_reason
from ...ir import PathIR, TensorProductIR
from ...kernel_ir import Term, Var
from . import plan
from .kernels import store_block
from .operands import Operands
from .plan import BlockPlan
from .stmts import Loop, Offset, Write, Zeros, assign, cg_terms, lanesum, product, sum_of

__all__ = ["FUSED_MODES", "fused_reason", "fused_context", "FusedBuilder"]


# The path modes the fused kernel implements (``eqdsl.analysis.fused_bwd_reason``'s ``modes``).
FUSED_MODES = frozenset({"uvu", "uvw"})


def fused_reason(ir: TensorProductIR) -> str | None:
    """Why ``ir`` gets no fused Pallas backward, or None when it does.

    ``eqdsl.analysis.fused_bwd_reason`` with ``FUSED_MODES``, at least one path, and one mode
    for every path: a ``uvu`` block keeps its ``dF/dx1`` as ``(rows, P)`` accumulators, a
    ``uvw`` block writes it one channel column per loop step, and one ``x1`` block cannot do
    both."""
    if not ir.paths:
        return "no paths"
    why = fused_bwd_reason(ir, FUSED_MODES)
    if why is None and len({p.mode for p in ir.paths}) > 1:
        return "paths of both modes uvu and uvw (the fused kernel takes one)"
    return why


class FusedBuilder:
    """One fused kernel over a run of units, each an ``x1`` block and the paths out of it
    that the kernel owns (all of them unless the block is split); operand reads through
    ``operands.Operands``."""

    def __init__(self, ir: TensorProductIR, blocks: dict, wmap: dict, number: int,
                 units: list[tuple[int, list[int]]], prefix: str = "tp", factored: bool = False,
                 radial: int | None = None, gx1_absolute: bool = True):
        self.factored, self.radial = factored, radial
        # gx1 columns at the x1 blocks' own columns of the shared row (whole blocks), or from
        # column 0 of the kernel's piece (a split block: partial rows, summed by the launcher)
        self.gx1_absolute = gx1_absolute
        self.kind = "bwd_fused"
        self.ir, self.blocks, self.wmap = ir, blocks, wmap
        self.ops = Operands(ir, blocks, wmap, radial)
        self.number, self.prefix = number, prefix
        self.units = units  # (x1 block, the paths out of it that this kernel owns)
        self.group_ids = [a for a, _ in units]
        self._gw_col: dict[int, int] = {}

    def _path(self, p: PathIR, top: list, accs: list[str], px2: dict) -> None:
        ops = self.ops
        info = ops.info(p)
        blk = info.blk

        def operand(op: str, m: int) -> str:
            return ops.vec(op, blk[op], m, top)

        top.append(ops.desc(p, info))
        nz = p.nonzeros
        w = self.wmap[p.index]
        if not nz:  # no CG term: a zero weight gradient, nothing else
            top.append(Write("gw_ref", self._gw_col[p.index], Zeros(w.pad), w.count, w.pad, w.stride))
            return
        # the operands first, so that the sums below only name them
        x1 = {i: operand("x1", i) for i in sorted({n.i for n in nz})}
        x2 = {j: operand("x2", j) for j in sorted({n.j for n in nz})}
        g = {k: operand("g", k) for k in sorted({n.k for n in nz})}
        top.append(ops.wload(p, info, {}, top))
        if self.factored:
            # q_j = sum_{i,k} C x1_i g_k: a wide tile per x2 component, shared by dF/dW and dF/dx2
            for j in x2:
                top.append(assign(f"q_{j}", sum_of(cg_terms([n for n in nz if n.j == j], lambda n: [x1[n.i], g[n.k]]))))
            top.append(assign("r", sum_of([product(x2[j], f"q_{j}") for j in x2])))
            scale = "w"  # dF/dx1 and dF/dx2 are sums times the weight row
            gx1 = {i: cg_terms([n for n in nz if n.i == i], lambda n: [x2[n.j], g[n.k]]) for i in x1}
            gx2 = {j: (product(f"q_{j}"),) for j in x2}
        else:  # one term per CG nonzero and gradient
            for k, name in g.items():
                top.append(assign(f"wg_{k}", product("w", name)))
            top.append(assign("r", sum_of(cg_terms(nz, lambda n: [x1[n.i], x2[n.j], g[n.k]]))))
            scale = None
            gx1 = {i: cg_terms([n for n in nz if n.i == i], lambda n: [x2[n.j], f"wg_{n.k}"]) for i in x1}
            gx2 = {j: cg_terms([n for n in nz if n.j == j], lambda n: [x1[n.i], f"wg_{n.k}"]) for j in x2}
        top.append(Write("gw_ref", self._gw_col[p.index], Var("r"), w.count, w.pad, w.stride))
        for i, terms in gx1.items():
            top.append(assign(accs[i], sum_of(terms, accs[i], scale)))
        for j, terms in gx2.items():
            key = (p.i_in2, j, info.cpad)
            if key in px2:
                top.append(assign(px2[key], sum_of(terms, px2[key], scale)))
            else:  # the first path into this gx2 lane sets it
                px2[key] = f"px2_{p.i_in2}_{j}_{info.cpad}"
                head = (Var(scale),) if scale else ()
                top.append(assign(px2[key], sum_of(Term(t.coeff, head + t.factors) for t in terms)))

    def _block_uvw(self, blk: BlockPlan, paths: list[PathIR], top: list, px2: dict, base: int) -> None:
        """``x1`` block ``blk`` and its ``uvw`` paths: one loop over the block's channel ``u``.

        Per step the ``x1`` columns of channel ``u`` are read once for all the paths, and per
        path its weight row ``W[u, :]`` (a vector over ``w``) once. A path reduces the weight row
        over ``w`` (a lane sum, the costly operation: Triton's reductions and the layout
        conversions of their ``(rows, 1)`` results) once per output component ``k``
        (``g_side``) or, when it has fewer ``x1`` components ``i`` than ``k``, once per ``i``
        (``x1_side``). Every value but ``g``, the weight rows, their gradients and ``x1_side``'s
        ``G_i``, ``T_i`` is a ``(rows, 1)`` column (``x2`` has one channel). The ``c_i`` columns
        (``dF/dx1`` of channel ``u``, summed over the block's paths) are stored in the step at
        channel ``u`` of the block (``base``: its first ``gx1`` column)."""
        ops = self.ops
        count = blk.mul
        env = {"u": "u"} if count > 1 else {}
        body: list = []
        after: list = []  # statements after the loop: x1_side's dF/dx2
        x1 = [ops.col("x1", blk, m, "u", count, top, body) for m in range(blk.dim)]
        cx1: dict[int, str] = {}  # the dF/dx1 columns of this step, set by the first path into each
        carry: list[str] = []
        for p in paths:
            info = ops.info(p)
            w = self.wmap[p.index]
            body.append(ops.desc(p, info))
            body.append(ops.wload(p, info, env, top))
            start = ops.wstart(p, info, env)
            nz = p.nonzeros
            if not nz:  # no CG term: a zero weight gradient, nothing else
                body.append(Write("gw_ref", start, Zeros(w.pad), w.count, w.pad, w.stride))
                continue
            g = {k: ops.vec("g", info.blk["g"], k, top) for k in sorted({n.k for n in nz})}
            x2 = {j: ops.vec("x2", info.blk["x2"], j, top) for j in sorted({n.j for n in nz})}
            keys = {j: (p.i_in2, j, 1) for j in x2}
            for key in keys.values():
                if key not in px2:  # set before the first loop or statement that adds to it
                    px2[key] = f"px2_{key[0]}_{key[1]}"
                    top.append(assign(px2[key], Zeros(1)))
                    ops.narrow.add(px2[key])
            ins = sorted({n.i for n in nz})
            if len(ins) < len(g):
                terms = self._x1_side(p, info, nz, x1, x2, g, top, body, after, carry, keys, px2)
            else:
                terms = self._g_side(p, info, nz, x1, x2, g, body, carry, keys, px2)
            body.append(Write("gw_ref", start, Var("r"), w.count, w.pad, w.stride))
            for i in ins:
                body.append(assign(f"cx1_{i}", sum_of(terms[i], cx1.get(i))))
                cx1[i] = f"cx1_{i}"
                ops.narrow.add(cx1[i])
        for m in range(blk.dim):
            start = (Offset(base + m, "u", blk.dim) if blk.tile else Offset(base + m * blk.mul, "u", 1)) \
                if count > 1 else Offset(base + m * blk.mul)
            body.append(Write("gx1_ref", start, Var(cx1[m]) if m in cx1 else Zeros(1), 1, 1, 1))
        if count > 1:
            top.append(Loop(f"_block_{blk.index}", "u", count, tuple(carry), tuple(body)))
        else:
            top.extend(body)
        top.extend(after)

    def _g_side(self, p, info, nz, x1, x2, g, body, carry, keys, px2) -> dict:
        """One lane sum per output component ``k``, shared by ``dF/dx1`` and ``dF/dx2``::

            s_k    = sum_w W[u, w] g_k[w]
            gW[u]  = r = sum_k (sum_{i,j} C x1_i x2_j) g_k
            c_i   += sum_{j,k} C x2_j s_k
            px2_j += sum_{i,k} C x1_i s_k               # carried through the loop

        Returns the ``c_i`` terms per ``i``."""
        for k, name in g.items():
            body.append(assign(f"s_{k}", lanesum(product("w", name), info.cpad)))
            body.append(assign(f"q_{k}", sum_of(cg_terms([n for n in nz if n.k == k], lambda n: [x1[n.i], x2[n.j]]))))
            self.ops.narrow.update((f"s_{k}", f"q_{k}"))
        body.append(assign("r", sum_of([product(f"q_{k}", name) for k, name in g.items()])))
        for j, key in keys.items():
            if px2[key] not in carry:
                carry.append(px2[key])
            body.append(assign(px2[key], sum_of(cg_terms([n for n in nz if n.j == j], lambda n: [x1[n.i], f"s_{n.k}"]),
                                                px2[key])))
        return {i: cg_terms([n for n in nz if n.i == i], lambda n: [x2[n.j], f"s_{n.k}"]) for i in {n.i for n in nz}}

    def _x1_side(self, p, info, nz, x1, x2, g, top, body, after, carry, keys, px2) -> dict:
        """One lane sum per ``x1`` component ``i``, with ``G_i = sum_{j,k} C x2_j g_k`` (a vector
        over ``w``, formed once before the loop)::

            gW[u]  = r = sum_i x1_i G_i
            c_i   += sum_w W[u, w] G_i[w]
            T_i   += x1_i W[u]                           # a vector over w, carried
            after the loop: px2_j += sum_{i,k} C sum_w T_i[w] g_k[w]

        Returns the ``c_i`` terms per ``i``."""
        ops, pi = self.ops, p.index
        ins = sorted({n.i for n in nz})
        gi = {i: f"G{pi}_{i}" for i in ins}
        ti = {i: f"T{pi}_{i}" for i in ins}
        for i in ins:
            top.append(assign(gi[i], sum_of(cg_terms([n for n in nz if n.i == i], lambda n: [x2[n.j], g[n.k]]))))
            top.append(assign(ti[i], Zeros(info.cpad)))
            carry.append(ti[i])
        body.append(assign("r", sum_of([product(x1[i], gi[i]) for i in ins])))
        terms = {}
        for i in ins:
            body.append(assign(f"t_{i}", lanesum(product("w", gi[i]), info.cpad)))
            ops.narrow.add(f"t_{i}")
            terms[i] = (product(f"t_{i}"),)
            body.append(assign(ti[i], sum_of([product(x1[i], "w")], ti[i])))
        pairs = sorted({(n.i, n.k) for n in nz})
        for i, k in pairs:
            after.append(assign(f"h{pi}_{i}_{k}", lanesum(product(ti[i], g[k]), info.cpad)))
            ops.narrow.add(f"h{pi}_{i}_{k}")
        for j, key in keys.items():
            after.append(assign(px2[key], sum_of(cg_terms([n for n in nz if n.j == j], lambda n: [f"h{pi}_{n.i}_{n.k}"]),
                                                 px2[key])))
        return terms

    def build(self) -> dict:
        """The kernel context (as ``kernels.KernelBuilder.build``, with ``gw_width``,
        ``paths`` and ``x1_blocks``)."""
        ir = self.ir
        paths = [ir.paths[i] for _, pis in self.units for i in pis]
        # each path's weight gradient at its own columns (e3nn's order) of the row every kernel shares
        self._gw_col, wcol = {}, 0
        for p in paths:
            self._gw_col[p.index] = self.wmap[p.index].offset
            wcol += self.wmap[p.index].numel
        groups: list[dict] = []
        px2: dict[tuple[int, int, int], str] = {}
        col = 0
        for a, pis in self.units:
            blk = self.blocks["x1"][a]
            mine = [ir.paths[i] for i in pis]
            base = blk.offset if self.gx1_absolute else col
            if mine and mine[0].mode == "uvw":
                top: list = []
                self._block_uvw(blk, mine, top, px2, base)
            else:
                accs = self.ops.accs(blk)
                top = [assign(acc, Zeros(blk.pad)) for acc in accs]
                for p in mine:
                    self._path(p, top, accs, px2)
                top += store_block("gx1_ref", blk, base, [Var(a) for a in accs])
            col += blk.dim * blk.mul
            groups.append({"desc": f"x1 block {a} ({blk.desc}): {len(mine)} path(s)", "body": top})
        groups.append({"desc": "dF/dx2 of this kernel's paths (the whole row: a partial sum)",
                       "body": self._gx2(px2)})
        terms = 3 * sum(len(p.nonzeros) for p in paths)
        return {
            "kind": self.kind,
            "number": self.number,
            "name": f"_{self.prefix}_bwd_fused_kernel_{self.number}",
            "refs": plan.kernel_refs(("x1", "x2", "w", "g"), self.radial),
            "outs": ["gx1_ref", "gx2_ref", "gw_ref"],
            "width": col,
            "gw_width": wcol,
            "paths": [p.index for p in paths],
            "x1_blocks": [a for a, _ in self.units],
            "desc": (f"Fused backward: x1 blocks {', '.join(map(str, self.group_ids))} ({col} gx1 columns), "
                     f"paths {', '.join(str(p.index) for p in paths)} ({wcol} weight columns), the whole gx2 "
                     f"row; {terms} CG terms (three per nonzero)."),
            "lanes": [{"name": f"lane_{q}", "pad": q} for q in sorted(self.ops.lanes)],
            "groups": groups,
            "terms": terms,
            "narrow": sorted(self.ops.narrow),
        }

    def _gx2(self, px2: dict) -> list:
        """Store every ``gx2`` column: the lane sums of its partials, zeros where none."""
        body: list = []
        for blk in self.blocks["x2"]:
            parts = [[(name, pad) for (s, j, pad), name in px2.items() if (s, j) == (blk.index, m)]
                     for m in range(blk.dim)]
            if not any(parts):
                body += store_block("gx2_ref", blk, blk.offset, [Zeros(blk.pad)] * blk.dim)
                continue
            # a path's x2 block has one channel: component m is column offset + m
            for m, names in enumerate(parts):
                if names:
                    body.append(assign(f"c_{m}", sum_of(Term(1.0, (lanesum(Var(n), pad),)) for n, pad in names)))
                else:
                    body.append(assign(f"c_{m}", Zeros(1)))
                body.append(Write("gx2_ref", blk.offset + m, Var(f"c_{m}"), 1, 1, 1))
        return body


def _units(ir: TensorProductIR, blocks: dict, max_terms: int | None, split_blocks: bool) -> list[tuple]:
    """``(x1 block, path indices, cost)`` per unit of work, in ``x1`` block order: a whole
    block and every path out of it, or with ``split_blocks`` a block over ``max_terms``
    split into consecutive runs of its paths (each run then writes a partial ``gx1``)."""
    units = []
    for b in blocks["x1"]:
        paths = [p for p in ir.paths if p.i_in1 == b.index]
        costs = [3 * len(p.nonzeros) for p in paths]
        runs = plan.split(costs, max_terms) if split_blocks and len(paths) > 1 else [list(range(len(paths)))]
        for run in runs:
            units.append((b.index, [paths[i].index for i in run], sum(costs[i] for i in run)))
    return units


def fused_context(ir: TensorProductIR, blocks: dict, wmap: dict, max_terms: int | None = None,
                  prefix: str = "tp", split_blocks: bool = False, factored: bool = False,
                  radial: int | None = None) -> dict | None:
    """Template context of the fused backward, or None when ``fused_reason(ir)`` says why not.

    ``kernels``: kernel contexts (``width``: ``gx1`` columns, ``gw_width``: weight columns).
    Every kernel writes its paths' weight gradients at their columns of the full
    ``(rows, weight_numel)`` row (e3nn's order), which all kernels share. ``gx1_segments``:
    None when every kernel also writes its ``x1`` blocks' gradient at their columns of the
    shared ``(rows, dim_in1)`` row, else (``split_blocks``: a block's paths over several
    kernels, each a partial sum) each kernel writes its own piece and, per ``x1`` block, the
    ``(start, width)`` column ranges of the pieces' concatenation whose sum is that block's
    gradient. ``factored`` (spec key
    ``pallas_factor``): the ``q_j`` form of the module docstring, else one term per nonzero
    and gradient (``wg_k = w g_k``; ``r = sum C x1_i x2_j g_k``; ``acc_i += C x2_j wg_k``;
    ``px2_j += C x1_i wg_k``). ``radial``: None, or ``H`` for the ``conv_radial`` variant
    (operands ``x1, x2, rf, wr, g``; each path's weight row formed on chip,
    ``operands.Operands.wload``).
    """
    if fused_reason(ir) is not None:
        return None
    units = _units(ir, blocks, max_terms, split_blocks)
    if split_blocks:  # greedy: a balanced split would put a block's parts back together
        budget = plan.MAX_TERMS_PER_KERNEL if max_terms is None else max_terms
        runs, total = [], budget + 1
        for i, (_, _, cost) in enumerate(units):
            if total + cost > budget:
                runs.append([])
                total = 0
            runs[-1].append(i)
            total += cost
    else:
        runs = plan.split([cost for _, _, cost in units], max_terms)
    kernels = []
    for n, run in enumerate(runs):
        merged: list[tuple[int, list[int]]] = []
        for a, pis, _ in (units[i] for i in run):
            if merged and merged[-1][0] == a:  # two runs of one block in one kernel: one sum
                merged[-1] = (a, merged[-1][1] + pis)
            else:
                merged.append((a, pis))
        kernels.append(FusedBuilder(ir, blocks, wmap, n, merged, prefix, factored, radial,
                                    gx1_absolute=not split_blocks).build())
    if not split_blocks:
        return {"kernels": kernels, "gx1_segments": None}
    ranges: dict[int, list[tuple[int, int]]] = {b.index: [] for b in blocks["x1"]}
    col = 0
    for k in kernels:
        for a in k["x1_blocks"]:
            width = blocks["x1"][a].dim * blocks["x1"][a].mul
            ranges[a].append((col, width))
            col += width
    return {"kernels": kernels, "gx1_segments": [ranges[b.index] for b in blocks["x1"]]}
