"""eqdsl.cg: exact Clebsch-Gordan coefficients in e3nn's real basis, in both sign conventions."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from e3nn import o3

from eqdsl.cg import (
    CG_CONVENTIONS,
    E3NN_04_LMAX,
    convention_sign,
    nonzeros,
    scaled_nonzeros,
    wigner_3j,
    wigner_3j_exact,
)

# e3nn 0.4.4's o3.wigner_3j for every allowed triple with l <= 5, written by
# tests/data/make_e3nn044_wigner.py in a throwaway environment with e3nn 0.4.4
E3NN044 = Path(__file__).resolve().parent / "data" / "e3nn044_wigner_3j.npz"

LMAX = 6
TRIPLES = [
    (l1, l2, l3)
    for l1 in range(LMAX + 1)
    for l2 in range(LMAX + 1)
    for l3 in range(abs(l1 - l2), min(l1 + l2, LMAX) + 1)
]


def _e3nn(l1, l2, l3) -> np.ndarray:
    return o3.wigner_3j(l1, l2, l3, dtype=torch.float64).numpy()


def test_every_allowed_triple_up_to_l6_equals_e3nn():
    brute = [t for t in np.ndindex(LMAX + 1, LMAX + 1, LMAX + 1) if abs(t[0] - t[1]) <= t[2] <= t[0] + t[1]]
    assert sorted(TRIPLES) == sorted(brute) and len(TRIPLES) == 175
    worst = 0.0
    for l1, l2, l3 in TRIPLES:
        ours, theirs = wigner_3j(l1, l2, l3), _e3nn(l1, l2, l3)
        assert ours.shape == theirs.shape == (2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1)
        err = float(np.abs(ours - theirs).max())
        assert err <= 1e-12, f"wigner_3j{(l1, l2, l3)} differs from e3nn by {err}"
        # same sparsity: no entry that e3nn has as (numerically) zero is nonzero here
        assert np.array_equal(ours != 0, np.abs(theirs) > 1e-12), (l1, l2, l3)
        worst = max(worst, err)
    assert worst <= 1e-12


@pytest.mark.parametrize("l1,l2,l3", [(0, 0, 0), (1, 1, 2), (2, 3, 4), (3, 3, 6)])
def test_arrays_are_read_only_float64(l1, l2, l3):
    c = wigner_3j(l1, l2, l3)
    assert isinstance(c, np.ndarray)
    assert c.dtype == np.float64
    assert not c.flags.writeable
    with pytest.raises(ValueError):
        c[0, 0, 0] = 1.0
    # the cache hands out the same array, and nobody could have changed it
    assert wigner_3j(l1, l2, l3) is c


@pytest.mark.parametrize(
    "l1,l2,l3", [(0, 0, 1), (1, 1, 3), (2, 0, 1), (0, 3, 2), (1, 4, 2), (6, 1, 4), (2, 2, 5)]
)
def test_triangle_violation_raises(l1, l2, l3):
    with pytest.raises(ValueError, match="triangle"):
        wigner_3j(l1, l2, l3)
    with pytest.raises(ValueError, match="triangle"):
        wigner_3j_exact(l1, l2, l3)
    with pytest.raises(ValueError, match="triangle"):
        nonzeros(l1, l2, l3)


@pytest.mark.parametrize("args", [(-1, 0, 1), (0, -1, 1), (1, 0, -1)])
def test_negative_l_raises(args):
    with pytest.raises(ValueError):
        wigner_3j(*args)


@pytest.mark.parametrize("l1,l2,l3", [t for t in TRIPLES if max(t) <= 4])
def test_selection_properties(l1, l2, l3):
    c = wigner_3j(l1, l2, l3)
    d3 = 2 * l3 + 1
    # Frobenius norm 1
    assert abs(np.sum(c * c) - 1.0) < 1e-13
    # orthogonality: columns (fixed k) are orthogonal with squared norm 1 / (2 l3 + 1)
    m = c.reshape(-1, d3)
    np.testing.assert_allclose(m.T @ m, np.eye(d3) / d3, atol=1e-13)
    # exchanging the two inputs gives the same tensor up to (-1)^(l1 + l2 + l3)
    sign = (-1) ** (l1 + l2 + l3)
    np.testing.assert_allclose(wigner_3j(l2, l1, l3), sign * c.transpose(1, 0, 2), atol=1e-13)
    # nonzeros() lists exactly the nonzero entries, with their values
    nz = nonzeros(l1, l2, l3)
    assert len(nz) == int(np.count_nonzero(c))
    assert len({(i, j, k) for i, j, k, _ in nz}) == len(nz)
    for i, j, k, v in nz:
        assert v != 0.0 and c[i, j, k] == v


@pytest.mark.parametrize("l1,l2,l3", [(1, 1, 1), (1, 2, 3), (2, 2, 2), (3, 2, 4), (4, 4, 4)])
def test_invariant_under_rotations(l1, l2, l3):
    """C is an invariant tensor: D1 (x) D2 (x) D3 applied to C gives C back (e3nn's D matrices)."""
    torch.manual_seed(l1 * 100 + l2 * 10 + l3)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn builds its so(3) generators in the default dtype
    try:
        angles = o3.rand_angles()
        d1, d2, d3 = (o3.Irrep(l, 1).D_from_angles(*angles).numpy() for l in (l1, l2, l3))
    finally:
        torch.set_default_dtype(old)
    assert d1.dtype == np.float64
    c = wigner_3j(l1, l2, l3)
    rotated = np.einsum("ai,bj,ck,ijk->abc", d1, d2, d3, c)
    np.testing.assert_allclose(rotated, c, atol=1e-12)
    assert np.abs(c).max() > 0.05


def test_exact_values_are_exact():
    # 0 x l -> l is the identity over sqrt(2l + 1), exactly
    import sympy

    for l in range(4):
        exact = dict(wigner_3j_exact(0, l, l))
        assert exact == {(0, m, m): 1 / sympy.sqrt(2 * l + 1) for m in range(2 * l + 1)}
    # 1 x 1 -> 0 is the dot product over sqrt(3), in e3nn's basis too
    assert dict(wigner_3j_exact(1, 1, 0)) == {(m, m, 0): 1 / sympy.sqrt(3) for m in range(3)}


# ---------------------------------------------------------------- the e3nn 0.4 convention


def _e3nn044() -> dict[tuple[int, int, int], np.ndarray]:
    data = np.load(E3NN044)
    assert str(data["e3nn_version"]) == "0.4.4" and int(data["lmax"]) == 5
    return {tuple(int(x) for x in k.split(",")): data[k] for k in data.files if "," in k}


def test_e3nn04_convention_equals_e3nn_044_for_every_triple_up_to_l5():
    theirs_all = _e3nn044()
    brute = [t for t in np.ndindex(6, 6, 6) if abs(t[0] - t[1]) <= t[2] <= t[0] + t[1]]
    assert sorted(theirs_all) == sorted(brute) and len(brute) == 111
    for (l1, l2, l3), theirs in theirs_all.items():
        ours = wigner_3j(l1, l2, l3, "e3nn-0.4")
        assert ours.shape == theirs.shape
        err = float(np.abs(ours - theirs).max())
        assert err <= 1e-12, f"e3nn-0.4 wigner_3j{(l1, l2, l3)} differs from e3nn 0.4.4 by {err}"
        assert np.array_equal(ours != 0, np.abs(theirs) > 1e-12), (l1, l2, l3)
        # one sign per triple: the default convention times convention_sign
        sign = convention_sign(l1, l2, l3, "e3nn-0.4")
        assert sign in (1, -1)
        np.testing.assert_array_equal(ours, sign * wigner_3j(l1, l2, l3))


def test_e3nn04_negates_exactly_the_measured_triples_up_to_l4():
    """Measured with e3nn 0.4.4 against 0.6.0: (1,2,2), (1,3,3), (1,4,4) and their
    permutations are negated, the other 56 of the 65 triples with l <= 4 agree."""
    flipped = {t for t in TRIPLES if max(t) <= 4 and convention_sign(*t, "e3nn-0.4") == -1}
    expected = {p for l in (2, 3, 4) for p in ((1, l, l), (l, 1, l), (l, l, 1))}
    assert len([t for t in TRIPLES if max(t) <= 4]) == 65
    assert flipped == expected and len(flipped) == 9


def test_default_convention_is_e3nn_05_and_named():
    assert CG_CONVENTIONS == ("e3nn-0.5", "e3nn-0.4")
    for t in [(1, 2, 2), (2, 3, 4), (3, 3, 1)]:
        assert convention_sign(*t) == convention_sign(*t, "e3nn-0.5") == 1
        np.testing.assert_array_equal(wigner_3j(*t), wigner_3j(*t, "e3nn-0.5"))
        assert wigner_3j_exact(*t) == wigner_3j_exact(*t, "e3nn-0.5")


def test_e3nn04_signs_reach_the_scaled_nonzeros():
    alpha = Fraction(5, 3)
    for t in [(1, 2, 2), (2, 1, 2), (1, 1, 2)]:
        sign = convention_sign(*t, "e3nn-0.4")
        assert scaled_nonzeros(*t, alpha, "e3nn-0.4") == tuple(
            (i, j, k, sign * c) for i, j, k, c in scaled_nonzeros(*t, alpha)
        )
        assert nonzeros(*t, "e3nn-0.4") == tuple((i, j, k, sign * v) for i, j, k, v in nonzeros(*t))


def test_e3nn04_beyond_its_tables_and_unknown_conventions_raise():
    assert E3NN_04_LMAX == 11  # e3nn 0.4.4's constants.pt: l1 <= l2 <= l3 <= 11
    with pytest.raises(ValueError, match="l <= 11"):
        convention_sign(12, 1, 12, "e3nn-0.4")
    with pytest.raises(ValueError, match="l <= 11"):
        wigner_3j(0, 12, 12, "e3nn-0.4")
    assert convention_sign(0, 12, 12) == 1  # e3nn >= 0.5 has no such limit
    with pytest.raises(ValueError, match="unknown CG convention"):
        wigner_3j(1, 1, 0, "e3nn-0.3")
    with pytest.raises(ValueError, match="triangle"):
        convention_sign(1, 1, 3, "e3nn-0.4")
