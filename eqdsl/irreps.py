"""Irreducible representations of O(3) with e3nn 0.6 semantics.

An irrep is ``(l, p)`` with ``l >= 0`` and parity ``p`` in ``{1, -1}``, written
``"1o"`` / ``"2e"``; its dimension is ``2l + 1``. ``Irreps`` is an ordered list of
``(mul, irrep)`` written ``"128x0e + 64x1o"`` as in ``e3nn.o3.Irreps``. Nothing here
sorts, merges or simplifies implicitly: the order given is the memory order.

Pure Python (no torch, no jax) so that the spec and lowering layers stay light.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

__all__ = ["Irrep", "MulIr", "Irreps", "IrrepsError"]


class IrrepsError(ValueError):
    """Raised for a malformed irrep or irreps string; the message says what is wrong."""


_IRREP_RE = re.compile(r"^(\d+)([eo])$")
_MUL_IR_RE = re.compile(r"^(?:(\d+)\s*x\s*)?(\d+[eo])$")


@dataclass(frozen=True, order=True)
class Irrep:
    """One irrep of O(3): degree ``l`` and parity ``p`` (+1 even ``e``, -1 odd ``o``)."""

    l: int
    p: int

    def __post_init__(self) -> None:
        if not isinstance(self.l, int) or isinstance(self.l, bool) or self.l < 0:
            raise IrrepsError(f"irrep degree l must be a non-negative int, got {self.l!r}")
        if self.p not in (1, -1):
            raise IrrepsError(f"irrep parity must be 1 or -1, got {self.p!r}")

    @classmethod
    def parse(cls, text: str) -> "Irrep":
        """Parse ``"2e"`` / ``"1o"``. Raises ``IrrepsError`` on anything else."""
        m = _IRREP_RE.match(text.strip())
        if m is None:
            raise IrrepsError(f"bad irrep {text!r}: expected <l><e|o>, e.g. '1o'")
        return cls(int(m.group(1)), 1 if m.group(2) == "e" else -1)

    @property
    def dim(self) -> int:
        return 2 * self.l + 1

    def __mul__(self, other: "Irrep") -> Iterator["Irrep"]:
        """Irreps in the product, ``l`` from ``|l1 - l2|`` to ``l1 + l2`` (e3nn's order)."""
        p = self.p * other.p
        for l in range(abs(self.l - other.l), self.l + other.l + 1):
            yield Irrep(l, p)

    def allowed(self, in1: "Irrep", in2: "Irrep") -> bool:
        """True if this irrep appears in ``in1 x in2`` (triangle and parity rules)."""
        return abs(in1.l - in2.l) <= self.l <= in1.l + in2.l and self.p == in1.p * in2.p

    def __str__(self) -> str:
        return f"{self.l}{'e' if self.p == 1 else 'o'}"


@dataclass(frozen=True)
class MulIr:
    """``mul`` copies of one irrep; occupies ``mul * ir.dim`` entries."""

    mul: int
    ir: Irrep

    def __post_init__(self) -> None:
        if not isinstance(self.mul, int) or isinstance(self.mul, bool) or self.mul < 0:
            raise IrrepsError(f"multiplicity must be a non-negative int, got {self.mul!r}")

    @property
    def dim(self) -> int:
        return self.mul * self.ir.dim

    def __iter__(self):  # allows ``mul, ir = mul_ir`` as in e3nn
        yield self.mul
        yield self.ir

    def __str__(self) -> str:
        return f"{self.mul}x{self.ir}"


class Irreps(tuple):
    """Ordered tuple of ``MulIr``, parsed from e3nn's notation.

    ``Irreps("128x0e + 64x1o")``; ``"0e"`` means ``1x0e``; ``""`` is the empty irreps.
    ``str`` gives e3nn's canonical spelling, and parsing it back gives an equal object.
    Raises ``IrrepsError`` for malformed text.
    """

    def __new__(cls, value: "str | Irreps | list | tuple" = ()) -> "Irreps":
        if isinstance(value, Irreps):
            return value
        if isinstance(value, str):
            items = []
            text = value.strip()
            if text:
                for term in text.split("+"):
                    m = _MUL_IR_RE.match(term.strip())
                    if m is None:
                        raise IrrepsError(
                            f"bad irreps term {term.strip()!r} in {value!r}: "
                            "expected <mul>x<l><e|o>, e.g. '64x1o'"
                        )
                    mul = int(m.group(1)) if m.group(1) is not None else 1
                    items.append(MulIr(mul, Irrep.parse(m.group(2))))
            return super().__new__(cls, items)
        items = []
        for item in value:
            if isinstance(item, MulIr):
                items.append(item)
            elif isinstance(item, Irrep):
                items.append(MulIr(1, item))
            else:
                mul, ir = item
                items.append(MulIr(mul, ir if isinstance(ir, Irrep) else Irrep.parse(str(ir))))
        return super().__new__(cls, items)

    @property
    def dim(self) -> int:
        return sum(mi.dim for mi in self)

    @property
    def num_irreps(self) -> int:
        return sum(mi.mul for mi in self)

    @property
    def lmax(self) -> int:
        if not self:
            raise IrrepsError("lmax of empty irreps")
        return max(mi.ir.l for mi in self)

    def slices(self) -> list[slice]:
        """``slice`` of each block in a flat vector (same for mul_ir and ir_mul layouts)."""
        out, start = [], 0
        for mi in self:
            out.append(slice(start, start + mi.dim))
            start += mi.dim
        return out

    def offsets(self) -> list[int]:
        return [s.start for s in self.slices()]

    def __add__(self, other) -> "Irreps":
        return Irreps(tuple(self) + tuple(Irreps(other)))

    def __getitem__(self, i):
        r = super().__getitem__(i)
        return Irreps(r) if isinstance(i, slice) else r

    def __str__(self) -> str:
        return "+".join(str(mi) for mi in self)

    def __repr__(self) -> str:
        return f"Irreps({str(self)!r})"
