"""Factoring a Pallas kernel's sums: fewer operations on the wide tiles.

A kernel's operands are of two widths: *wide* ``(rows, P)`` tiles, one value per
channel (``x1``, ``g``, a weight row), and *narrow* ``(rows, 1)`` columns, one value per
row (an ``x2`` block of one channel, e.g. the spherical harmonics of a ``uvu`` conv; a
column read inside a channel loop). An operation on a wide tile costs ``P / 32 /
num_warps`` times one on a narrow column per thread; on the H100 the JAX kernels are
issue-bound (ncu: 3.7 cycles per issued instruction in mace_large's fused conv
backward, 2026-11-25), so every wide operation saved is time saved.

``pallas_backend`` writes a sum as one term per CG nonzero, ``± c * f1 * f2 ...``.
This pass rewrites each sum (``sum`` statement) in two steps, both exact algebra (only
the rounding order changes):

1. Terms with the same wide factors are merged; their coefficients and narrow factors
   become one narrow column, computed first::

       c1 * x1_0 * x2_1 + c2 * x1_0 * x2_4   ->   n = c1 * x2_1 + c2 * x2_4;  n * x1_0

   (a forward term was two wide multiplies, ``c * x1`` then ``* x2``; it is now part of
   one multiply-add on ``x1_0``, ``(c * x2)`` being narrow).
2. Among terms with two or more wide factors, the factor most of them share is taken
   out, repeatedly::

       n1 * x1_0 * g_0 + n2 * x1_1 * g_0   ->   t = n1 * x1_0 + n2 * x1_1;  t * g_0

   (``2 m`` wide operations become ``m + 1``: the weight gradient of the fused backward).

Factors are the names and literals of a term (``pallas_backend._terms``); a sum with any
other term (e.g. a lane sum) is left as it is. Which names are narrow the kernel builder
knows (``_KernelBuilder.narrow``); a sum whose terms are all narrow makes its target
narrow too. New names are ``nf<k>`` (narrow) and ``wf<k>`` (wide), numbered per kernel.
Runs before ``pallas_backend._with_fma``, which turns each sum into a multiply-add chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["factor_kernel"]

_NAME = re.compile(r"^[A-Za-z_]\w*$")
_LITERAL = re.compile(r"^\d+(\.\d*)?(e-?\d+)?$")
_PREFIX = re.compile(r"^(?:(\w+) \+ (?:(\w+) \* )?)?$")


@dataclass(frozen=True)
class _Term:
    """``sign * coeff * narrow... * wide...``; ``coeff`` a literal's text or None for 1."""

    sign: str  # "+" or "-"
    coeff: str | None
    narrow: tuple[str, ...]
    wide: tuple[str, ...]

    def text(self, first: bool) -> str:
        body = " * ".join(([self.coeff] if self.coeff else []) + list(self.narrow) + list(self.wide)) or "1.0"
        if first:
            return ("- " if self.sign == "-" else "") + body
        return f"{self.sign} {body}"


def _parse(term: str, narrow: set[str]) -> _Term | None:
    sign = "+"
    if term[:2] in ("- ", "+ "):
        sign, term = term[0], term[2:]
    coeff, nf, wf = None, [], []
    for f in term.split(" * "):
        if _LITERAL.match(f):
            if coeff is not None:
                return None
            coeff = f
        elif _NAME.match(f):
            (nf if f in narrow else wf).append(f)
        else:
            return None
    return _Term(sign, coeff, tuple(nf), tuple(wf))


class _Namer:
    def __init__(self):
        self.count = 0

    def __call__(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"


def _sum_stmt(target: str, prefix: str, terms: list[_Term]) -> dict:
    return {"kind": "sum", "target": target, "prefix": prefix,
            "terms": [t.text(i == 0) for i, t in enumerate(terms)]}


def _merge_wide(terms: list[_Term], out: list[dict], narrow: set[str], new: _Namer) -> list[_Term]:
    """Step 1: one term per set of wide factors, its narrow part summed first."""
    groups: dict[tuple[str, ...], list[_Term]] = {}
    for t in terms:
        groups.setdefault(tuple(sorted(t.wide)), []).append(t)
    merged = []
    for group in groups.values():
        if len(group) == 1 or not all(t.narrow for t in group):
            merged.extend(group)  # nothing to merge, or a literal alone would be a narrow term
            continue
        name = new("nf")
        out.append(_sum_stmt(name, "", [_Term(t.sign, t.coeff, t.narrow, ()) for t in group]))
        narrow.add(name)
        merged.append(_Term("+", None, (name,), group[0].wide))
    return merged


def _take_out(terms: list[_Term], out: list[dict], new: _Namer) -> list[_Term]:
    """Step 2: the wide factor shared by most terms of two or more wide factors, taken out."""
    while True:
        counts: dict[str, int] = {}
        for t in terms:
            if len(t.wide) >= 2:
                for f in dict.fromkeys(t.wide):  # in order: ties go to the first seen (deterministic)
                    counts[f] = counts.get(f, 0) + 1
        best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
        if best[1] < 2:
            return terms
        f = best[0]
        group = [t for t in terms if len(t.wide) >= 2 and f in t.wide]
        rest = [t for t in terms if not (len(t.wide) >= 2 and f in t.wide)]
        name = new("wf")
        inner = []
        for t in group:
            wide = list(t.wide)
            wide.remove(f)
            inner.append(_Term(t.sign, t.coeff, t.narrow, tuple(wide)))
        out.append(_sum_stmt(name, "", inner))
        at = terms.index(group[0])
        terms = [t for t in terms[:at] if t in rest] + [_Term("+", None, (), (name, f))] \
            + [t for t in terms[at:] if t in rest]


def _factor_sum(stmt: dict, narrow: set[str], new: _Namer) -> list[dict]:
    prefix = _PREFIX.match(stmt["prefix"])
    terms = [_parse(t, narrow) for t in stmt["terms"]]
    if prefix is None or any(t is None for t in terms):
        return [stmt]
    out: list[dict] = []
    terms = _merge_wide(terms, out, narrow, new)
    terms = _take_out(terms, out, new)
    out.append(_sum_stmt(stmt["target"], stmt["prefix"], terms))
    scale_ok = all(n is None or n in narrow for n in prefix.groups())
    if scale_ok and not any(t.wide for t in terms):
        narrow.add(stmt["target"])
    return out


def _factor_body(stmts: list[dict], narrow: set[str], new: _Namer) -> list[dict]:
    out = []
    for st in stmts:
        if st["kind"] == "sum":
            out.extend(_factor_sum(st, narrow, new))
        elif st["kind"] == "loop":
            out.append({**st, "body": _factor_body(st["body"], narrow, new)})
        else:
            out.append(st)
    return out


def factor_kernel(kernel: dict) -> dict:
    """``kernel`` (a kernel context of ``pallas_backend``, with ``narrow``: the names of its
    ``(rows, 1)`` operands) with every sum of its body factored; see the module docstring."""
    narrow, new = set(kernel["narrow"]), _Namer()
    groups = [{**g, "body": _factor_body(g["body"], narrow, new)} for g in kernel["groups"]]
    return {**kernel, "groups": groups}
