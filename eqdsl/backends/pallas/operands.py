"""Operand access of a Pallas kernel: which component tiles it reads, where, and once.

``Operands`` is shared by the kernel builders (``kernels.KernelBuilder``,
``fused.FusedBuilder``) by composition: one instance per kernel records what the kernel
has read (a vector component is read once per kernel, at the top level of the group that
first needs it, outside any loop; a looped column in the loop body), which
names are narrow ``(rows, 1)`` columns (for ``passes.factor_kernel``), and which lane
iotas the kernel needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import PathIR, TensorProductIR
from .plan import CHANNEL, DATA, VECTOR, BlockPlan, next_pow2
from .stmts import Comment, Flat, LoadTile, Offset, RadialRead, RadialRows, Read, Scaled, Unflatten

__all__ = ["Operands", "PathInfo", "component"]


@dataclass(frozen=True)
class PathInfo:
    """One path's channels as a kernel sees them.

    ``ch``: each data operand's channel letter (``plan.CHANNEL``); ``blk``: each data
    operand's ``plan.BlockPlan``; ``count``: the multiplicity of each channel ``u``, ``v``,
    ``w``; ``c``: the vectorized channel (``plan.VECTOR``), ``cpad`` its padded lanes;
    ``loopvars``: the other channels, looped over (none for ``uuu``).
    """

    ch: dict
    blk: dict
    count: dict
    c: str
    cpad: int
    loopvars: list


def component(n, op: str) -> int:
    """The component of operand ``op`` (``x1``, ``x2`` or ``g``) that CG nonzero ``n`` multiplies."""
    return {"x1": n.i, "x2": n.j, "g": n.k}[op]


def _index(var: str):
    """A loop variable as an ``Offset`` index: ``"0"`` (not looped) is none."""
    return None if var == "0" else var


class Operands:
    """Reads of one kernel's operands (``blocks``: ``plan.blocks`` per operand, ``wmap``:
    ``plan.weight_layout``; ``radial``: None, or ``H`` when the kernel is a ``conv_radial``
    kernel whose weights are formed on chip from ``rf_ref`` ``(rows, H)`` and ``wr_ref``
    ``(H, weight_numel)``, ``wload``).

    Attributes:
        loaded: names of the component tiles read so far.
        narrow: names of the ``(rows, 1)`` ones.
        lanes: the ``P`` of every lane iota ``lane_{P}`` the kernel uses.
    """

    def __init__(self, ir: TensorProductIR, blocks: dict, wmap: dict, radial: int | None = None):
        self.ir, self.blocks, self.wmap, self.radial = ir, blocks, wmap, radial
        self.loaded: set[str] = set()
        self.narrow: set[str] = set()
        self.lanes: set[int] = set()

    def block(self, op: str, p: PathIR) -> BlockPlan:
        """Operand ``op``'s block of path ``p``."""
        return self.blocks[op][{"x1": p.i_in1, "x2": p.i_in2, "g": p.i_out}[op]]

    def vec(self, op: str, blk: BlockPlan, m: int, top: list) -> str:
        """Name of component ``m`` of ``blk``, a ``(rows, pad)`` tile read once per kernel
        (appended to ``top`` the first time); a ``tile`` block is read whole, all its
        components at once."""
        name = f"{op}_{blk.index}_{m}"
        if name in self.loaded:
            return name
        comment = f"{op} block {blk.index} ({blk.desc})"
        if blk.tile:
            names = tuple(f"{op}_{blk.index}_{k}" for k in range(blk.dim))
            self.loaded.update(names)
            if blk.pad == 1:
                self.narrow.update(names)
            top.append(LoadTile(names, f"{op}_ref", blk.offset, blk.mul, blk.dim, blk.pad, comment))
            return name
        self.loaded.add(name)
        if blk.pad == 1:
            self.narrow.add(name)
        top.append(Read(name, f"{op}_ref", blk.offset + m * blk.mul, blk.mul, blk.pad, 1,
                        f"{comment}, m={m}"))
        return name

    def col(self, op: str, blk: BlockPlan, m: int, var: str, count: int, top: list, body: list) -> str:
        """Component ``m`` of ``op`` at channel ``var``: a ``(rows, 1)`` column read in the
        loop body ``body`` (``vec`` when the channel has one value)."""
        if count == 1:
            return self.vec(op, blk, m, top)
        name = f"{op}c_{m}"
        self.narrow.add(name)
        start = (Offset(blk.offset + m, _index(var), blk.dim) if blk.tile
                 else Offset(blk.offset + m * blk.mul, _index(var), 1))
        body.append(Read(name, f"{op}_ref", start, 1, 1, 1, f"{op} block {blk.index}, m={m}, channel {var}"))
        return name

    def lane(self, pad: int) -> str:
        """Name of the kernel's ``(1, pad)`` lane iota."""
        self.lanes.add(pad)
        return f"lane_{pad}"

    def info(self, p: PathIR) -> PathInfo:
        """Path ``p``'s channels and blocks."""
        ch = CHANNEL[p.mode]
        blk = {op: self.block(op, p) for op in DATA}
        count = {"u": blk["x1"].mul, "v": blk["x2"].mul, "w": blk["g"].mul}
        c = VECTOR[p.mode]
        cpad = blk["g"].pad if c == "w" else (blk["x1"].pad if c == "u" else blk["x2"].pad)
        loopvars = [] if p.mode == "uuu" else [v for v in ("u", "v") if v != c]
        return PathInfo(ch, blk, count, c, cpad, loopvars)

    def wstart(self, p: PathIR, info: PathInfo, env: dict, base: int | None = None) -> Offset:
        """First column of the path's weight vector (``env`` names the loop variables in
        scope: ``u``, ``v`` or the flattened ``t``); ``base``: the path's first column
        (default: its offset in the weights)."""
        w = self.wmap[p.index]
        base = w.offset if base is None else base
        if p.mode == "uvw":
            m2, mo = info.count["v"], info.count["w"]
            u, v = env.get("u", "0"), env.get("v", "0")
            if "t" in env:
                idx = env["t"]
            elif u == "0":
                idx = _index(v)
            elif v == "0":
                idx = Scaled(u, m2) if m2 != 1 else u
            else:
                idx = Flat(u, m2, v)
            return Offset(base, idx, mo)
        if p.mode == "uvu":
            return Offset(base, _index(env.get("v", "0")), 1)
        if p.mode == "uvv":
            return Offset(base, _index(env.get("u", "0")), w.m2)
        return Offset(base)

    def wload(self, p: PathIR, info: PathInfo, env: dict, top: list):
        """``w = `` the path's weight vector at the loop step ``env``: read from ``w_ref``, or
        for a radial kernel formed on chip (``RadialRead``: the kernel's radial feature rows,
        read once per kernel at the top level ``top`` of the group that first needs them,
        times the path's columns of ``wr_ref``)."""
        w = self.wmap[p.index]
        start = self.wstart(p, info, env)
        if self.radial is None:
            return Read("w", "w_ref", start, w.count, w.pad, w.stride)
        if "rf" not in self.loaded:
            self.loaded.add("rf")
            top.append(RadialRows("rf", "rf_ref", self.radial, next_pow2(self.radial)))
        return RadialRead("w", "rf", "wr_ref", start, w.count, w.pad, w.stride)

    def flat_loop(self, info: PathInfo) -> tuple[dict | None, dict, tuple]:
        """One loop over the active loop channels (flattened ``t`` when both): ``(loop,
        env, prelude)``, ``prelude`` the statements that open its body."""
        active = [v for v in info.loopvars if info.count[v] > 1]
        if not active:
            return None, {}, ()
        if len(active) == 1:
            return {"var": active[0], "count": info.count[active[0]]}, {active[0]: active[0]}, ()
        m2 = info.count["v"]
        return ({"var": "t", "count": info.count["u"] * m2}, {"u": "u", "v": "v", "t": "t"},
                (Unflatten("t", "u", "v", m2),))

    def desc(self, p: PathIR, info: PathInfo) -> Comment:
        """A comment naming path ``p``."""
        b = info.blk
        return Comment(f"path {p.index}: x1[{p.i_in1}] {b['x1'].desc} (x) x2[{p.i_in2}] {b['x2'].desc} -> "
                       f"out[{p.i_out}] {b['g'].desc}, {p.mode}, "
                       + (f"weights at {p.weight_offset}" if p.has_weight else "unweighted")
                       + f", {len(p.nonzeros)} nonzeros")

    @staticmethod
    def accs(blk: BlockPlan) -> list[str]:
        """Accumulator names of ``blk``'s components."""
        return [f"acc_{blk.index}_{m}" for m in range(blk.dim)]

    def names(self, p: PathIR, info: PathInfo, ops, env: dict, top: list, body: list) -> dict:
        """Per operand of ``ops``, the names of its components: vector tiles read in ``top``,
        looped columns in ``body``."""
        names = {}
        for op in ops:
            blk, var = info.blk[op], info.ch[op]
            if var == info.c:
                names[op] = [self.vec(op, blk, m, top) for m in range(blk.dim)]
            else:
                names[op] = [self.col(op, blk, m, env.get(var, "0"), info.count[var], top, body)
                             for m in range(blk.dim)]
        return names
