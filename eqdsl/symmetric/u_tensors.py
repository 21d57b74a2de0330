"""Exact generalized Clebsch-Gordan ("U") tensors of MACE's symmetric contraction.

``u_tensor(irreps, ir_out, nu, convention)`` equals mace-torch 0.3.16's
``mace.tools.cg.U_matrix_real(irreps, ir_out, nu, use_cueq_cg=False)[-1]`` (the e3nn
basis, normalization ``"component"``, what MACE's ``SymmetricContraction`` uses by default,
``use_reduced_cg=False``), exactly: the same construction as mace's ``_wigner_nj``, step by
step, on eqdsl's exact ``wigner_3j`` (``eqdsl.cg``) instead of e3nn's float tables.

mace's construction (``mace/tools/cg.py``), reproduced here:

* ``_wigner_nj([irreps] * n)`` lists "paths" ``(ir, C)``; ``C`` has shape
  ``(ir.dim, irreps.dim, ..., irreps.dim)`` (``n`` input axes). For ``n = 1`` one path per
  input irrep: ``C[m, offset + m] = 1``. For ``n > 1``, for each path ``(ir_left, C_left)``
  of ``n - 1`` factors (in their sorted order), for each input irrep ``ir`` (in irreps'
  order), for each ``ir_out`` in ``ir_left * ir`` (``l`` ascending; skipped unless in
  ``filter_ir_mid`` when one is given): ``C[i, ..., offset + l] = sum_j C_left[j, ...]
  * W[i, j, l]`` with ``W = wigner_3j(ir_out.l, ir_left.l, ir.l) * sqrt(2 ir_out.l + 1)``
  (normalization ``"component"``). The list is then stably sorted by ``ir`` (``(l, p)``).
* ``U_matrix_real`` stacks, along a new last axis ``k``, the ``C`` of the paths whose
  ``ir`` is ``ir_out``, in that sorted order. For ``nu == 4`` it passes
  ``filter_ir_mid = [(l, (-1)^l) for l < 12]`` (every intermediate and final irrep of
  natural parity). No path: mace returns a zero tensor with ``K = 1``; here ``K = 0``.

Exactness. The CG entries come from sympy (``eqdsl.cg.wigner_3j_exact``); the
contractions run in the field of rationals extended by square roots, each number held as
``{squarefree r: Fraction q}`` meaning ``sum q sqrt(r)`` (products of square roots
multiply radicands, so no sympy simplification is needed and the arithmetic stays exact
and fast). Results are memoized per ``(irreps, ir_out, nu, convention)``.

Pruning. Intermediate paths whose degree cannot couple back down to ``ir_out`` with the
factors left (``l > L + (nu - n) * lmax_in``) and final paths of another irrep are not
computed; this drops whole paths and keeps the relative (stable-sorted) order of the
others, so ``U`` is unchanged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

from ..cg import wigner_3j_exact
from ..irreps import Irrep, Irreps

__all__ = [
    "ExactReal", "UTensor", "u_tensor", "u_tensor_dense", "coupling_irreps", "mace_filter_ir_mid", "exact_to_float",
    "exact_to_str",
]

# an exact real number sum_r q_r sqrt(r): sorted ((r, q), ...) with r squarefree, q != 0
ExactReal = tuple[tuple[int, Fraction], ...]


def coupling_irreps(irreps: Irreps | str) -> tuple[Irrep, ...]:
    """The irreps of ``irreps`` without multiplicities, in order (mace's ``coupling_irreps``)."""
    return tuple(mi.ir for mi in Irreps(irreps))


def mace_filter_ir_mid(nu: int) -> tuple[Irrep, ...] | None:
    """mace's ``filter_ir_mid`` for ``U_matrix_real(..., correlation=nu, use_cueq_cg=False)``."""
    if nu == 4:
        return tuple(Irrep(l, 1 if l % 2 == 0 else -1) for l in range(12))
    return None


# ------------------------------------------------------------------ exact arithmetic


def _squarefree(n: int) -> tuple[int, int]:
    """``n = s^2 r`` with ``r`` squarefree: ``(s, r)`` (``n >= 1``, small)."""
    s, r, p = 1, 1, 2
    while p * p <= n:
        while n % (p * p) == 0:
            n //= p * p
            s *= p
        if n % p == 0:
            n //= p
            r *= p
        p += 1
    return s, r * n


def _from_sympy(v) -> dict[int, Fraction]:
    """A sympy number that is a sum of terms ``+-sqrt(rational)`` as ``{r: q}``."""
    import sympy
    out: dict[int, Fraction] = {}
    for term in sympy.Add.make_args(sympy.expand(v)):
        sq = term ** 2
        if not sq.is_Rational:
            raise ValueError(f"CG entry term {term} is not +-sqrt(rational)")
        p, q = int(sq.p), int(sq.q)  # term^2 = p / q, term = +-sqrt(p q) / q
        s, r = _squarefree(p * q)
        sign = 1 if term > 0 else -1
        out[r] = out.get(r, Fraction(0)) + Fraction(sign * s, q)
    return {r: q for r, q in out.items() if q != 0}


def _mul_into(acc: dict[int, Fraction], a: dict[int, Fraction], b: dict[int, Fraction]) -> None:
    """``acc += a * b`` in place."""
    for ra, qa in a.items():
        for rb, qb in b.items():
            g = math.gcd(ra, rb)
            r = (ra // g) * (rb // g)
            acc[r] = acc.get(r, 0) + qa * qb * g


def exact_to_float(v: ExactReal) -> float:
    """``sum q sqrt(r)`` as float64, rounded once from a 50-significant-digit evaluation."""
    with localcontext() as ctx:
        ctx.prec = 50
        s = sum((Decimal(q.numerator) / Decimal(q.denominator)) * Decimal(r).sqrt() for r, q in v)
        return float(s)


def exact_to_str(v: ExactReal) -> str:
    """``sum q sqrt(r)`` as text sympy can parse, e.g. ``'3/7*sqrt(10) - 1/2'``."""
    parts = []
    for r, q in v:
        mag = abs(q)
        t = str(mag) if r == 1 else (f"sqrt({r})" if mag == 1 else f"{mag}*sqrt({r})")
        parts.append(("-" if q < 0 else "+", t))
    if not parts:
        return "0"
    text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    return text + "".join(f" {s} {t}" for s, t in parts[1:])


def _from_sympy_int_sqrt(n: int) -> dict[int, Fraction]:
    """``sqrt(n)`` as ``{r: s}`` (``n = s^2 r``)."""
    s, r = _squarefree(n)
    return {r: Fraction(s)}


def _freeze(d: dict[int, Fraction]) -> ExactReal:
    return tuple(sorted((r, q) for r, q in d.items() if q != 0))


@functools.lru_cache(maxsize=None)
def _scaled_w3j(l_out: int, l_left: int, l_right: int, convention: str) -> dict[int, list]:
    """``wigner_3j(l_out, l_left, l_right) * sqrt(2 l_out + 1)`` as ``{j: [(i, l, value), ...]}``."""
    scale = _from_sympy_int_sqrt(2 * l_out + 1)
    by_j: dict[int, list] = {}
    for (i, j, l), v in wigner_3j_exact(l_out, l_left, l_right, convention):
        acc: dict[int, Fraction] = {}
        _mul_into(acc, _from_sympy(v), scale)
        by_j.setdefault(j, []).append((i, l, {r: q for r, q in acc.items() if q != 0}))
    return by_j


# ------------------------------------------------------------------ mace's _wigner_nj


# one path: (ir, {(m, i_1, ..., i_n): {r: q}})
_Path = tuple[Irrep, dict]


@functools.lru_cache(maxsize=None)
def _wigner_nj(irreps: tuple[Irrep, ...], n: int, filter_ir_mid: tuple[Irrep, ...] | None,
               convention: str, lcap: int, final: Irrep | None) -> tuple[_Path, ...]:
    """mace's ``_wigner_nj([irreps] * n, "component", filter_ir_mid)`` as exact sparse paths,
    sorted stably by irrep; only paths of degree ``<= lcap`` (and, if ``final`` is given,
    only those whose irrep is ``final``). Callers must not mutate the returned dicts."""
    offsets, o = [], 0
    for ir in irreps:
        offsets.append(o)
        o += ir.dim
    if n == 1:
        ret = []
        for ir, off in zip(irreps, offsets):
            if ir.l > lcap or (final is not None and ir != final):
                continue
            ret.append((ir, {(m, off + m): {1: Fraction(1)} for m in range(ir.dim)}))
        return tuple(sorted(ret, key=lambda p: (p[0].l, p[0].p)))
    lmax_in = max(ir.l for ir in irreps)
    left_paths = _wigner_nj(irreps, n - 1, filter_ir_mid, convention, lcap + lmax_in, None)
    ret = []
    for ir_left, c_left in left_paths:
        # c_left grouped by its output component j
        by_j: dict[int, list] = {}
        for idx, v in c_left.items():
            by_j.setdefault(idx[0], []).append((idx[1:], v))
        for ir, off in zip(irreps, offsets):
            for ir_out in ir_left * ir:
                if filter_ir_mid is not None and ir_out not in filter_ir_mid:
                    continue
                if ir_out.l > lcap or (final is not None and ir_out != final):
                    continue
                w = _scaled_w3j(ir_out.l, ir_left.l, ir.l, convention)
                acc: dict[tuple, dict[int, Fraction]] = {}
                for j, entries in by_j.items():
                    for i, l, wv in w.get(j, ()):
                        for rest, v in entries:
                            key = (i, *rest, off + l)
                            d = acc.get(key)
                            if d is None:
                                d = acc[key] = {}
                            _mul_into(d, v, wv)
                c = {}
                for key, d in acc.items():
                    d = {r: q for r, q in d.items() if q != 0}
                    if d:
                        c[key] = d
                ret.append((ir_out, c))
    return tuple(sorted(ret, key=lambda p: (p[0].l, p[0].p)))


@dataclass(frozen=True, eq=False)
class UTensor:
    """The exact U tensor of one output irrep and correlation order.

    Attributes:
        irreps: the input irreps (one copy each).
        ir_out: the output irrep.
        nu: the correlation order.
        convention: the CG sign convention (``eqdsl.cg.CG_CONVENTIONS``).
        num_params: ``K``, the number of paths (weights per channel).
        entries: sorted ``((m, i_1, ..., i_nu, k), ExactReal)`` nonzeros of
            ``U[m, i_1, ..., i_nu, k]``; ``m < 2L+1``, ``i < dim``, ``k < K``.
    """

    irreps: tuple[Irrep, ...]
    ir_out: Irrep
    nu: int
    convention: str
    num_params: int
    entries: tuple

    @property
    def dim(self) -> int:
        """Total dimension of the input irreps."""
        return sum(ir.dim for ir in self.irreps)

    def dense(self) -> np.ndarray:
        """float64 array ``(2L+1, dim, ..., dim, K)`` (``nu`` input axes), read-only."""
        return u_tensor_dense(self.irreps, self.ir_out, self.nu, self.convention)


@functools.lru_cache(maxsize=None)
def u_tensor(irreps: tuple[Irrep, ...], ir_out: Irrep, nu: int, convention: str = "e3nn-0.5") -> UTensor:
    """Exact ``U_matrix_real(irreps, ir_out, nu)[-1]`` of mace (e3nn basis, see module doc).

    Args:
        irreps: input irreps, one copy each (``coupling_irreps``), any order.
        ir_out: the output irrep.
        nu: correlation order, 1..4 (4 applies mace's natural-parity ``filter_ir_mid``).
        convention: ``eqdsl.cg.CG_CONVENTIONS`` (``"e3nn-0.4"``: e3nn 0.4.4's signs, which
            mace-torch 0.3.16 pins).

    Returns:
        A ``UTensor`` (memoized); ``num_params`` is 0 where mace has no path (mace then
        returns zeros with one parameter).

    Raises:
        ValueError: ``nu`` outside 1..4, or a CG the convention has no coefficients for.
    """
    if not 1 <= nu <= 4:
        raise ValueError(f"correlation order must be 1..4, got {nu}")
    irreps = tuple(irreps)
    paths = _wigner_nj(irreps, nu, mace_filter_ir_mid(nu), convention, ir_out.l, ir_out)
    entries = []
    for k, (_, c) in enumerate(paths):
        for idx, v in c.items():
            entries.append(((*idx, k), _freeze(v)))
    entries.sort()
    return UTensor(irreps, ir_out, nu, convention, len(paths), tuple(entries))


@functools.lru_cache(maxsize=None)
def u_tensor_dense(irreps: tuple[Irrep, ...], ir_out: Irrep, nu: int, convention: str = "e3nn-0.5") -> np.ndarray:
    """``u_tensor(...)`` as a read-only float64 array ``(2L+1, dim, ..., dim, K)``.

    mace's own tensor squeezes the ``2L+1`` axis for ``L = 0`` (and any other axis of size
    1) and has ``K = 1`` of zeros where this one has ``K = 0``.
    """
    t = u_tensor(tuple(irreps), ir_out, nu, convention)
    a = np.zeros((ir_out.dim, *([t.dim] * nu), t.num_params), dtype=np.float64)
    for idx, v in t.entries:
        a[idx] = exact_to_float(v)
    a.flags.writeable = False
    return a
