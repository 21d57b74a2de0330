"""Exact Clebsch-Gordan coefficients in e3nn's real basis.

``wigner_3j(l1, l2, l3)`` equals ``e3nn.o3.wigner_3j(l1, l2, l3)``: the complex
Condon-Shortley Clebsch-Gordan coefficients (sympy, exact), moved to the real
spherical-harmonics basis with e3nn's ``change_basis_real_to_complex`` (which carries
a ``(-i)^l`` factor that makes the result real), then scaled to Frobenius norm 1.
Unitarity of the CG matrix makes the squared norm exactly ``2 l3 + 1``, so the scaling
is exact too. Only the final rounding to float64 is inexact.

Indices: ``C[i, j, k]`` with ``i`` over the ``2 l1 + 1`` components of ``l1``, ``j`` of
``l2`` and ``k`` of ``l3``, in e3nn's component order (l=1 ordered x, y, z for
``wigner_3j``, which equals e3nn-jax's ``clebsch_gordan``).

Sign conventions (``CG_CONVENTIONS``). The invariant tensor of a triple is unique up to
its sign, and e3nn changed the sign of some triples between 0.4 and 0.5:

* ``"e3nn-0.5"`` (default): ``e3nn.o3.wigner_3j`` of e3nn >= 0.5 (checked against 0.6.0)
  and e3nn-jax's ``clebsch_gordan``; the exact values above, no sign fixed by hand.
* ``"e3nn-0.4"``: ``e3nn.o3.wigner_3j`` of e3nn 0.4.x (checked against 0.4.4, which
  mace-torch 0.3.16 pins and pretrained MACE models were trained with). Derived here as
  one sign per triple from the same exact values, by e3nn 0.4.4's own construction
  (``e3nn/o3/_wigner.py``): it tabulated only ``l1 <= l2 <= l3``, each as the null
  vector of an eigenproblem with its sign fixed so that the ``m = (0, 0, 0)`` entry is
  positive, or where that entry is 0 the first nonzero entry in row-major order; any
  other order of ``(l1, l2, l3)`` is that table transposed, times ``(-1)^(l1+l2+l3)``
  for a transposition of two indices (the last matching branch of its ``if`` chain
  wins when two degrees are equal). For ``l <= 4`` this negates exactly (1, 2, 2),
  (1, 3, 3), (1, 4, 4) and their permutations. e3nn 0.4.4 tabulates ``l <= 11``
  (``E3NN_04_LMAX``); beyond that it has no coefficients and neither does this module.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

# sympy (exact CG) is imported where it is used: the runtime of a generated package
# imports eqdsl, and sympy costs seconds to import

__all__ = [
    "CG_CONVENTIONS", "DEFAULT_CG_CONVENTION", "E3NN_04_LMAX", "convention_sign", "wigner_3j", "wigner_3j_exact",
    "nonzeros", "scaled_nonzeros",
]

CG_CONVENTIONS = ("e3nn-0.5", "e3nn-0.4")
DEFAULT_CG_CONVENTION = "e3nn-0.5"
# e3nn 0.4.4's o3/constants.pt holds wigner_3j for l1 <= l2 <= l3 <= 11 only
E3NN_04_LMAX = 11


def _triangle(l1: int, l2: int, l3: int) -> bool:
    return abs(l1 - l2) <= l3 <= l1 + l2


@functools.lru_cache(maxsize=None)
def _real_to_complex(l: int) -> dict[tuple[int, int], sympy.Expr]:
    """Nonzeros of e3nn's ``change_basis_real_to_complex(l)`` as ``{(row, col): value}``.

    Rows index the complex basis ``m``, columns the real basis; same matrix as e3nn 0.6.
    """
    import sympy
    s = 1 / sympy.sqrt(2)
    q: dict[tuple[int, int], sympy.Expr] = {}
    for m in range(-l, 0):
        q[(l + m, l + abs(m))] = s
        q[(l + m, l - abs(m))] = -sympy.I * s
    q[(l, l)] = sympy.Integer(1)
    for m in range(1, l + 1):
        q[(l + m, l + abs(m))] = (-1) ** m * s
        q[(l + m, l - abs(m))] = sympy.I * (-1) ** m * s
    phase = (-sympy.I) ** l
    return {k: sympy.expand(phase * v) for k, v in q.items()}


@functools.lru_cache(maxsize=None)
def _wigner_3j_e3nn05(l1: int, l2: int, l3: int) -> tuple[tuple[tuple[int, int, int], sympy.Expr], ...]:
    """Exact nonzero entries ``((i, j, k), value)`` in the ``"e3nn-0.5"`` convention, sorted."""
    import sympy
    from sympy.physics.wigner import clebsch_gordan
    if min(l1, l2, l3) < 0 or not _triangle(l1, l2, l3):
        raise ValueError(f"wigner_3j: ({l1}, {l2}, {l3}) violates the triangle rule")
    q1, q2, q3 = _real_to_complex(l1), _real_to_complex(l2), _real_to_complex(l3)
    # Complex CG <l1 m1 l2 m2 | l3 m3>, nonzero only for m3 = m1 + m2.
    su2: dict[tuple[int, int, int], sympy.Expr] = {}
    for m1 in range(-l1, l1 + 1):
        for m2 in range(-l2, l2 + 1):
            m3 = m1 + m2
            if abs(m3) <= l3:
                c = clebsch_gordan(l1, l2, l3, m1, m2, m3)
                if c != 0:
                    su2[(l1 + m1, l2 + m2, l3 + m3)] = c
    by_row1: dict[int, list] = {}
    for (r, c), v in q1.items():
        by_row1.setdefault(r, []).append((c, v))
    by_row2: dict[int, list] = {}
    for (r, c), v in q2.items():
        by_row2.setdefault(r, []).append((c, v))
    by_row3: dict[int, list] = {}
    for (r, c), v in q3.items():
        by_row3.setdefault(r, []).append((c, sympy.conjugate(v)))
    # e3nn: einsum("ij,kl,mn,ikn->jlm", Q1, Q2, conj(Q3.T), C)
    acc: dict[tuple[int, int, int], sympy.Expr] = {}
    for (a, b, c), cg in su2.items():
        for j, v1 in by_row1[a]:
            for l_, v2 in by_row2[b]:
                for m, v3 in by_row3[c]:
                    key = (j, l_, m)
                    acc[key] = acc.get(key, 0) + v1 * v2 * v3 * cg
    norm = sympy.sqrt(2 * l3 + 1)
    out = []
    for key in sorted(acc):
        v = sympy.expand(acc[key] / norm)
        re_part, im_part = v.as_real_imag()
        if im_part != 0:
            raise AssertionError(f"wigner_3j({l1},{l2},{l3}){key} is not real: {v}")
        v = sympy.radsimp(re_part)
        if v != 0:
            out.append((key, v))
    return tuple(out)


# e3nn 0.4.4's wigner_3j(l1, l2, l3): which tabulated (sorted) triple it reads and how it
# transposes it, as the branches of its if-chain, in order: (condition on (l1, l2, l3),
# axes such that out[i0, i1, i2] = table[(i0, i1, i2)[a] for a in axes], odd permutation).
_E3NN04_BRANCHES = (
    (lambda a, b, c: a <= b <= c, (0, 1, 2), False),
    (lambda a, b, c: a <= c <= b, (0, 2, 1), True),
    (lambda a, b, c: b <= a <= c, (1, 0, 2), True),
    (lambda a, b, c: c <= b <= a, (2, 1, 0), True),
    (lambda a, b, c: b <= c <= a, (1, 2, 0), False),
    (lambda a, b, c: c <= a <= b, (2, 0, 1), False),
)


@functools.lru_cache(maxsize=None)
def _e3nn04_sign(l1: int, l2: int, l3: int) -> int:
    """``wigner_3j`` of e3nn 0.4.x divided by the ``"e3nn-0.5"`` one: +1 or -1, exactly."""
    import sympy
    ls = (l1, l2, l3)
    # the last branch that matches (e3nn 0.4.4 writes `if`, not `elif`)
    _, axes, odd = [br for br in _E3NN04_BRANCHES if br[0](*ls)][-1]
    table_ls = tuple(ls[a] for a in axes)
    table = dict(_wigner_3j_e3nn05(*table_ls))
    # the tabulated tensor's sign: m = (0, 0, 0) entry positive, else the first nonzero
    # entry in row-major order (the keys are sorted)
    pivot = table.get(table_ls, next(iter(table.values())))
    table_sign = 1 if pivot > 0 else -1
    factor = table_sign * ((-1) ** sum(ls) if odd else 1)
    ours = _wigner_3j_e3nn05(*ls)
    # out[i0, i1, i2] = table[i_axes[0], i_axes[1], i_axes[2]]: table axis n is output axis axes[n]
    inverse = tuple(axes.index(n) for n in range(3))
    theirs = {tuple(t[inverse[n]] for n in range(3)): factor * v for t, v in table.items()}
    # the two conventions differ by one sign per triple (the invariant is unique up to a
    # factor, and both have norm 1): find it, and check every entry to 40 digits
    (i0, v0) = ours[0]
    sign = 1 if (theirs[i0] > 0) == (v0 > 0) else -1
    if len(theirs) != len(ours) or any(abs(sympy.N(theirs.get(idx, 0) - sign * v, 40)) > 1e-35 for idx, v in ours):
        raise AssertionError(f"e3nn 0.4 wigner_3j{ls} is not +-1 times the e3nn 0.5 one")
    return sign


def convention_sign(l1: int, l2: int, l3: int, convention: str = DEFAULT_CG_CONVENTION) -> int:
    """+1 or -1: ``wigner_3j(l1, l2, l3)`` in ``convention`` divided by the ``"e3nn-0.5"`` one.

    Raises ``ValueError`` for an unknown convention, a triple that violates the triangle
    rule, or (``"e3nn-0.4"``) a degree above ``E3NN_04_LMAX``, where e3nn 0.4 has no
    coefficients.
    """
    if convention not in CG_CONVENTIONS:
        raise ValueError(f"unknown CG convention {convention!r}; expected one of {', '.join(CG_CONVENTIONS)}")
    if min(l1, l2, l3) < 0 or not _triangle(l1, l2, l3):
        raise ValueError(f"wigner_3j: ({l1}, {l2}, {l3}) violates the triangle rule")
    if convention == "e3nn-0.5":
        return 1
    if max(l1, l2, l3) > E3NN_04_LMAX:
        raise ValueError(
            f"wigner_3j({l1}, {l2}, {l3}): e3nn 0.4 tabulates l <= {E3NN_04_LMAX} only; "
            "use cg_convention 'e3nn-0.5'"
        )
    return _e3nn04_sign(l1, l2, l3)


@functools.lru_cache(maxsize=None)
def wigner_3j_exact(
    l1: int, l2: int, l3: int, convention: str = DEFAULT_CG_CONVENTION
) -> tuple[tuple[tuple[int, int, int], sympy.Expr], ...]:
    """Exact nonzero entries ``((i, j, k), value)`` of the normalized real-basis tensor,
    sorted by ``(i, j, k)``, in ``convention`` (``CG_CONVENTIONS``).

    Raises ``ValueError`` as ``convention_sign``.
    """
    sign = convention_sign(l1, l2, l3, convention)
    values = _wigner_3j_e3nn05(l1, l2, l3)
    return values if sign == 1 else tuple((key, -v) for key, v in values)


@functools.lru_cache(maxsize=None)
def nonzeros(
    l1: int, l2: int, l3: int, convention: str = DEFAULT_CG_CONVENTION
) -> tuple[tuple[int, int, int, float], ...]:
    """Nonzero entries ``(i, j, k, value)`` of ``wigner_3j(l1, l2, l3, convention)`` as float64."""
    import sympy
    return tuple((i, j, k, float(sympy.N(v, 40))) for (i, j, k), v in wigner_3j_exact(l1, l2, l3, convention))


@functools.lru_cache(maxsize=None)
def scaled_nonzeros(
    l1: int, l2: int, l3: int, alpha: Fraction, convention: str = DEFAULT_CG_CONVENTION
) -> tuple[tuple[int, int, int, float], ...]:
    """Nonzero entries ``(i, j, k, sqrt(alpha) * value)`` of ``wigner_3j(l1, l2, l3,
    convention)``, the product taken exactly and rounded to float64 once (``alpha >= 0``:
    the square of a path weight, ``eqdsl.instructions.normalized_path_alphas``).

    Rounding the two factors first, as e3nn does, leaves e.g. ``sqrt(3) * (1 / sqrt(3))``
    at ``0.9999999999999999``; exactly it is ``1.0``, and a coefficient of 1 costs the
    kernels no multiply. Entries whose product is 0 (``alpha == 0``) are dropped.
    """
    import sympy
    scale = sympy.sqrt(sympy.Rational(alpha.numerator, alpha.denominator))
    out = []
    for (i, j, k), v in wigner_3j_exact(l1, l2, l3, convention):
        c = float(sympy.N(scale * v, 40))
        if c != 0.0:
            out.append((i, j, k, c))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def wigner_3j(l1: int, l2: int, l3: int, convention: str = DEFAULT_CG_CONVENTION) -> np.ndarray:
    """``e3nn.o3.wigner_3j(l1, l2, l3)`` of the e3nn version that ``convention`` names, as a
    read-only float64 array ``(2l1+1, 2l2+1, 2l3+1)``.

    Raises ``ValueError`` as ``convention_sign``.
    """
    c = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1), dtype=np.float64)
    for i, j, k, v in nonzeros(l1, l2, l3, convention):
        c[i, j, k] = v
    c.flags.writeable = False
    return c
