"""Helion (PyTorch) backend: ``TensorProductIR`` -> ``helion_kernels.py`` + ``torch_ops.py``.

Every decision is made here and handed to the templates as plain strings and lists.

Kernel structure (one or more kernels per tensor product, see ``_split``)::

    for tile_b in hl.tile(batch):                       # the grid: batch tiles
        <per-batch scalars>                              # x2[:, j, v] of uvu paths, x1[:, i, u] of uvv
        for tile_c in hl.tile(M):                       # one loop per output multiplicity M
            <channel-tiled loads>                        # each input component used, once
            # output block o (mul M): accumulators acc<o>_<k> in registers
            acc = acc + W * (c * a * b + ...)            # uvu / uvv / uuu: one line per (k, v|u)
            for tile_r in hl.tile(M_in):                # uvw: reduction over the larger input
                <reduction loads>
                acc = acc + ((c * a * b + ...)[:, :, None] * W[..., tile_r, ..., tile_c]).sum(1)
            out<o>[tile_b, k, tile_c] = acc              # each output component written once

All operands reach the kernels as ``(batch, 2l+1, mul)`` views of ``ir_mul`` rows
(channel innermost, so every load and store of a component is contiguous over the
channel tile). ``mul_ir`` operands are converted at the op boundary (see
``templates/torch_ops.py.j2``). Block sizes are literals in the generated code and the
config is pinned, so nothing is autotuned and a new batch size never recompiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..ir import Block, PathIR, TensorProductIR
from .render import render

__all__ = ["render_files", "Tuning", "kernel_context", "op_namespace"]


@dataclass(frozen=True)
class Tuning:
    """Block sizes and launch parameters (literals in the generated code).

    ``block_c`` is the channel tile: 32 float32 channels make one 128-byte line, so
    every component load/store of an ``ir_mul`` tile is one coalesced line.
    ``block_b`` batch rows per program; smaller when a kernel holds per-batch ``uvw``
    weight tiles of ``block_b * block_r * block_c`` elements. ``max_terms`` bounds the
    unrolled multiply-adds in one kernel; output blocks beyond it go to another kernel
    (each kernel re-reads the inputs it needs, never an output).
    """

    block_b: int = 16
    block_b_uvw: int = 4
    block_c: int = 32
    block_r: int = 16
    num_warps: int = 4
    num_stages: int = 1
    max_terms: int = 1024


DEFAULT_TUNING = Tuning()


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def op_namespace(name: str) -> str:
    """``torch.library`` namespace of the generated op (the name is a validated identifier)."""
    return "eqdsl_" + re.sub(r"[^0-9A-Za-z_]", "_", name)


def _term(coeff: float, factors: list[str], first: bool) -> str:
    body = " * ".join([repr(abs(coeff))] + factors)
    if first:
        return ("-" if coeff < 0 else "") + body
    return ("- " if coeff < 0 else "+ ") + body


def _sum(terms: list[tuple[float, list[str]]]) -> str:
    """``c0 * a * b + c1 * ...`` as one parenthesised expression, two terms a line if long."""
    parts = [_term(c, f, i == 0) for i, (c, f) in enumerate(terms)]
    one = " ".join(parts)
    if len(one) <= 80:
        return f"({one})"
    lines = [" ".join(parts[i : i + 2]) for i in range(0, len(parts), 2)]
    return "(\n    " + "\n    ".join(lines) + "\n)"


def _natural(name: str) -> tuple:
    """Sort key for generated names (``sb1_10_0`` after ``sb1_2_0``)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass
class _Kernel:
    """Mutable builder for one kernel's context."""

    ir: TensorProductIR
    out_blocks: list[int]
    tuning: Tuning
    params_x1: set = field(default_factory=set)
    params_x2: set = field(default_factory=set)
    params_w: set = field(default_factory=set)
    scalars: dict = field(default_factory=dict)  # name -> expr (insertion ordered)
    terms: int = 0
    has_uvw_batch_weights: bool = False


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


def _by_k(p: PathIR) -> dict[int, list]:
    ks: dict[int, list] = {}
    for n in p.nonzeros:
        ks.setdefault(n.k, []).append(n)
    return ks


def _reduce_over_x1(ir: TensorProductIR, p: PathIR) -> bool:
    """uvw: tile-loop over the larger input multiplicity, unroll the smaller."""
    return ir.in1[p.i_in1].mul >= ir.in2[p.i_in2].mul


def _path_terms(ir: TensorProductIR, p: PathIR) -> int:
    m1, m2 = ir.in1[p.i_in1].mul, ir.in2[p.i_in2].mul
    unroll = {"uvu": m2, "uvv": m1, "uuu": 1}.get(p.mode)
    if unroll is None:
        unroll = m2 if _reduce_over_x1(ir, p) else m1
    return len(p.nonzeros) * unroll


def _split(ir: TensorProductIR, tuning: Tuning) -> list[list[int]]:
    """Output blocks per kernel, in order: as few kernels as ``max_terms`` allows, balanced."""
    costs = [max(1, sum(_path_terms(ir, p) for p in ir.paths_into(o))) for o in range(len(ir.out))]
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


def _kernel_context(k: _Kernel, index: int) -> dict:
    ir, t = k.ir, k.tuning
    by_mul: dict[int, list[int]] = {}
    for o in k.out_blocks:
        by_mul.setdefault(ir.out[o].mul, []).append(o)
    channel_groups = []
    for mul, outs in by_mul.items():
        loads: dict[str, str] = {}
        out_ctx = []
        for o in outs:
            bo = ir.out[o]
            accs = [f"acc{o}_{kk}" for kk in range(bo.dim)]
            updates: list[str] = []
            reductions: dict[tuple[str, int], dict] = {}
            for p in ir.paths_into(o):
                _emit_path(k, p, loads, updates, reductions)
            stores = [f"out_{o}[tile_b, {kk}, tile_c] = acc{o}_{kk}" for kk in range(bo.dim)]
            out_ctx.append(
                {
                    "comment": f"# output block {o}: {_block_label(bo)} ({_plural(len(ir.paths_into(o)), 'path')})",
                    "accs": accs,
                    "dtype_of": f"out_{o}",
                    "updates": updates,
                    "reductions": list(reductions.values()),
                    "stores": stores,
                }
            )
        channel_groups.append(
            {
                "mul": mul,
                "block_c": min(_pow2(mul), t.block_c),
                "loads": [f"{n} = {loads[n]}" for n in sorted(loads, key=_natural)],
                "outs": out_ctx,
            }
        )
    params = (
        [f"x1_{i}" for i in sorted(k.params_x1)]
        + [f"x2_{i}" for i in sorted(k.params_x2)]
        + [f"w{i}" for i in sorted(k.params_w)]
        + [f"out_{o}" for o in k.out_blocks]
    )
    block_b = t.block_b_uvw if k.has_uvw_batch_weights else t.block_b
    return {
        "name": f"tp_fwd_{index}",
        "doc": (
            f"Output blocks {_ranges(k.out_blocks)}; "
            f"paths {_ranges(sorted(p.index for o in k.out_blocks for p in ir.paths_into(o))) or 'none'}."
        ),
        "params": params,
        "batch_param": params[0],
        "block_b": block_b,
        "num_warps": t.num_warps,
        "num_stages": t.num_stages,
        "scalars": [f"{n} = {k.scalars[n]}" for n in sorted(k.scalars, key=_natural)],
        "channel_groups": channel_groups,
        "x1_blocks": sorted(k.params_x1),
        "x2_blocks": sorted(k.params_x2),
        "weight_paths": sorted(k.params_w),
        "out_blocks": list(k.out_blocks),
    }


def _emit_path(k: _Kernel, p: PathIR, loads: dict, updates: list, reductions: dict) -> None:
    ir = k.ir
    b1, b2 = ir.in1[p.i_in1], ir.in2[p.i_in2]
    i1, i2, o = p.i_in1, p.i_in2, p.i_out
    shared = ir.shared_weights
    k.params_x1.add(i1)
    k.params_x2.add(i2)
    if p.has_weight:
        k.params_w.add(p.index)
    k.terms += _path_terms(ir, p)
    ks = _by_k(p)
    w = f"w{p.index}"

    def tiled(op: str, blk: int, m: int) -> str:
        name = f"{'a' if op == 'x1' else 'b'}{blk}_{m}"
        loads.setdefault(name, f"{op}_{blk}[tile_b, {m}, tile_c]")
        return name

    def scalar(op: str, blk: int, m: int, ch: int) -> str:
        name = f"s{'a' if op == 'x1' else 'b'}{blk}_{m}_{ch}"
        k.scalars.setdefault(name, f"{op}_{blk}[tile_b, {m}, {ch}][:, None]")
        return name

    if not p.nonzeros:
        return
    updates.append(_path_comment(ir, p))
    if p.mode == "uuu":
        wexpr = (f"{w}[tile_b, tile_c]" if not shared else f"{w}[tile_c][None, :]") if p.has_weight else None
        for kk, nzs in ks.items():
            s = _sum([(n.coeff, [tiled("x1", i1, n.i), tiled("x2", i2, n.j)]) for n in nzs])
            updates.append(_acc(o, kk, s, wexpr))
    elif p.mode in ("uvu", "uvv"):
        # uvu: channel u of x1 and out is tiled, v of x2 unrolled; uvv: the mirror image.
        n_unroll = b2.mul if p.mode == "uvu" else b1.mul
        for ch in range(n_unroll):
            if p.mode == "uvu":
                widx = f"tile_c, {ch}"
            else:
                widx = f"{ch}, tile_c"
            wexpr = (f"{w}[tile_b, {widx}]" if not shared else f"{w}[{widx}][None, :]") if p.has_weight else None
            for kk, nzs in ks.items():
                if p.mode == "uvu":
                    terms = [(n.coeff, [tiled("x1", i1, n.i), scalar("x2", i2, n.j, ch)]) for n in nzs]
                else:
                    terms = [(n.coeff, [scalar("x1", i1, n.i, ch), tiled("x2", i2, n.j)]) for n in nzs]
                updates.append(_acc(o, kk, _sum(terms), wexpr))
    elif p.mode == "uvw":
        over_x1 = _reduce_over_x1(ir, p)
        red_op, red_blk, red_b = ("x1", i1, b1) if over_x1 else ("x2", i2, b2)
        key = (red_op, red_blk)
        if key not in reductions:
            reductions[key] = {
                "comment": f"# reduction over the {red_b.mul} channels of {red_op} block {red_blk}",
                "mul": red_b.mul,
                "block_r": min(_pow2(red_b.mul), k.tuning.block_r),
                "loads": {},
                "updates": [],
            }
        red = reductions[key]
        rloads = red["loads"]

        def rtiled(op: str, blk: int, m: int) -> str:
            name = f"r{'a' if op == 'x1' else 'b'}{blk}_{m}"
            rloads.setdefault(name, f"{op}_{blk}[tile_b, {m}, tile_r]")
            return name

        n_unroll = b2.mul if over_x1 else b1.mul
        if p.has_weight and not shared:
            k.has_uvw_batch_weights = True
        red["updates"].append(_path_comment(ir, p))
        for ch in range(n_unroll):
            widx = f"tile_r, {ch}, tile_c" if over_x1 else f"{ch}, tile_r, tile_c"
            for kk, nzs in ks.items():
                if over_x1:
                    terms = [(n.coeff, [rtiled("x1", i1, n.i), scalar("x2", i2, n.j, ch)]) for n in nzs]
                else:
                    terms = [(n.coeff, [scalar("x1", i1, n.i, ch), rtiled("x2", i2, n.j)]) for n in nzs]
                # t: (tile_b, tile_r) products for this (v or u, k); then contract over tile_r
                red["updates"].append(f"t = {_sum(terms)}")
                if not p.has_weight:
                    contrib = "t.sum(1)[:, None]"
                elif shared:
                    contrib = f"(t[:, :, None] * {w}[{widx}][None, :, :]).sum(1)"
                else:
                    contrib = f"(t[:, :, None] * {w}[tile_b, {widx}]).sum(1)"
                red["updates"].append(f"acc{o}_{kk} = acc{o}_{kk} + {contrib}")
        updates.pop()  # the path comment lives in the reduction loop
    else:  # pragma: no cover - the spec validates modes
        raise ValueError(f"unknown mode {p.mode!r}")


def _acc(o: int, k: int, s: str, wexpr: str | None) -> str:
    rhs = f"{wexpr} * {s}" if wexpr else s
    return f"acc{o}_{k} = acc{o}_{k} + {rhs}"


def _finish_reductions(ctx: dict) -> dict:
    for g in ctx["channel_groups"]:
        for oc in g["outs"]:
            for r in oc["reductions"]:
                r["loads"] = [f"{n} = {r['loads'][n]}" for n in sorted(r["loads"], key=_natural)]
    return ctx


def kernel_context(ir: TensorProductIR, tuning: Tuning = DEFAULT_TUNING) -> list[dict]:
    """Context of every forward kernel of ``ir``."""
    out = []
    for idx, blocks in enumerate(_split(ir, tuning)):
        k = _Kernel(ir, blocks, tuning)
        out.append(_finish_reductions(_kernel_context(k, idx)))
    return out


def _views(blocks: tuple[Block, ...], src: str, prefix: str) -> list[str]:
    return [
        f"{prefix}_{b.index} = {src}[:, {b.offset}:{b.offset + b.size}].unflatten(1, ({b.dim}, {b.mul}))"
        for b in blocks
    ]


def _layouts_differ(blocks: tuple[Block, ...]) -> bool:
    return any(b.mul > 1 and b.dim > 1 for b in blocks)


def _weight_view(ir: TensorProductIR, p: PathIR) -> str:
    shape = ", ".join(str(s) for s in p.path_shape)
    lo, hi = p.weight_offset, p.weight_offset + p.weight_numel
    if ir.shared_weights:
        return f"w{p.index} = weights[{lo}:{hi}].unflatten(0, ({shape}{',' if len(p.path_shape) == 1 else ''}))"
    return f"w{p.index} = weights[:, {lo}:{hi}].unflatten(1, ({shape}{',' if len(p.path_shape) == 1 else ''}))"


def render_files(ir: TensorProductIR, header: str) -> dict[str, str]:
    kernels = kernel_context(ir)
    convert = ir.layout == "mul_ir"
    ops = {
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
        "in1_blocks": repr(tuple((b.mul, b.dim) for b in ir.in1)),
        "in2_blocks": repr(tuple((b.mul, b.dim) for b in ir.in2)),
        "out_blocks": repr(tuple((b.mul, b.dim) for b in ir.out)),
        "convert_in1": convert and _layouts_differ(ir.in1),
        "convert_in2": convert and _layouts_differ(ir.in2),
        "convert_out": convert and _layouts_differ(ir.out),
        "x1_views": _views(ir.in1, "x1", "x1"),
        "x2_views": _views(ir.in2, "x2", "x2"),
        "out_views": _views(ir.out, "out", "out"),
        "weight_views": [_weight_view(ir, p) for p in ir.paths if p.has_weight],
        "kernels": kernels,
        "n_paths": len(ir.paths),
    }
    return {
        "helion_kernels.py": render("helion_kernels.py.j2", header=header, name=ir.name, kernels=kernels, **_summary(ir)),
        "torch_ops.py": render("torch_ops.py.j2", header=header, **ops),
    }


def _summary(ir: TensorProductIR) -> dict:
    return {
        "irreps_in1": ir.irreps_in1,
        "irreps_in2": ir.irreps_in2,
        "irreps_out": ir.irreps_out,
        "n_paths": len(ir.paths),
        "n_nonzeros": sum(len(p.nonzeros) for p in ir.paths),
    }
