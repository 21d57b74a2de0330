"""Pallas backend: ``TensorProductIR`` -> ``pallas_kernels.py`` + ``jax_ops.py``.

Every decision is made here, in Python; the templates only loop and substitute.

Internal ("kernel") layout. Each operand block ``mul x l`` is stored inside the kernels
as ``2l+1`` contiguous rows of ``P = next_pow2(mul)`` channels (``ir_mul`` with the
channel count padded to a power of two, zeros in the padding), so that every value a
kernel loads or stores is a ``(block_batch, P)`` or ``(block_batch, 1)`` tile: power
of two shapes, as the Triton lowering of Pallas wants, and contiguous over channels
(docs/architecture.md "What layout costs"). Weights get the same treatment per path: the channel
index the kernel vectorizes over is innermost and padded to ``P``.

Four kernels, one four-linear form. A tensor product is the derivative of
``F(x1, x2, W, g) = sum_z sum_paths W C x1 x2 g`` (``eqdsl.reference._SUBSCRIPTS``);
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
``backward_x1_weighted``, ``backward_x2_weighted``); otherwise those are the same
functions as the full ones.

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
whose unrolled terms would exceed ``MAX_TERMS_PER_KERNEL`` nonzeros is split into
several kernels over consecutive output blocks, each writing its own column range. The
conv may split further (spec key ``pallas_conv_max_terms``): it then gets kernels of its
own (``CONV_*_KERNELS``; otherwise those name the plain product's).

Fused backward. A channelwise product (``helion_fused.fused_bwd_reason`` is None: every
path ``uvu``, weighted, one-channel ``x2``, per-batch weights) also gets
``backward_fused(x1, x2, w, g) = (dF/dx1, dF/dx2, dF/dW)``, one pass over ``g``
(``eqdsl.codegen.pallas_fused``), which the forward's VJP calls instead of the three.
"""

from __future__ import annotations

import re

from ..ir import Block, PathIR, TensorProductIR
from .pallas_factor import factor_kernel
from .render import render

__all__ = ["render_files", "build_context", "pallas_tuning", "next_pow2", "MAX_TERMS_PER_KERNEL", "BLOCK_ELEMS",
           "DEFAULT_NUM_WARPS", "KINDS"]

# Budget of unrolled CG terms per kernel before the output blocks are split over kernels.
MAX_TERMS_PER_KERNEL = 1200
# Target elements per (block_batch, P) tile: sets the default batch block from the
# widest channel tile (512 -> 4 rows x 128 channels, the best first Pallas config seen).
BLOCK_ELEMS = 512
MIN_BLOCK_BATCH, MAX_BLOCK_BATCH = 4, 64
# Triton warps per program unless the spec's tuning says otherwise (``pallas_tuning``).
DEFAULT_NUM_WARPS = 4
# conv segment kernels: edges per loop step (spec key pallas_segment_edges). Forward on
# bulk Si (114,688 edges; H100, 2026-11-25, gpu_jax_conv_blocks.py), 1 / 2 / 4 edges:
# mace_large 3,572 / 1,824 / 7,811 us, nequip_toluene 6,336 / 1,236 / 2,304 us. Four
# carry four rows of every running sum (spills); one leaves half of nequip_toluene's
# 64-channel tiles' threads idle
DEFAULT_SEGMENT_EDGES = 2

# Kernel kinds: (name, operand refs in argument order, the operand it computes, weighted
# paths only). The ``_wo`` kinds are derivatives of the weighted part of ``F`` alone (see
# the module docstring); they exist only when a spec mixes weighted and unweighted paths.
KINDS = (
    ("fwd", ("x1", "x2", "w"), "g", False),
    ("bwd_x1", ("g", "x2", "w"), "x1", False),
    ("bwd_x2", ("x1", "g", "w"), "x2", False),
    ("bwd_w", ("x1", "x2", "g"), "w", True),
    ("fwd_wo", ("x1", "x2", "w"), "g", True),
    ("bwd_x1_wo", ("g", "x2", "w"), "x1", True),
    ("bwd_x2_wo", ("x1", "g", "w"), "x2", True),
)
# Channel index of each data operand, per mode (e3nn's einsum subscripts).
_CHANNEL = {
    "uvw": {"x1": "u", "x2": "v", "g": "w"},
    "uvu": {"x1": "u", "x2": "v", "g": "u"},
    "uvv": {"x1": "u", "x2": "v", "g": "v"},
    "uuu": {"x1": "u", "x2": "u", "g": "u"},
}
# The channel a kernel vectorizes over: the innermost axis of the path's weight rows.
_VECTOR = {"uvw": "w", "uvu": "u", "uvv": "v", "uuu": "u"}
_DATA = ("x1", "x2", "g")


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _irrep_str(b: Block) -> str:
    return f"{b.mul}x{b.l}{'e' if b.parity == 1 else 'o'}"


def _blocks(blocks: tuple[Block, ...], layout: str) -> list[dict]:
    """Per irreps block: spec offset, mul, dim, padded channels ``pad`` and access form.

    ``tile``: a ``mul_ir`` block with ``mul > 1`` and ``2l+1 > 1``, read and written whole
    (``rt.load_tile`` / ``rt.store_tile``); otherwise component ``m`` is contiguous over
    the channels (``ir_mul``, or a single channel or component) at ``offset + m * mul``."""
    out = []
    for b in blocks:
        out.append({"index": b.index, "offset": b.offset, "mul": b.mul, "dim": b.dim, "pad": next_pow2(b.mul),
                    "tile": layout == "mul_ir" and b.mul > 1 and b.dim > 1, "desc": _irrep_str(b)})
    return out


def _weight_layout(ir: TensorProductIR, in1, in2, out) -> dict[int, dict]:
    """Per weighted path, how the kernels read its weights in place (e3nn's order, per path
    a row-major block of shape ``(m1, m2, mo)`` / ``(m1, m2)`` / ``(m1,)``): the vector over
    the vectorized channel has ``count`` lanes (``pad`` padded) ``stride`` columns apart;
    ``rows`` of them, selected by the loop channels."""
    res = {}
    for p in ir.paths:
        if not p.has_weight:
            continue
        m1, m2, mo = in1[p.i_in1]["mul"], in2[p.i_in2]["mul"], out[p.i_out]["mul"]
        if p.mode == "uvw":  # w innermost: row (u, v) at (u * m2 + v) * mo
            count, pad, stride = mo, out[p.i_out]["pad"], 1
        elif p.mode == "uvu":  # vector over u, (u, v) at u * m2 + v: strided unless m2 == 1
            count, pad, stride = m1, in1[p.i_in1]["pad"], m2
        elif p.mode == "uvv":  # vector over v, row u at u * m2
            count, pad, stride = m2, in2[p.i_in2]["pad"], 1
        else:  # uuu
            count, pad, stride = m1, in1[p.i_in1]["pad"], 1
        res[p.index] = {"path": p.index, "offset": p.weight_offset, "count": count, "pad": pad, "stride": stride,
                        "numel": p.weight_numel, "m2": m2}
    return res


# ------------------------------------------------------------------ statements
# A kernel body is a list of statements (plain dicts) that the template renders:
# load, sum (a multi-line sum of terms), line, store, loop (a lax.fori_loop).


def _load(name: str, ref: str, start, size: int, comment: str = "") -> dict:
    return {"kind": "load", "name": name, "ref": ref, "start": str(start), "size": size, "comment": comment}


def _sum(target: str, prefix: str, terms: list[str]) -> dict:
    return {"kind": "sum", "target": target, "prefix": prefix, "terms": terms}


def _line(text: str) -> dict:
    return {"kind": "line", "text": text}


def _store(start, size: int, value: str, ref: str = "out_ref") -> dict:
    return {"kind": "store", "ref": ref, "start": str(start), "size": size, "value": value}


def _read(name: str, ref: str, start, count: int, pad: int, stride: int, comment: str = "") -> dict:
    """``(rows, pad)`` tile of columns ``start + c * stride`` (``c < count``, zero beyond):
    a plain slice of the ref when that is what it is, else ``rt.load_vec``."""
    if stride == 1 and count == pad:
        return _load(name, ref, start, pad, comment)
    args = f"count={count}, pad={pad}" + (f", stride={stride}" if stride != 1 else "")
    return _line(f"{name} = rt.load_vec({ref}, {start}, {args})" + (f"  # {comment}" if comment else ""))


def _write(start, value: str, count: int, pad: int, stride: int, ref: str = "out_ref") -> dict:
    """Store lanes ``c < count`` of ``value`` to columns ``start + c * stride`` of ``ref``."""
    if stride == 1 and count == pad:
        return _store(start, pad, value, ref)
    args = f"count={count}, pad={pad}" + (f", stride={stride}" if stride != 1 else "")
    return _line(f"rt.store_vec({ref}, {start}, {value}, {args})")


def _loop(fn: str, var: str, count: int, carry: list[str], body: list[dict], prelude: tuple[str, ...] = ()) -> dict:
    tup = "(" + ", ".join(carry) + ("," if len(carry) == 1 else "") + ")" if carry else "None"
    return {"kind": "loop", "fn": fn, "var": var, "count": count, "carry": tup, "has_carry": bool(carry),
            "prelude": list(prelude), "body": body}


def _terms(nonzeros, factors) -> list[str]:
    """``± coeff * f1 * f2 ...`` per nonzero; ``factors(n)`` names the operands of nonzero ``n``."""
    out = []
    for n in nonzeros:
        # a coefficient of exactly 1 is left out (exact either way; one multiply less)
        t = " * ".join(([] if abs(n.coeff) == 1.0 else [repr(abs(float(n.coeff)))]) + list(factors(n)))
        out.append(("- " if n.coeff < 0 else ("+ " if out else "")) + t)
    return out


_FACTOR = re.compile(r"^[A-Za-z_]\w*$|^\d+(\.\d*)?(e-?\d+)?$")
_PREFIX = re.compile(r"^(?:(\w+) \+ (?:(\w+) \* )?)?$")


def _fma_chain(stmt: dict) -> list[dict]:
    """A ``sum`` statement as a chain of ``rt.fma`` (one rounding per term on the GPU), or
    ``[stmt]`` unchanged when a term is not a product of names and literals. ``T = A + w *
    (t1 + t2 + ...)`` becomes ``T_s = t1; T_s = rt.fma(.., .., T_s) ...; T = rt.fma(w, T_s, A)``
    (``(-a) * b`` is ``-(a * b)``: a term's sign goes on its first factor)."""
    prefix = _PREFIX.match(stmt["prefix"])
    if prefix is None:
        return [stmt]
    terms = []
    for t in stmt["terms"]:
        sign = t[0] if t[:2] in ("- ", "+ ") else ""
        factors = (t[2:] if sign else t).split(" * ")
        if not all(_FACTOR.match(f) for f in factors):
            return [stmt]
        terms.append(("-" if sign == "-" else "", factors))
    target, init, scale = stmt["target"], prefix.group(1), prefix.group(2)
    acc = target if scale is None else f"{target}_s"
    out = []
    if init is not None and scale is None:
        rest = terms
        if init != acc:
            out.append(_line(f"{acc} = {init}"))
    else:  # the chain starts from the first term
        (sign, factors), rest = terms[0], terms[1:]
        out.append(_line(f"{acc} = {sign}{' * '.join(factors)}"))
    for sign, factors in rest:
        head = " * ".join(factors[:-1]) if len(factors) > 1 else "1.0"
        out.append(_line(f"{acc} = rt.fma({sign}{head}, {factors[-1]}, {acc})"))
    if scale is not None:
        out.append(_line(f"{target} = rt.fma({scale}, {acc}, {init})"))
    return out


def _with_fma(stmts: list[dict]) -> list[dict]:
    """Every ``sum`` of ``stmts`` (loops included) as an ``rt.fma`` chain."""
    out = []
    for st in stmts:
        if st["kind"] == "sum":
            out.extend(_fma_chain(st))
        elif st["kind"] == "loop":
            out.append({**st, "body": _with_fma(st["body"])})
        else:
            out.append(st)
    return out


def _plain_terms(products: list[str]) -> list[str]:
    return [("+ " if i else "") + t for i, t in enumerate(products)]


def _comp(n, op: str) -> int:
    return {"x1": n.i, "x2": n.j, "g": n.k}[op]


def _offset(base: int, index: str, scale: int) -> str:
    """``base + index * scale`` as short source text."""
    if index == "0":
        return str(base)
    return f"{base} + {index}" + (f" * {scale}" if scale != 1 else "")


def _lanesum(expr: str, pad: int) -> str:
    """Sum over the channel lanes, keeping a ``(rows, 1)`` column."""
    return expr if pad == 1 else f"jnp.sum({expr}, axis=1, keepdims=True)"


class _KernelBuilder:
    """Builds the context of one kernel of one kind over a run of output groups."""

    def __init__(self, kind: str, ir: TensorProductIR, blocks: dict, wmap: dict, number: int, groups: list[int],
                 prefix: str = "tp"):
        self.kind, self.prefix = kind, prefix
        self.refs, self.target, weighted_only = next((r, t, wo) for k, r, t, wo in KINDS if k == kind)
        self.ir, self.blocks, self.wmap = ir, blocks, wmap
        self.paths = [p for p in ir.paths if p.has_weight or not weighted_only]
        self.number = number
        self.group_ids = groups
        self.loaded: set[str] = set()
        self.narrow: set[str] = set()  # names of (rows, 1) operands (pallas_factor)
        self.lanes: set[int] = set()

    # ---- operands
    def _blk(self, op: str, p: PathIR) -> dict:
        return self.blocks[op][{"x1": p.i_in1, "x2": p.i_in2, "g": p.i_out}[op]]

    def vec(self, op: str, blk: dict, m: int, top: list) -> str:
        """Hoisted (once per kernel) read of a whole component ``(rows, pad)``; a ``tile``
        block is read whole, all its components at once."""
        name = f"{op}_{blk['index']}_{m}"
        if name in self.loaded:
            return name
        comment = f"{op} block {blk['index']} ({blk['desc']})"
        if blk["tile"]:
            names = [f"{op}_{blk['index']}_{k}" for k in range(blk["dim"])]
            self.loaded.update(names)
            if blk["pad"] == 1:
                self.narrow.update(names)
            top.append(_line(f"{', '.join(names)} = rt.load_tile({op}_ref, {blk['offset']}, mul={blk['mul']}, "
                             f"dim={blk['dim']}, pad={blk['pad']})  # {comment}"))
            return name
        self.loaded.add(name)
        if blk["pad"] == 1:
            self.narrow.add(name)
        top.append(_read(name, f"{op}_ref", blk["offset"] + m * blk["mul"], blk["mul"], blk["pad"], 1,
                         f"{comment}, m={m}"))
        return name

    def col(self, op: str, blk: dict, m: int, var: str, count: int, top: list, body: list) -> str:
        """Component ``m`` of ``op`` at channel ``var``: a ``(rows, 1)`` column read in the loop."""
        if count == 1:
            return self.vec(op, blk, m, top)
        name = f"{op}c_{m}"
        self.narrow.add(name)
        start = (_offset(blk["offset"] + m, var, blk["dim"]) if blk["tile"]
                 else _offset(blk["offset"] + m * blk["mul"], var, 1))
        body.append(_load(name, f"{op}_ref", start, 1, f"{op} block {blk['index']}, m={m}, channel {var}"))
        return name

    def lane(self, pad: int) -> str:
        self.lanes.add(pad)
        return f"lane_{pad}"

    # ---- per path
    def _info(self, p: PathIR) -> dict:
        ch = _CHANNEL[p.mode]
        blk = {op: self._blk(op, p) for op in _DATA}
        count = {"u": blk["x1"]["mul"], "v": blk["x2"]["mul"], "w": blk["g"]["mul"]}
        c = _VECTOR[p.mode]
        cpad = blk["g"]["pad"] if c == "w" else (blk["x1"]["pad"] if c == "u" else blk["x2"]["pad"])
        loopvars = [] if p.mode == "uuu" else [v for v in ("u", "v") if v != c]
        return {"ch": ch, "blk": blk, "count": count, "c": c, "cpad": cpad, "loopvars": loopvars}

    def _wstart(self, p: PathIR, info: dict, env: dict, base: int | None = None) -> str:
        """Source text of the first column of the path's weight vector (``env`` names the loop
        variables in scope: ``u``, ``v`` or the flattened ``t``); ``base``: the path's first
        column (default: its offset in the weights)."""
        w = self.wmap[p.index]
        base = w["offset"] if base is None else base
        if p.mode == "uvw":
            m2, mo = info["count"]["v"], info["count"]["w"]
            u, v = env.get("u", "0"), env.get("v", "0")
            if "t" in env:
                idx = env["t"]
            elif u == "0":
                idx = v
            elif v == "0":
                idx = f"{u} * {m2}" if m2 != 1 else u
            else:
                idx = f"({u} * {m2} + {v})"
            return _offset(base, idx, mo)
        if p.mode == "uvu":
            return _offset(base, env.get("v", "0"), 1)
        if p.mode == "uvv":
            return _offset(base, env.get("u", "0"), w["m2"])
        return str(base)

    def _wload(self, p: PathIR, info: dict, env: dict) -> dict:
        w = self.wmap[p.index]
        return _read("w", "w_ref", self._wstart(p, info, env), w["count"], w["pad"], w["stride"])

    def _flat_loop(self, info: dict) -> tuple[dict | None, dict, tuple[str, ...]]:
        """One loop over the active loop channels (flattened ``t`` when both): (loop, env, prelude)."""
        active = [v for v in info["loopvars"] if info["count"][v] > 1]
        if not active:
            return None, {}, ()
        if len(active) == 1:
            return {"var": active[0], "count": info["count"][active[0]]}, {active[0]: active[0]}, ()
        m2 = info["count"]["v"]
        # lax.div, not jnp's // and %: those do not lower to Triton for the int64 loop index
        # that fori_loop has under jax_enable_x64 (test_pallas_lowering)
        return ({"var": "t", "count": info["count"]["u"] * m2}, {"u": "u", "v": "v", "t": "t"},
                (f"u = lax.div(t, {m2})", f"v = t - u * {m2}"))

    def _desc(self, p: PathIR, info: dict) -> str:
        b = info["blk"]
        return (f"path {p.index}: x1[{p.i_in1}] {b['x1']['desc']} (x) x2[{p.i_in2}] {b['x2']['desc']} -> "
                f"out[{p.i_out}] {b['g']['desc']}, {p.mode}, "
                + (f"weights at {p.weight_offset}" if p.has_weight else "unweighted")
                + f", {len(p.nonzeros)} nonzeros")

    def _accs(self, blk: dict) -> list[str]:
        return [f"acc_{blk['index']}_{m}" for m in range(blk["dim"])]

    def path_into_acc(self, p: PathIR, top: list) -> None:
        """Add path ``p``'s contribution to the accumulators of the target operand's block."""
        info = self._info(p)
        X = self.target
        if info["ch"][X] == info["c"]:
            self._vector_target(p, info, top)
        else:
            self._column_target(p, info, top)

    def _operand_names(self, p, info, ops, env, top, body) -> dict:
        names = {}
        for op in ops:
            blk, var = info["blk"][op], info["ch"][op]
            if var == info["c"]:
                names[op] = [self.vec(op, blk, m, top) for m in range(blk["dim"])]
            else:
                names[op] = [self.col(op, blk, m, env.get(var, "0"), info["count"][var], top, body)
                             for m in range(blk["dim"])]
        return names

    def _vector_target(self, p: PathIR, info: dict, top: list) -> None:
        """Target indexed by the vector channel: accumulate in registers (the forward's structure)."""
        X, blkX = self.target, info["blk"][self.target]
        others = [op for op in _DATA if op != X]
        loop, env, prelude = self._flat_loop(info)
        body: list[dict] = []
        names = self._operand_names(p, info, others, env, top, body)
        scale = ""
        if p.has_weight:
            body.append(self._wload(p, info, env))
            scale = "w * "
        accs = self._accs(blkX)
        for m in range(blkX["dim"]):
            nz = [n for n in p.nonzeros if _comp(n, X) == m]
            if nz:
                body.append(_sum(accs[m], f"{accs[m]} + {scale}",
                                 _terms(nz, lambda n: [names[o][_comp(n, o)] for o in others])))
        top.append(_line(f"# {self._desc(p, info)}"))
        if loop is None:
            top.extend(body)
        else:
            top.append(_loop(f"_path_{p.index}", loop["var"], loop["count"], accs, body, prelude))

    def _column_target(self, p: PathIR, info: dict, top: list) -> None:
        """Target indexed by a looped channel: reduce over the vector lanes, write lane ``u``/``v``."""
        X, blkX = self.target, info["blk"][self.target]
        padX = blkX["pad"]
        others = [op for op in _DATA if op != X]
        var = info["ch"][X]
        cnt = info["count"][var]
        accs = self._accs(blkX)
        vecs = [op for op in others if info["ch"][op] == info["c"]]
        top.append(_line(f"# {self._desc(p, info)}"))
        if len(vecs) == 2:  # uvu backward_x2, uvv backward_x1
            names = self._operand_names(p, info, vecs, {}, top, [])
            hs = {}
            for m in range(blkX["dim"]):
                nz = [n for n in p.nonzeros if _comp(n, X) == m]
                if nz:
                    hs[m] = f"h{p.index}_{m}"
                    top.append(_sum(hs[m], "", _terms(nz, lambda n: [names[o][_comp(n, o)] for o in vecs])))
            body: list[dict] = []
            if p.has_weight:
                body.append(self._wload(p, info, {var: var} if cnt > 1 else {}))
            for m, h in hs.items():
                s = _lanesum(f"w * {h}" if p.has_weight else h, info["cpad"])
                if cnt > 1 and p.has_weight:
                    s = f"jnp.where({self.lane(padX)} == {var}, {s}, 0.0)"
                elif cnt != padX:
                    s = f"jnp.where({self.lane(padX)} < {cnt}, {s}, 0.0)"
                body.append(_line(f"{accs[m]} = {accs[m]} + {s}"))
            if cnt > 1 and p.has_weight:
                top.append(_loop(f"_path_{p.index}", var, cnt, accs, body))
            else:
                top.extend(body)
            return
        # uvw backward_x1 / backward_x2: outer loop over the target's channel, inner over the other
        other_var = "v" if var == "u" else "u"
        ocnt = info["count"][other_var]
        env = {v: v for v in ("u", "v") if info["count"][v] > 1}
        inner: list[dict] = []
        names = self._operand_names(p, info, others, env, top, inner)
        gop = vecs[0]  # the output gradient, a vector over w
        ks = sorted({_comp(n, gop) for n in p.nonzeros})
        inner.append(self._wload(p, info, env))
        for k in ks:
            inner.append(_line(f"s_{k} = {_lanesum(f'w * {names[gop][k]}', info['cpad'])}"))
        colop = next(op for op in others if op != gop)
        cols = {}
        for m in range(blkX["dim"]):
            nz = [n for n in p.nonzeros if _comp(n, X) == m]
            if nz:
                cols[m] = f"c_{m}"
                inner.append(_sum(cols[m], f"{cols[m]} + ",
                                  _terms(nz, lambda n: [names[colop][_comp(n, colop)], f"s_{_comp(n, gop)}"])))
        outer: list[dict] = [_line(f"{c} = jnp.zeros((rows, 1), dtype)") for c in cols.values()]
        if ocnt > 1:
            outer.append(_loop(f"_path_{p.index}_{other_var}", other_var, ocnt, list(cols.values()), inner))
        else:
            outer.extend(inner)
        for m, c in cols.items():
            v = f"jnp.where({self.lane(padX)} == {var}, {c}, 0.0)" if cnt > 1 else c
            outer.append(_line(f"{accs[m]} = {accs[m]} + {v}"))
        if cnt > 1:
            top.append(_loop(f"_path_{p.index}", var, cnt, accs, outer))
        else:
            top.extend(outer)

    def weight_rows(self, p: PathIR, top: list, col0: int) -> None:
        """``backward_w`` of one weighted path: one row over the vector channel per loop step."""
        info = self._info(p)
        w = self.wmap[p.index]
        base = w["offset"] - col0
        vecs = [op for op in _DATA if info["ch"][op] == info["c"]]
        cols = [op for op in _DATA if op not in vecs]
        top.append(_line(f"# {self._desc(p, info)}"))
        reduce = (lambda body: body.append(_line("r = jnp.sum(r, axis=0, keepdims=True)"))) \
            if self.ir.shared_weights else (lambda body: None)
        if not cols:  # uuu
            names = self._operand_names(p, info, vecs, {}, top, [])
            top.append(_sum("r", "", _terms(p.nonzeros, lambda n: [names[o][_comp(n, o)] for o in vecs])))
            reduce(top)
            top.append(_write(base, "r", w["count"], w["pad"], w["stride"]))
            return
        loop, env, prelude = self._flat_loop(info)
        body: list[dict] = []
        if len(vecs) == 2:  # uvu / uvv: contract the two vectors first, per component of the column operand
            (cop,) = cols
            vnames = self._operand_names(p, info, vecs, {}, top, [])
            cnames = self._operand_names(p, info, cols, env, top, body)
            prods = []
            for m in range(info["blk"][cop]["dim"]):
                nz = [n for n in p.nonzeros if _comp(n, cop) == m]
                if nz:
                    h = f"h{p.index}_{m}"
                    top.append(_sum(h, "", _terms(nz, lambda n: [vnames[o][_comp(n, o)] for o in vecs])))
                    prods.append(f"{h} * {cnames[cop][m]}")
        else:  # uvw: contract the two columns first, per component of the output gradient
            (gop,) = vecs
            names = self._operand_names(p, info, _DATA, env, top, body)
            prods = []
            for k in range(info["blk"][gop]["dim"]):
                nz = [n for n in p.nonzeros if _comp(n, gop) == k]
                if nz:
                    body.append(_sum(f"q_{k}", "", _terms(nz, lambda n: [names[o][_comp(n, o)] for o in cols])))
                    prods.append(f"q_{k} * {names[gop][k]}")
        body.append(_sum("r", "", _plain_terms(prods)))
        reduce(body)
        body.append(_write(self._wstart(p, info, env, base), "r", w["count"], w["pad"], w["stride"]))
        if loop is None:
            top.extend(body)
        else:
            top.append(_loop(f"_path_{p.index}", loop["var"], loop["count"], [], body, prelude))

    # ---- whole kernel
    def build(self) -> dict:
        groups, col = [], 0
        terms = 0
        if self.target == "w":
            for pi in self.group_ids:
                p = self.ir.paths[pi]
                top: list[dict] = []
                self.weight_rows(p, top, self.wmap[self.group_ids[0]]["offset"])
                groups.append({"desc": f"weights of path {pi} ({self.wmap[pi]['numel']} columns)", "body": top})
                col += self.wmap[pi]["numel"]
                terms += len(p.nonzeros)
            desc = f"Weighted paths {', '.join(map(str, self.group_ids))}"
        else:
            op = self.target
            for b in self.group_ids:
                blk = self.blocks[op][b]
                paths = [p for p in self.paths if {"g": p.i_out, "x1": p.i_in1, "x2": p.i_in2}[op] == b]
                top = [_line(f"{a} = jnp.zeros((rows, {blk['pad']}), dtype)") for a in self._accs(blk)]
                for p in paths:
                    self.path_into_acc(p, top)
                accs = self._accs(blk)
                if blk["tile"]:
                    top.append(_line(f"rt.store_tile(out_ref, {col}, [{', '.join(accs)}], mul={blk['mul']}, "
                                     f"dim={blk['dim']}, pad={blk['pad']})"))
                else:
                    for m, a in enumerate(accs):
                        top.append(_write(col + m * blk["mul"], a, blk["mul"], blk["pad"], 1))
                col += blk["dim"] * blk["mul"]
                terms += sum(len(p.nonzeros) for p in paths)
                name = {"g": "out", "x1": "x1", "x2": "x2"}[op]
                groups.append({"desc": f"{name} block {b} ({blk['desc']}): {len(paths)} path(s)", "body": top})
            what = {"g": "Output", "x1": "x1", "x2": "x2"}[op]
            desc = f"{what} blocks {', '.join(map(str, self.group_ids))}"
        return {
            "kind": self.kind,
            "number": self.number,
            "name": f"_{self.prefix}_{self.kind}_kernel_{self.number}",
            "refs": [f"{r}_ref" for r in self.refs],
            "outs": ["out_ref"],
            "width": col,
            "desc": f"{desc} ({col} columns); {terms} CG terms.",
            "lanes": [{"name": f"lane_{p}", "pad": p} for p in sorted(self.lanes)],
            "groups": groups,
            "terms": terms,
            "narrow": sorted(self.narrow),
        }


def _split(costs: list[int], max_terms: int | None = None) -> list[list[int]]:
    """Consecutive runs of groups, balanced, each within ``max_terms`` terms (default
    ``MAX_TERMS_PER_KERNEL``) if possible."""
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


def _kernels(kind: str, ir: TensorProductIR, blocks: dict, wmap: dict,
             max_terms: int | None = None, prefix: str = "tp") -> list[dict]:
    _, _, op, weighted_only = next(k for k in KINDS if k[0] == kind)
    paths = [p for p in ir.paths if p.has_weight or not weighted_only]
    if not paths:  # nothing to compute: the launcher returns zeros
        return []
    if op == "w":
        ids = list(wmap)
        runs = _split([len(ir.paths[i].nonzeros) for i in ids], max_terms)
        runs = [[ids[i] for i in run] for run in runs]
    else:
        key = {"g": "i_out", "x1": "i_in1", "x2": "i_in2"}[op]
        costs = [sum(len(p.nonzeros) for p in paths if getattr(p, key) == b["index"]) for b in blocks[op]]
        runs = _split(costs, max_terms)
    # the lanes a kernel needs are known only after its body is built
    return [_KernelBuilder(kind, ir, blocks, wmap, n, run, prefix).build() for n, run in enumerate(runs)]


def _every_kernel(kernels: dict, fused: dict | None, conv_family: dict | None) -> list[dict]:
    """Every kernel context of a build: the plain product's sets, its fused backward, and the
    conv's own sets and fused backward."""
    out = [k for ks in kernels.values() for k in ks]
    out += fused["kernels"] if fused else []
    if conv_family:
        out += [k for st in conv_family["kernel_sets"] for k in st["kernels"]]
        out += conv_family["fused"]["kernels"] if conv_family["fused"] else []
    return out


def pallas_tuning(pairs=()) -> tuple[int | None, int]:
    """``(block_batch, num_warps)`` from a spec's tuning pairs (validated by ``spec.TUNING_KEYS``):
    ``pallas_block_batch`` and ``pallas_num_warps``; ``None`` / ``DEFAULT_NUM_WARPS`` where
    absent (``None``: the size rule of ``build_context``)."""
    values = dict(pairs)
    return values.get("pallas_block_batch"), int(values.get("pallas_num_warps", DEFAULT_NUM_WARPS))


def build_context(ir: TensorProductIR, header: str, tuning=()) -> dict:
    in1, in2, out = (_blocks(b, ir.layout) for b in (ir.in1, ir.in2, ir.out))
    wmap = _weight_layout(ir, in1, in2, out)
    blocks = {"x1": in1, "x2": in2, "g": out}
    mixed = any(p.has_weight for p in ir.paths) and not all(p.has_weight for p in ir.paths)
    kinds = [k for k, _, _, _ in KINDS if mixed or not k.endswith("_wo")]
    kernels = {kind: _kernels(kind, ir, blocks, wmap) for kind in kinds}
    from .pallas_fused import fused_context  # it builds on this module

    # pallas_fuse_bwd = 0: the three backward kernels instead (mace_large's fused Pallas
    # backward measured slower than them on the H100, 2026-11-23: 2208 against 1808 us fwd+bwd)
    # The conv's backward gathers G, its widest operand, once per kernel: its fused form
    # (pallas_conv_fuse_bwd) gathers it once (jax_runtime.conv_backward_fused)
    values = dict(tuning)
    # pallas_factor: measured per problem, so not the default. On the H100 (2026-11-25) it took
    # mace_large's JAX conv fwd+bwd on bulk Si from 5,131 to 4,642 us and nequip_benzene's TP
    # fwd+bwd from 4,756 to 3,968, but nequip_toluene's conv fwd+bwd from 3,447 to 4,196 and
    # most forwards 4-11% slower; pallas_factor = 2 keeps the forward kernels unfactored
    factor_mode = int(values.get("pallas_factor", 0))
    factored = factor_mode > 0
    tp_fuse = bool(values.get("pallas_fuse_bwd", 1))
    conv_fuse = ir.conv and bool(values.get("pallas_conv_fuse_bwd", 1))
    # pallas_conv_max_terms: the conv's own kernels, split over more output blocks than the
    # plain product's. A segment program carries a running sum per output column of its
    # kernel; the split re-gathers only the inputs its kernels share (x1 rows, from L2).
    # The plain product keeps one kernel: its split pieces are joined by a concatenation,
    # a pass over the widest array (mace_large fwd 467 -> 1,053 us, H100, 2026-11-25)
    # pallas_conv_fused_max_terms: the conv's fused backward split further, down to part of
    # an x1 block's paths per kernel (each part writes a partial dF/dx1 message, added up
    # after the segment sum): fewer registers per program for one more message per part
    plain_fused = fused_context(ir, blocks, wmap, factored=factored) if tp_fuse or conv_fuse else None
    conv_family = None
    if ir.conv and ("pallas_conv_max_terms" in values or "pallas_conv_fused_max_terms" in values):
        terms = values.get("pallas_conv_max_terms")
        fused_terms = values.get("pallas_conv_fused_max_terms")
        conv_family = {
            "kernel_sets": [{"kind": kind, "const": "CONV_" + kind.upper() + "_KERNELS",
                             "kernels": _kernels(kind, ir, blocks, wmap, terms, "conv")} for kind in kinds],
            "fused": fused_context(ir, blocks, wmap, terms if fused_terms is None else fused_terms, "conv",
                                   split_blocks=fused_terms is not None, factored=factored) if conv_fuse else None,
        }
        same = [len(s["kernels"]) for s in conv_family["kernel_sets"]] == [len(kernels[k]) for k in kinds]
        if same and conv_family["fused"] is not None:
            same = len(conv_family["fused"]["kernels"]) == len(plain_fused["kernels"])
        if same:  # the budget splits nothing further: the conv uses the plain product's kernels
            conv_family = None
    separate = conv_family is not None
    fused = plain_fused if tp_fuse or (conv_fuse and not separate) else None
    for k in _every_kernel(kernels, fused, conv_family):
        if factored and not (factor_mode == 2 and k["kind"].startswith("fwd")):  # fewer operations on channel tiles
            k.update(factor_kernel(k))
        if values.get("pallas_fma", 0):  # every sum as an rt.fma chain (XLA's Triton pipeline fuses none)
            k["groups"] = [{**g, "body": _with_fma(g["body"])} for g in k["groups"]]
    block_batch, num_warps = pallas_tuning(tuning)
    if block_batch is None:
        widest = max(b["pad"] * (next_pow2(b["dim"]) if b["tile"] else 1) for b in in1 + in2 + out)
        block_batch = max(MIN_BLOCK_BATCH, min(MAX_BLOCK_BATCH, BLOCK_ELEMS // widest))
    tiles = sorted({b["desc"] for b in in1 + in2 + out if b["tile"]})

    return {
        "header": header,
        "name": ir.name,
        "conv": ir.conv,
        "reduce": ir.reduce,
        "deterministic": ir.deterministic,
        "summary": str(ir),
        "layout": ir.layout,
        "shared_weights": ir.shared_weights,
        "dtypes": repr(tuple(ir.dtypes)),
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "weight_numel": ir.weight_numel,
        "kweight_numel": max(ir.weight_numel, 1),
        "has_weights": ir.weight_numel > 0,
        "tiles": ", ".join(tiles),
        "block_batch": block_batch,
        "num_warps": num_warps,
        "segment_edges": int(dict(tuning).get("pallas_segment_edges", DEFAULT_SEGMENT_EDGES)),
        "kernel_sets": [{"kind": kind, "const": kind.upper() + "_KERNELS", "kernels": kernels[kind]} for kind in kinds],
        "kernels": [k for kind in kinds for k in kernels[kind]],
        "num_kernels": {kind: len(kernels[kind]) for kind in kinds},
        "fused": fused,
        "tp_fused": fused is not None and tp_fuse,
        "conv_fused": conv_fuse and (conv_family["fused"] if separate else fused) is not None,
        "conv_family": conv_family,
        "mixed_weighting": mixed,
        "flops_per_batch": ir.flops_per_batch,
        "bytes_per_batch": dict(ir.bytes_per_batch),
        "num_paths": len(ir.paths),
    }


def render_files(ir: TensorProductIR, header: str, tuning=()) -> dict[str, str]:
    """``pallas_kernels.py`` and ``jax_ops.py``; ``tuning``: a spec's tuning pairs (only the
    ``pallas_*`` keys are read, see ``pallas_tuning``)."""
    ctx = build_context(ir, header, tuning)
    return {
        "pallas_kernels.py": render("pallas_kernels.py.j2", **ctx),
        "jax_ops.py": render("jax_ops.py.j2", **ctx),
    }
