"""Expression-level kernel IR: the arithmetic of a generated kernel body, as data.

Both code generators (Helion and Pallas) write a tensor product's kernels as
straight-line sums of products, one term per Clebsch-Gordan nonzero with its
coefficient as a literal (``eqdsl.ir.PathIR.nonzeros``). This module holds those
sums as frozen dataclasses, and the transformations on them as pure functions, so
that a backend transforms data and prints it once (each backend's printer); no code
is parsed back from text.

Vocabulary (every node prints itself as one line of Python, ``str(node)``):

* ``Var``: a named value the kernel holds (an operand tile, an accumulator).
* ``Term``: ``coeff * f1 * f2 ...``, ``coeff`` a float written as a literal
  (``repr``: round-trips exactly) and left out when it is ``±1`` (exact either way,
  one multiply less).
* ``Sum``: ``init + scale * (t1 + t2 + ...)``, ``init`` and ``scale`` optional: the
  update of an accumulator by one path's terms, scaled by that path's weight.
* ``Fma``: ``fma(a, b, c) = a * b + c`` rounded once; ``Assign`` binds a value to a
  ``Var``. ``fma_chain`` writes a ``Sum`` as a run of ``Assign``\\ s of ``Fma``.

Factors may be other expressions (e.g. a backend's lane reduction, any object with a
``__str__``); the transformations only rewrite sums whose factors are all ``Var``
(``is_plain``) and leave others as they are.

Transformations (exact algebra: only the rounding order changes):

* ``factor_sum`` takes common factors out of a sum (``pallas_factor = 1`` of the
  Pallas backend): on a GPU an operation on a ``(rows, P)`` channel tile costs ``P``
  lanes where one on a ``(rows, 1)`` column costs one, so merging the terms that share
  their wide factors saves wide operations (measured: mace_large's JAX conv fwd+bwd
  5,131 -> 4,642 us on an H100, 2026-11-25).
* ``fma_chain`` turns a sum into a chain of fused multiply-adds (``pallas_fma = 1``):
  XLA's Triton pipeline contracts none of a Pallas kernel's ``a * b + c`` into an FMA,
  so the chain saves one instruction and one rounding per term.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Union

__all__ = ["Var", "Term", "Sum", "Fma", "Assign", "Expr", "term", "is_plain", "factor_sum", "Factored",
           "fma_chain"]


@dataclass(frozen=True)
class Var:
    """A named value of a kernel: an operand tile, an accumulator, a temporary."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Term:
    """``coeff * f1 * f2 ...``; ``coeff`` a float literal (left out when ``±1``).

    ``str`` gives the term with its sign attached (``-0.5 * a * b``); with no factors and a
    coefficient of ``±1`` it is ``1.0`` / ``-1.0``. ``negative`` and ``body`` split it as a sum
    prints it (``a - 0.5 * b``).
    """

    coeff: float
    factors: tuple = ()

    @property
    def negative(self) -> bool:
        return self.coeff < 0

    @property
    def body(self) -> str:
        """The unsigned product: ``|coeff|`` (unless 1) then the factors, ``1.0`` when empty."""
        lit = [] if abs(self.coeff) == 1.0 else [repr(abs(float(self.coeff)))]
        return " * ".join(lit + [str(f) for f in self.factors]) or "1.0"

    def __str__(self) -> str:
        return ("-" if self.negative else "") + self.body


def term(coeff: float, *factors) -> Term:
    """``Term(coeff, factors)``, factors given as ``Var``\\ s or names (made ``Var``)."""
    return Term(float(coeff), tuple(Var(f) if isinstance(f, str) else f for f in factors))


@dataclass(frozen=True)
class Sum:
    """``init + scale * (t1 + t2 + ...)``; ``init`` / ``scale`` None when absent.

    ``str`` gives one line, signs as binary operators (``a + w * (x - 0.5 * y)``).
    """

    terms: tuple[Term, ...]
    init: Var | None = None
    scale: Var | None = None

    def terms_text(self) -> list[str]:
        """Each term as a line of a multi-line sum: the first bare (``-`` glued to it when
        negative, ``- 0.5 * a``), the others with their operator (``+ a``, ``- 0.5 * b``)."""
        out = []
        for i, t in enumerate(self.terms):
            out.append(("- " if t.negative else ("+ " if i else "")) + t.body)
        return out

    @property
    def prefix(self) -> str:
        """``"init + scale * "``, ``"init + "`` or ``""``: what precedes the parenthesized terms."""
        if self.init is None:
            return f"{self.scale} * " if self.scale is not None else ""
        return f"{self.init} + " + (f"{self.scale} * " if self.scale is not None else "")

    def __str__(self) -> str:
        body = " ".join(self.terms_text())
        return f"{self.prefix}({body})" if self.prefix else body


@dataclass(frozen=True)
class Fma:
    """``fma(a, b, c) = a * b + c`` with one rounding; printed ``{fn}(a, b, c)``.

    ``fn`` is the backend's name of the operation (Pallas: ``rt.fma``, inline PTX
    ``fma.rn`` on the GPU)."""

    a: object
    b: object
    c: object
    fn: str = "fma"

    def __str__(self) -> str:
        return f"{self.fn}({self.a}, {self.b}, {self.c})"


Expr = Union[Var, Term, Sum, Fma]


@dataclass(frozen=True)
class Assign:
    """``target = value``."""

    target: Var
    value: object

    def __str__(self) -> str:
        return f"{self.target} = {self.value}"


def is_plain(s: Sum) -> bool:
    """Whether every factor of every term of ``s`` is a ``Var`` (what the transformations rewrite)."""
    return all(isinstance(f, Var) for t in s.terms for f in t.factors)


# ------------------------------------------------------------------ factoring


@dataclass(frozen=True)
class Factored:
    """``factor_sum``'s result: ``defs`` to compute first, in order, then ``sum``.

    ``narrow``: the names of ``defs`` that are narrow columns (computed from narrow values
    only)."""

    defs: tuple[Assign, ...]
    sum: Sum
    narrow: frozenset[str]


def _split(t: Term, narrow: Collection[str]) -> tuple[tuple[Var, ...], tuple[Var, ...]]:
    return (tuple(f for f in t.factors if f.name in narrow), tuple(f for f in t.factors if f.name not in narrow))


def factor_sum(s: Sum, narrow: Collection[str], fresh: Callable[[str], str]) -> Factored:
    """``s`` with common factors taken out, in two steps.

    Factors named in ``narrow`` are cheap ``(rows, 1)`` columns, the others wide
    ``(rows, P)`` tiles. Every term is first written narrow factors first, then wide ones
    (each in their order).

    1. Terms with the same set of wide factors, each with at least one narrow factor,
       merge: their coefficients and narrow factors become one narrow sum ``nf``,
       computed first (``c1 x2_1 x1_0 + c2 x2_4 x1_0 -> nf = c1 x2_1 + c2 x2_4; nf x1_0``:
       the coefficient multiplies move onto a column).
    2. Among terms with two or more wide factors, the factor most of them share (ties: the
       first seen) is taken out, ``wf = sum of the rest; wf * f``, until none is shared by
       two (``2 m`` wide operations become ``m + 1``).

    Args:
        s: a sum with ``is_plain(s)``.
        narrow: names of the narrow values.
        fresh: ``fresh("nf")`` / ``fresh("wf")`` returns a new unused name (the caller
            numbers them; called once per new value, in order).

    Returns:
        ``Factored``; ``s`` unchanged (with reordered factors) when nothing is shared.

    Raises:
        ValueError: a factor of ``s`` is not a ``Var``.
    """
    if not is_plain(s):
        raise ValueError("factor_sum rewrites sums of products of Vars only")
    new_narrow: set[str] = set()
    defs: list[Assign] = []
    terms = []
    for t in s.terms:
        n, w = _split(t, narrow)
        terms.append(Term(t.coeff, n + w))
    # step 1: one term per set of wide factors, its narrow part summed first
    groups: dict[tuple[str, ...], list[Term]] = {}
    for t in terms:
        groups.setdefault(tuple(sorted(f.name for f in _split(t, narrow)[1])), []).append(t)
    merged: list[Term] = []
    for group in groups.values():
        if len(group) == 1 or not all(_split(t, narrow)[0] for t in group):
            merged.extend(group)  # nothing to merge, or a literal alone would be a narrow term
            continue
        name = fresh("nf")
        defs.append(Assign(Var(name), Sum(tuple(Term(t.coeff, _split(t, narrow)[0]) for t in group))))
        new_narrow.add(name)
        merged.append(Term(1.0, (Var(name),) + _split(group[0], narrow)[1]))
    # step 2: the wide factor shared by most terms of two or more wide factors, taken out
    is_narrow = lambda f: f.name in narrow or f.name in new_narrow  # noqa: E731
    terms = merged
    while True:
        counts: dict[Var, int] = {}
        for t in terms:
            wide = [f for f in t.factors if not is_narrow(f)]
            if len(wide) >= 2:
                for f in dict.fromkeys(wide):  # in order: ties go to the first seen (deterministic)
                    counts[f] = counts.get(f, 0) + 1
        best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
        if best[1] < 2:
            break
        f = best[0]
        taken = [len([g for g in t.factors if not is_narrow(g)]) >= 2 and f in t.factors for t in terms]
        inner = []
        for t, tk in zip(terms, taken):
            if tk:
                factors = list(t.factors)
                factors.remove(f)
                inner.append(Term(t.coeff, tuple(factors)))
        name = fresh("wf")
        defs.append(Assign(Var(name), Sum(tuple(inner))))
        at = taken.index(True)
        terms = ([t for t, tk in zip(terms[:at], taken[:at]) if not tk] + [Term(1.0, (Var(name), f))]
                 + [t for t, tk in zip(terms[at:], taken[at:]) if not tk])
    return Factored(tuple(defs), Sum(tuple(terms), s.init, s.scale), frozenset(new_narrow))


# ------------------------------------------------------------------ fma chains


def fma_chain(target: Var, s: Sum, fn: str = "fma") -> tuple[Assign, ...]:
    """``target = s`` as a chain of fused multiply-adds, one rounding per term.

    ``T = A + (t1 + t2 ...)`` becomes ``T = A; T = fma(t1', f1, T); ...`` (``T = A`` only
    when ``A`` is not ``T``); ``T = A + w * (t1 + ...)`` accumulates the terms in
    ``T_s`` first (``T_s = t1; T_s = fma(..)...``) and ends ``T = fma(w, T_s, A)``; without
    ``A`` the chain starts from the first term. Each term ``c * f1 ... fn`` becomes
    ``fma(c * f1 ... f(n-1), fn, acc)`` (``fma(c, f1, acc)`` for one factor, ``c`` written ``±1.0``
    when it is ``±1``): the term's sign goes on its first factor, as ``(-a) * b`` is
    ``-(a * b)`` exactly.

    Args:
        target: the variable assigned.
        s: a sum with ``is_plain(s)``, at least one term, each with at least one factor.
        fn: the backend's name of the fma (``Fma.fn``).

    Raises:
        ValueError: ``s`` is not plain, or has no terms.
    """
    if not is_plain(s) or not s.terms or not all(t.factors for t in s.terms):
        raise ValueError("fma_chain rewrites non-empty sums of products of one or more Vars only")
    acc = target if s.scale is None else Var(f"{target.name}_s")
    out: list[Assign] = []
    terms = list(s.terms)
    if s.init is not None and s.scale is None:
        if s.init != acc:
            out.append(Assign(acc, s.init))
    else:  # the chain starts from the first term
        out.append(Assign(acc, terms.pop(0)))
    for t in terms:
        *head, last = t.factors
        out.append(Assign(acc, Fma(Term(t.coeff, tuple(head)), last, acc, fn)))
    if s.scale is not None:
        out.append(Assign(target, Fma(s.scale, acc, s.init, fn) if s.init is not None else _times(s.scale, acc)))
    return tuple(out)


def _times(a: Var, b: Var) -> Term:
    return Term(1.0, (a, b))
