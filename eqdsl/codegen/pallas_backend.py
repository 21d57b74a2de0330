"""Pallas backend: ``TensorProductIR`` -> ``pallas_kernels.py`` + ``jax_ops.py``.

Every decision is made here, in Python; the templates only loop and substitute.

Internal ("kernel") layout. Each operand block ``mul x l`` is stored inside the kernels
as ``2l+1`` contiguous rows of ``P = next_pow2(mul)`` channels (``ir_mul`` with the
channel count padded to a power of two, zeros in the padding), so that every value a
kernel loads or stores is a ``(block_batch, P)`` or ``(block_batch, 1)`` tile: power
of two shapes, as the Triton lowering of Pallas wants, and contiguous over channels
(DESIGN.md "What layout costs"). Weights get the same treatment per path: the channel
index the kernel vectorizes over is innermost and padded to ``P``.

Modes. Accumulators are ``(block_batch, P_out)`` tiles, one per output component:

* ``uuu``: ``x1`` and ``x2`` components are both channel vectors; no loop.
* ``uvu``: ``x1`` vectors times ``x2`` columns ``(block_batch, 1)`` at channel ``v``;
  a ``fori_loop`` over ``v`` when ``mul2 > 1`` (static trip count).
* ``uvv``: mirror image of ``uvu`` (loop over ``u``).
* ``uvw``: columns of both inputs, times a weight row over ``w``; one ``fori_loop``
  over ``(u, v)`` when ``mul1 * mul2 > 1``.

Every CG nonzero is one multiply-add with its coefficient as a literal (``repr``).
Output blocks are grouped into kernels (paths grouped by ``i_out``); a spec whose
unrolled body would exceed ``MAX_TERMS_PER_KERNEL`` nonzeros is split into several
kernels over consecutive output blocks, each writing its own column range.
"""

from __future__ import annotations

from ..ir import Block, PathIR, TensorProductIR
from .render import render

__all__ = ["render_files", "build_context", "next_pow2", "MAX_TERMS_PER_KERNEL", "BLOCK_ELEMS"]

# Budget of unrolled CG terms per kernel before the output blocks are split over kernels.
MAX_TERMS_PER_KERNEL = 1200
# Target elements per (block_batch, P) tile: sets the default batch block from the
# widest channel tile (512 -> 4 rows x 128 channels, the best first Pallas config seen).
BLOCK_ELEMS = 512
MIN_BLOCK_BATCH, MAX_BLOCK_BATCH = 4, 64


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _irrep_str(b: Block) -> str:
    return f"{b.mul}x{b.l}{'e' if b.parity == 1 else 'o'}"


def _internal_blocks(blocks: tuple[Block, ...]) -> tuple[list[dict], int]:
    """Per block: spec offset/mul/dim, padded channels ``P`` and internal offset."""
    out, off = [], 0
    for b in blocks:
        p = next_pow2(b.mul)
        out.append({"index": b.index, "offset": b.offset, "mul": b.mul, "dim": b.dim, "pad": p, "ioffset": off,
                    "desc": _irrep_str(b)})
        off += b.dim * p
    return out, off


def _weight_layout(ir: TensorProductIR, in1, in2, out) -> tuple[list[dict], int]:
    """Internal weight layout per weighted path: (src offset, src shape, perm, pad, internal offset)."""
    res, off = [], 0
    for p in ir.paths:
        if not p.has_weight:
            continue
        m1, m2, mo = in1[p.i_in1]["mul"], in2[p.i_in2]["mul"], out[p.i_out]["mul"]
        if p.mode == "uvw":
            shape, perm, pad, rows = (m1, m2, mo), (0, 1, 2), out[p.i_out]["pad"], m1 * m2
        elif p.mode == "uvu":
            shape, perm, pad, rows = (m1, m2), (1, 0), in1[p.i_in1]["pad"], m2
        elif p.mode == "uvv":
            shape, perm, pad, rows = (m1, m2), (0, 1), in2[p.i_in2]["pad"], m1
        else:  # uuu
            shape, perm, pad, rows = (m1,), (0,), in1[p.i_in1]["pad"], 1
        res.append({"path": p.index, "offset": p.weight_offset, "shape": shape, "perm": perm, "pad": pad,
                    "ioffset": off, "numel": p.weight_numel})
        off += rows * pad
    return res, off


def _weights_identity(wl: list[dict]) -> bool:
    """True when the internal weight layout is e3nn's own (no copy needed)."""
    for w in wl:
        shape, perm, pad = w["shape"], w["perm"], w["pad"]
        # a transpose of axes of size 1 is no transpose
        moved = [a for a in perm if shape[a] != 1]
        if moved != sorted(moved) or shape[perm[-1]] != pad or w["ioffset"] != w["offset"]:
            return False
    return True


def _layout_identity(blocks: list[dict], layout: str) -> bool:
    return all(b["mul"] == b["pad"] and (layout == "ir_mul" or b["mul"] == 1 or b["dim"] == 1) for b in blocks)


def _terms(p: PathIR, k: int, a: list[str], b: list[str]) -> list[dict]:
    """The multiply-adds of output component ``k``: sign, |coeff| literal, operand names."""
    out = [{"sign": "- " if n.coeff < 0 else "+ ", "coeff": repr(abs(float(n.coeff))), "a": a[n.i], "b": b[n.j]}
           for n in p.nonzeros if n.k == k]
    if out and out[0]["sign"] == "+ ":
        out[0]["sign"] = ""
    return out


class _KernelBuilder:
    """Builds the context of one kernel (a run of consecutive output blocks)."""

    def __init__(self, ir: TensorProductIR, in1, in2, out, wmap, number: int, out_blocks: list[int]):
        self.ir, self.in1, self.in2, self.out, self.wmap = ir, in1, in2, out, wmap
        self.number = number
        self.reads: set[str] = set()
        self.out_blocks = out_blocks
        col = 0
        self.out_cols = {}
        for o in out_blocks:
            self.out_cols[o] = col
            col += out[o]["dim"] * out[o]["pad"]
        self.width = col

    def vec(self, operand: str, blk: dict, m: int, reads: list) -> str:
        """Hoisted (once per kernel) read of a whole component row ``(block_batch, P)``."""
        name = f"{operand}_{blk['index']}_{m}"
        if name not in self.reads:
            self.reads.add(name)
            reads.append({"name": name, "ref": f"{operand}_ref", "start": str(blk["ioffset"] + m * blk["pad"]),
                          "size": blk["pad"], "comment": f"{operand} block {blk['index']} ({blk['desc']}), m={m}"})
        return name

    def path(self, p: PathIR, reads: list) -> dict:
        b1, b2, bo = self.in1[p.i_in1], self.in2[p.i_in2], self.out[p.i_out]
        m1, m2 = b1["mul"], b2["mul"]
        loop_reads: list[dict] = []
        prelude: list[str] = []
        loop = None
        if p.mode == "uuu":
            a = [self.vec("x1", b1, i, reads) for i in range(b1["dim"])]
            b = [self.vec("x2", b2, j, reads) for j in range(b2["dim"])]
            wstart = "{}"
        elif p.mode == "uvu" or (p.mode == "uvv"):
            vec_op, vec_blk, col_op, col_blk, cnt, var = (
                ("x1", b1, "x2", b2, m2, "v") if p.mode == "uvu" else ("x2", b2, "x1", b1, m1, "u"))
            vecs = [self.vec(vec_op, vec_blk, i, reads) for i in range(vec_blk["dim"])]
            if cnt == 1:
                cols = [self.vec(col_op, col_blk, j, reads) for j in range(col_blk["dim"])]
                wstart = "{}"
            else:
                loop = {"var": var, "count": cnt}
                cols = []
                for j in range(col_blk["dim"]):
                    name = f"{col_op}c_{j}"
                    cols.append(name)
                    loop_reads.append({"name": name, "ref": f"{col_op}_ref",
                                       "start": f"{col_blk['ioffset'] + j * col_blk['pad']} + {var}", "size": 1,
                                       "comment": f"{col_op} block {col_blk['index']}, m={j}, channel {var}"})
                wstart = "{} + " + f"{var} * {vec_blk['pad']}"
            a, b = (vecs, cols) if p.mode == "uvu" else (cols, vecs)
        else:  # uvw
            cnt = m1 * m2
            if cnt > 1:
                loop = {"var": "t", "count": cnt}
                if m1 > 1 and m2 > 1:
                    prelude = [f"u = t // {m2}", f"v = t % {m2}"]
                else:
                    prelude = ["u = t" if m1 > 1 else "v = t"]
            a, b = [], []
            for op, blk, names, var in (("x1", b1, a, "u"), ("x2", b2, b, "v")):
                for j in range(blk["dim"]):
                    if blk["mul"] == 1:
                        names.append(self.vec(op, blk, j, reads))
                    else:
                        name = f"{op}c_{j}"
                        names.append(name)
                        loop_reads.append({"name": name, "ref": f"{op}_ref",
                                           "start": f"{blk['ioffset'] + j * blk['pad']} + {var}", "size": 1,
                                           "comment": f"{op} block {blk['index']}, m={j}, channel {var}"})
            wstart = "{}" if cnt == 1 else "{} + " + f"t * {bo['pad']}"
        weight = None
        if p.has_weight:
            w = self.wmap[p.index]
            weight = {"name": "w", "start": wstart.format(w["ioffset"]), "size": w["pad"]}
        updates = []
        for k in range(bo["dim"]):
            terms = _terms(p, k, a, b)
            if terms:
                updates.append({"acc": f"acc_{p.i_out}_{k}", "terms": terms})
        accs = [f"acc_{p.i_out}_{k}" for k in range(bo["dim"])]
        acc_tuple = "(" + ", ".join(accs) + ("," if len(accs) == 1 else "") + ")"
        return {
            "index": p.index,
            "desc": (f"path {p.index}: x1[{p.i_in1}] {b1['desc']} (x) x2[{p.i_in2}] {b2['desc']} -> out[{p.i_out}] "
                     f"{bo['desc']}, {p.mode}, " + (f"weights at {p.weight_offset}" if p.has_weight else "unweighted")
                     + f", {len(p.nonzeros)} nonzeros"),
            "loop": loop,
            "prelude": prelude,
            "loop_reads": loop_reads,
            "weight": weight,
            "updates": updates,
            "acc_tuple": acc_tuple,
            "fn": f"_path_{p.index}",
        }

    def build(self) -> dict:
        reads_at: list[dict] = []
        groups = []
        for o in self.out_blocks:
            bo = self.out[o]
            reads: list[dict] = []
            paths = [self.path(p, reads) for p in self.ir.paths_into(o)]
            groups.append({
                "index": o,
                "desc": f"out block {o} ({bo['desc']}): {len(paths)} path(s)",
                "reads": reads,
                "accs": [{"name": f"acc_{o}_{k}", "pad": bo["pad"]} for k in range(bo["dim"])],
                "stores": [{"name": f"acc_{o}_{k}", "start": self.out_cols[o] + k * bo["pad"], "size": bo["pad"]}
                           for k in range(bo["dim"])],
                "paths": paths,
            })
            reads_at.extend(reads)
        return {"number": self.number, "name": f"_tp_fwd_kernel_{self.number}", "width": self.width,
                "groups": groups, "out_blocks": self.out_blocks,
                "terms": sum(len(p.nonzeros) for o in self.out_blocks for p in self.ir.paths_into(o))}


def _split_outputs(ir: TensorProductIR) -> list[list[int]]:
    """Consecutive runs of output blocks, balanced, each within ``MAX_TERMS_PER_KERNEL`` terms if possible."""
    costs = [sum(len(p.nonzeros) for p in ir.paths_into(b.index)) for b in ir.out]
    n = max(1, -(-sum(costs) // MAX_TERMS_PER_KERNEL))
    target = sum(costs) / n
    runs, cur, cur_terms = [], [], 0
    for b, t in zip(ir.out, costs):
        if cur and cur_terms + t > target and len(runs) < n - 1:
            runs.append(cur)
            cur, cur_terms = [], 0
        cur.append(b.index)
        cur_terms += t
    if cur:
        runs.append(cur)
    return runs


def build_context(ir: TensorProductIR, header: str) -> dict:
    in1, d1 = _internal_blocks(ir.in1)
    in2, d2 = _internal_blocks(ir.in2)
    out, do = _internal_blocks(ir.out)
    wl, wn = _weight_layout(ir, in1, in2, out)
    wmap = {w["path"]: w for w in wl}
    kernels = [_KernelBuilder(ir, in1, in2, out, wmap, n, run).build() for n, run in enumerate(_split_outputs(ir))]
    widest = max(b["pad"] for b in in1 + in2 + out)
    block_batch = max(MIN_BLOCK_BATCH, min(MAX_BLOCK_BATCH, BLOCK_ELEMS // widest))

    def tup(blocks):
        return repr(tuple((b["offset"], b["mul"], b["dim"], b["pad"]) for b in blocks))

    return {
        "header": header,
        "name": ir.name,
        "summary": str(ir),
        "layout": ir.layout,
        "shared_weights": ir.shared_weights,
        "dtypes": repr(tuple(ir.dtypes)),
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "weight_numel": ir.weight_numel,
        "idim_in1": d1,
        "idim_in2": d2,
        "idim_out": do,
        "iweight_numel": max(wn, 1),
        "has_weights": wn > 0,
        "in1_blocks": tup(in1),
        "in2_blocks": tup(in2),
        "out_blocks": tup(out),
        "in1_identity": _layout_identity(in1, ir.layout),
        "in2_identity": _layout_identity(in2, ir.layout),
        "out_identity": _layout_identity(out, ir.layout),
        "weight_blocks": repr(tuple((w["offset"], w["shape"], w["perm"], w["pad"]) for w in wl)),
        "weights_identity": _weights_identity(wl) and wn == ir.weight_numel,
        "block_batch": block_batch,
        "kernels": kernels,
        "num_kernels": len(kernels),
        "flops_per_batch": ir.flops_per_batch,
        "bytes_per_batch": dict(ir.bytes_per_batch),
        "num_paths": len(ir.paths),
    }


def render_files(ir: TensorProductIR, header: str) -> dict[str, str]:
    ctx = build_context(ir, header)
    return {
        "pallas_kernels.py": render("pallas_kernels.py.j2", **ctx),
        "jax_ops.py": render("jax_ops.py.j2", **ctx),
    }
