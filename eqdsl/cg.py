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
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import sympy
from sympy.physics.wigner import clebsch_gordan

__all__ = ["wigner_3j", "wigner_3j_exact", "nonzeros", "scaled_nonzeros"]


def _triangle(l1: int, l2: int, l3: int) -> bool:
    return abs(l1 - l2) <= l3 <= l1 + l2


@functools.lru_cache(maxsize=None)
def _real_to_complex(l: int) -> dict[tuple[int, int], sympy.Expr]:
    """Nonzeros of e3nn's ``change_basis_real_to_complex(l)`` as ``{(row, col): value}``.

    Rows index the complex basis ``m``, columns the real basis; same matrix as e3nn 0.6.
    """
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
def wigner_3j_exact(l1: int, l2: int, l3: int) -> tuple[tuple[tuple[int, int, int], sympy.Expr], ...]:
    """Exact nonzero entries ``((i, j, k), value)`` of the normalized real-basis tensor.

    Raises ``ValueError`` if ``(l1, l2, l3)`` violates the triangle rule.
    """
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


@functools.lru_cache(maxsize=None)
def nonzeros(l1: int, l2: int, l3: int) -> tuple[tuple[int, int, int, float], ...]:
    """Nonzero entries ``(i, j, k, value)`` of ``wigner_3j(l1, l2, l3)`` as float64."""
    return tuple((i, j, k, float(sympy.N(v, 40))) for (i, j, k), v in wigner_3j_exact(l1, l2, l3))


@functools.lru_cache(maxsize=None)
def scaled_nonzeros(l1: int, l2: int, l3: int, alpha: Fraction) -> tuple[tuple[int, int, int, float], ...]:
    """Nonzero entries ``(i, j, k, sqrt(alpha) * value)`` of ``wigner_3j(l1, l2, l3)``, the
    product taken exactly and rounded to float64 once (``alpha >= 0``: the square of a
    path weight, ``eqdsl.instructions.normalized_path_alphas``).

    Rounding the two factors first, as e3nn does, leaves e.g. ``sqrt(3) * (1 / sqrt(3))``
    at ``0.9999999999999999``; exactly it is ``1.0``, and a coefficient of 1 costs the
    kernels no multiply. Entries whose product is 0 (``alpha == 0``) are dropped.
    """
    scale = sympy.sqrt(sympy.Rational(alpha.numerator, alpha.denominator))
    out = []
    for (i, j, k), v in wigner_3j_exact(l1, l2, l3):
        c = float(sympy.N(scale * v, 40))
        if c != 0.0:
            out.append((i, j, k, c))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def wigner_3j(l1: int, l2: int, l3: int) -> np.ndarray:
    """``e3nn.o3.wigner_3j(l1, l2, l3)`` as a read-only float64 array ``(2l1+1, 2l2+1, 2l3+1)``.

    Raises ``ValueError`` if the triple violates the triangle rule.
    """
    c = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1), dtype=np.float64)
    for i, j, k, v in nonzeros(l1, l2, l3):
        c[i, j, k] = v
    c.flags.writeable = False
    return c
