"""The Pallas kernel builder: one kernel body per kind and run of output blocks, as statements.

Four kernels, one four-linear form. A tensor product is the derivative of
``F(x1, x2, W, g) = sum_z sum_paths W C x1 x2 g`` (``eqdsl.reference.SUBSCRIPTS``);
the generated kernels are its four partial derivatives, each from the same IR in the
same straight-line style (every CG nonzero one multiply-add with its literal
coefficient, transposed as needed)::

    forward      (x1, x2, W) = dF/dg    (batch, out)
    backward_x1  (g, x2, W)  = dF/dx1   (batch, in1)
    backward_x2  (x1, g, W)  = dF/dx2   (batch, in2)
    backward_w   (x1, x2, g) = dF/dW    (batch, weights), or summed over the batch
                                         (per-program partial sums) when shared

Unweighted paths. With unweighted paths ``F = F_w(x1, x2, W, g) + F_u(x1, x2, g)`` is
affine, not linear, in ``W``, so the VJP of ``backward_w`` (which is ``dF_w/dW``) needs the
derivatives of ``F_w`` alone: for such specs the forward and the two input backwards
are also generated over the weighted paths only (``forward_weighted``,
``backward_x1_weighted``, ``backward_x2_weighted``; ``eqdsl.analysis.mixed_weighting``);
otherwise those are the same functions as the full ones.

Vectorization. In every mode the kernels vectorize over the channel of the path's
weight row (its innermost, padded axis): ``w`` for ``uvw``, ``u`` for ``uvu`` and
``uuu``, ``v`` for ``uvv``. Operands indexed by that channel are ``(block_batch, P)``
vectors, read once per kernel; operands indexed by another channel are
``(block_batch, 1)`` columns read in a ``fori_loop`` over that channel (static trip
count; no loop when the multiplicity is 1):

* an output indexed by the vector channel accumulates in registers, as the forward
  (``uvu`` forward and ``backward_x1``, ``uvv`` forward and ``backward_x2``, ``uuu``,
  ``uvw`` forward);
* an output indexed by a looped channel is a reduction over the vector channel
  (``jnp.sum(axis=1)``) written to lane ``u`` (or ``v``) of its accumulator with a
  lane mask (``uvu`` ``backward_x2``, ``uvv`` ``backward_x1``, ``uvw``
  ``backward_x1``/``backward_x2``); contractions that do not depend on the loop are
  hoisted out of it (``h`` vectors);
* ``backward_w`` stores one weight row per loop step (``uvw``: per ``(u, v)``).

Padding. Operands are zero in padded rows and channels; every kernel then produces
zeros there too (lane masks where a broadcast would not), so kernel outputs can be fed
back as operands, as the derivatives of derivatives do.

Kernels are grouped per output block (``backward_w``: per weighted path); a body
whose unrolled terms would exceed ``plan.MAX_TERMS_PER_KERNEL`` nonzeros is split into
several kernels over consecutive output blocks, each writing its own column range.

A kernel context (``KernelBuilder.build``) is a dict: ``name``, ``refs`` / ``outs``
(argument names), ``width`` (output columns), ``desc``, ``lanes``, ``groups`` (each a
``desc`` and a ``body`` of ``stmts`` statements; ``assemble`` adds the printed ``lines``),
``terms`` (CG terms) and ``narrow`` (names of its ``(rows, 1)`` operands, for
``passes.factor_kernel``).
"""

from __future__ import annotations

from ...ir import PathIR, TensorProductIR
from ...kernel_ir import Var
from .operands import Operands, PathInfo, component
from .plan import DATA, KINDS, BlockPlan, annotate_radial, kernel_refs, split
from .stmts import Add, Loop, Masked, RowSum, StoreTile, Write, Zeros, assign, cg_terms, lanesum, product, \
    sum_of

__all__ = ["KernelBuilder", "kernels", "store_block"]


def store_block(ref: str, blk: BlockPlan, col: int, values) -> list:
    """Statements writing the ``dim`` component tiles ``values`` of block ``blk`` at column
    ``col`` of ``ref``: whole (``rt.store_tile``) for a ``tile`` block, else per component."""
    if blk.tile:
        return [StoreTile(ref, col, tuple(values), blk.mul, blk.dim, blk.pad)]
    return [Write(ref, col + m * blk.mul, v, blk.mul, blk.pad, 1) for m, v in enumerate(values)]


class KernelBuilder:
    """Builds the context of one kernel of one kind (``plan.KINDS``) over a run of output
    groups (output blocks, or weighted paths for ``bwd_w``); ``radial``: None, or ``H`` for
    the ``conv_radial`` variant, whose weights are formed on chip from the radial features
    and the radial weight (``operands.Operands.wload``)."""

    def __init__(self, kind: str, ir: TensorProductIR, blocks: dict, wmap: dict, number: int, groups: list[int],
                 prefix: str = "tp", radial: int | None = None):
        self.kind, self.prefix, self.radial = kind, prefix, radial
        self.refs, self.target, weighted_only = next((r, t, wo) for k, r, t, wo in KINDS if k == kind)
        # where the kernel writes: at its columns of the full output row, which every kernel of the
        # set shares (``absolute_columns``), or from column 0 of its own piece (shared-weight
        # gradients: one partial-sum row per program and kernel)
        self.absolute = absolute_columns(kind, ir)
        self.ir, self.blocks, self.wmap = ir, blocks, wmap
        self.ops = Operands(ir, blocks, wmap, radial)
        self.paths = [p for p in ir.paths if p.has_weight or not weighted_only]
        self.number = number
        self.group_ids = groups

    def path_into_acc(self, p: PathIR, top: list) -> None:
        """Add path ``p``'s contribution to the accumulators of the target operand's block."""
        info = self.ops.info(p)
        if info.ch[self.target] == info.c:
            self._vector_target(p, info, top)
        else:
            self._column_target(p, info, top)

    def _vector_target(self, p: PathIR, info: PathInfo, top: list) -> None:
        """Target indexed by the vector channel: accumulate in registers (the forward's structure)."""
        ops, X, blkX = self.ops, self.target, info.blk[self.target]
        others = [op for op in DATA if op != X]
        loop, env, prelude = ops.flat_loop(info)
        body: list = list(prelude)
        names = ops.names(p, info, others, env, top, body)
        scale = None
        if p.has_weight:
            body.append(ops.wload(p, info, env, top))
            scale = "w"
        accs = ops.accs(blkX)
        for m in range(blkX.dim):
            nz = [n for n in p.nonzeros if component(n, X) == m]
            if nz:
                terms = cg_terms(nz, lambda n: [names[o][component(n, o)] for o in others])
                body.append(assign(accs[m], sum_of(terms, accs[m], scale)))
        top.append(ops.desc(p, info))
        if loop is None:
            top.extend(body)
        else:
            top.append(Loop(f"_path_{p.index}", loop["var"], loop["count"], tuple(accs), tuple(body)))

    def _column_target(self, p: PathIR, info: PathInfo, top: list) -> None:
        """Target indexed by a looped channel: reduce over the vector lanes, write lane ``u``/``v``."""
        ops, X, blkX = self.ops, self.target, info.blk[self.target]
        padX = blkX.pad
        others = [op for op in DATA if op != X]
        var = info.ch[X]
        cnt = info.count[var]
        accs = ops.accs(blkX)
        vecs = [op for op in others if info.ch[op] == info.c]
        top.append(ops.desc(p, info))
        if len(vecs) == 2:  # uvu backward_x2, uvv backward_x1
            names = ops.names(p, info, vecs, {}, top, [])
            hs = {}
            for m in range(blkX.dim):
                nz = [n for n in p.nonzeros if component(n, X) == m]
                if nz:
                    hs[m] = f"h{p.index}_{m}"
                    top.append(assign(hs[m], sum_of(cg_terms(nz, lambda n: [names[o][component(n, o)] for o in vecs]))))
            body: list = []
            if p.has_weight:
                body.append(ops.wload(p, info, {var: var} if cnt > 1 else {}, top))
            for m, h in hs.items():
                s = lanesum(product("w", h) if p.has_weight else Var(h), info.cpad)
                if cnt > 1 and p.has_weight:
                    s = Masked(ops.lane(padX), "==", var, s)
                elif cnt != padX:
                    s = Masked(ops.lane(padX), "<", cnt, s)
                body.append(assign(accs[m], Add(Var(accs[m]), s)))
            if cnt > 1 and p.has_weight:
                top.append(Loop(f"_path_{p.index}", var, cnt, tuple(accs), tuple(body)))
            else:
                top.extend(body)
            return
        # uvw backward_x1 / backward_x2: outer loop over the target's channel, inner over the other
        other_var = "v" if var == "u" else "u"
        ocnt = info.count[other_var]
        env = {v: v for v in ("u", "v") if info.count[v] > 1}
        inner: list = []
        names = ops.names(p, info, others, env, top, inner)
        gop = vecs[0]  # the output gradient, a vector over w
        ks = sorted({component(n, gop) for n in p.nonzeros})
        inner.append(ops.wload(p, info, env, top))
        for k in ks:
            inner.append(assign(f"s_{k}", lanesum(product("w", names[gop][k]), info.cpad)))
        colop = next(op for op in others if op != gop)
        cols = {}
        for m in range(blkX.dim):
            nz = [n for n in p.nonzeros if component(n, X) == m]
            if nz:
                cols[m] = f"c_{m}"
                terms = cg_terms(nz, lambda n: [names[colop][component(n, colop)], f"s_{component(n, gop)}"])
                inner.append(assign(cols[m], sum_of(terms, cols[m])))
        outer: list = [assign(c, Zeros(1)) for c in cols.values()]
        if ocnt > 1:
            outer.append(Loop(f"_path_{p.index}_{other_var}", other_var, ocnt, tuple(cols.values()), tuple(inner)))
        else:
            outer.extend(inner)
        for m, c in cols.items():
            v = Masked(ops.lane(padX), "==", var, Var(c)) if cnt > 1 else Var(c)
            outer.append(assign(accs[m], Add(Var(accs[m]), v)))
        if cnt > 1:
            top.append(Loop(f"_path_{p.index}", var, cnt, tuple(accs), tuple(outer)))
        else:
            top.extend(outer)

    def weight_rows(self, p: PathIR, top: list, col0: int) -> None:
        """``backward_w`` of one weighted path: one row over the vector channel per loop step."""
        ops = self.ops
        info = ops.info(p)
        w = self.wmap[p.index]
        base = w.offset - col0
        vecs = [op for op in DATA if info.ch[op] == info.c]
        cols = [op for op in DATA if op not in vecs]
        top.append(ops.desc(p, info))

        def reduce(body: list) -> None:  # shared weights: the rows' sum, per program
            if self.ir.shared_weights:
                body.append(assign("r", RowSum(Var("r"))))

        if not cols:  # uuu
            names = ops.names(p, info, vecs, {}, top, [])
            top.append(assign("r", sum_of(cg_terms(p.nonzeros, lambda n: [names[o][component(n, o)] for o in vecs]))))
            reduce(top)
            top.append(Write("out_ref", base, Var("r"), w.count, w.pad, w.stride))
            return
        loop, env, prelude = ops.flat_loop(info)
        body: list = list(prelude)
        if len(vecs) == 2:  # uvu / uvv: contract the two vectors first, per component of the column operand
            (cop,) = cols
            vnames = ops.names(p, info, vecs, {}, top, [])
            cnames = ops.names(p, info, cols, env, top, body)
            prods = []
            for m in range(info.blk[cop].dim):
                nz = [n for n in p.nonzeros if component(n, cop) == m]
                if nz:
                    h = f"h{p.index}_{m}"
                    top.append(assign(h, sum_of(cg_terms(nz, lambda n: [vnames[o][component(n, o)] for o in vecs]))))
                    prods.append(product(h, cnames[cop][m]))
        else:  # uvw: contract the two columns first, per component of the output gradient
            (gop,) = vecs
            names = ops.names(p, info, DATA, env, top, body)
            prods = []
            for k in range(info.blk[gop].dim):
                nz = [n for n in p.nonzeros if component(n, gop) == k]
                if nz:
                    terms = cg_terms(nz, lambda n: [names[o][component(n, o)] for o in cols])
                    body.append(assign(f"q_{k}", sum_of(terms)))
                    prods.append(product(f"q_{k}", names[gop][k]))
        body.append(assign("r", sum_of(prods)))
        reduce(body)
        body.append(Write("out_ref", ops.wstart(p, info, env, base), Var("r"), w.count, w.pad, w.stride))
        if loop is None:
            top.extend(body)
        else:
            top.append(Loop(f"_path_{p.index}", loop["var"], loop["count"], (), tuple(body)))

    def build(self) -> dict:
        """The kernel context (module docstring)."""
        groups, col = [], 0
        terms = 0
        if self.target == "w":
            base = 0 if self.absolute else self.wmap[self.group_ids[0]].offset
            for pi in self.group_ids:
                p = self.ir.paths[pi]
                top: list = []
                self.weight_rows(p, top, base)
                groups.append({"desc": f"weights of path {pi} ({self.wmap[pi].numel} columns)", "body": top})
                col += self.wmap[pi].numel
                terms += len(p.nonzeros)
            desc = f"Weighted paths {', '.join(map(str, self.group_ids))}"
        else:
            op = self.target
            for b in self.group_ids:
                blk = self.blocks[op][b]
                paths = [p for p in self.paths if {"g": p.i_out, "x1": p.i_in1, "x2": p.i_in2}[op] == b]
                accs = self.ops.accs(blk)
                top = [assign(a, Zeros(blk.pad)) for a in accs]
                for p in paths:
                    self.path_into_acc(p, top)
                top += store_block("out_ref", blk, blk.offset if self.absolute else col, [Var(a) for a in accs])
                col += blk.dim * blk.mul
                terms += sum(len(p.nonzeros) for p in paths)
                name = {"g": "out", "x1": "x1", "x2": "x2"}[op]
                groups.append({"desc": f"{name} block {b} ({blk.desc}): {len(paths)} path(s)", "body": top})
            what = {"g": "Output", "x1": "x1", "x2": "x2"}[op]
            desc = f"{what} blocks {', '.join(map(str, self.group_ids))}"
        if not self.absolute:
            col0 = 0
        elif self.target == "w":
            col0 = self.wmap[self.group_ids[0]].offset
        else:
            col0 = self.blocks[self.target][self.group_ids[0]].offset
        return {
            "kind": self.kind,
            "number": self.number,
            "name": f"_{self.prefix}_{self.kind}_kernel_{self.number}",
            "refs": kernel_refs(self.refs, self.radial),
            "outs": ["out_ref"],
            "col0": col0,
            "width": col,
            "desc": f"{desc} ({col} columns); {terms} CG terms.",
            "lanes": [{"name": f"lane_{p}", "pad": p} for p in sorted(self.ops.lanes)],
            "groups": groups,
            "terms": terms,
            "narrow": sorted(self.ops.narrow),
        }


def absolute_columns(kind: str, ir: TensorProductIR) -> bool:
    """Whether the kernels of ``kind`` write their columns at their place in the full output
    row: every set but a shared-weight ``bwd_w`` (whose programs each write one partial-sum row
    of their kernel's columns, ``launch_weight_sum``). The launcher then gives every kernel of
    the set the same output buffer (``input_output_aliases``), so no concatenation pass joins
    the kernels' pieces (``eqdsl.runtime.jax.launch``)."""
    target = next(t for k, _, t, _ in KINDS if k == kind)
    return not (target == "w" and ir.shared_weights)


def kernels(kind: str, ir: TensorProductIR, blocks: dict, wmap: dict, max_terms: int | None = None,
            prefix: str = "tp", radial: int | None = None, max_cols: int | None = None) -> list[dict]:
    """Kernel contexts of ``kind`` (``plan.KINDS``), output groups split over kernels within
    ``max_terms`` CG terms each (``plan.split``); ``[]`` when no path contributes (the
    launcher returns zeros). ``radial``: ``KernelBuilder``'s; ``max_cols``: a radial kernel
    forming more dot columns than this (``plan.annotate_radial``, the shared memory its dots
    hold, ``plan.radial_max_cols``) is split again, halving its output groups, down to one
    group per kernel."""
    _, _, op, weighted_only = next(k for k in KINDS if k[0] == kind)
    paths = [p for p in ir.paths if p.has_weight or not weighted_only]
    if not paths:
        return []
    if op == "w":
        ids = list(wmap)
        runs = split([len(ir.paths[i].nonzeros) for i in ids], max_terms)
        runs = [[ids[i] for i in run] for run in runs]
    else:
        key = {"g": "i_out", "x1": "i_in1", "x2": "i_in2"}[op]
        costs = [sum(len(p.nonzeros) for p in paths if getattr(p, key) == b.index) for b in blocks[op]]
        runs = split(costs, max_terms)
        if radial is not None and max_cols is not None:
            def fits(run):
                return annotate_radial(KernelBuilder(kind, ir, blocks, wmap, 0, run, prefix, radial).build()) <= max_cols

            def refine(run):
                if len(run) <= 1 or fits(run):
                    return [run]
                halves = split([costs[i] for i in run], -(-sum(costs[i] for i in run) // 2))
                if len(halves) < 2:
                    halves = [list(range(len(run) // 2)), list(range(len(run) // 2, len(run)))]
                return [r for h in halves for r in refine([run[i] for i in h])]

            runs = [r for run in runs for r in refine(run)]
    return [KernelBuilder(kind, ir, blocks, wmap, n, run, prefix, radial).build() for n, run in enumerate(runs)]
