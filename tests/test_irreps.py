"""eqdsl.irreps: parsing, printing and layout arithmetic, checked against e3nn.o3.Irreps."""

from __future__ import annotations

import pytest
from e3nn import o3
from hypothesis import given, settings
from hypothesis import strategies as st

from eqdsl.irreps import Irrep, Irreps, IrrepsError, MulIr

# A list of (mul, l, parity) triples; parity as e3nn writes it (1 even, -1 odd).
_TRIPLES = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 12), st.sampled_from([1, -1])), min_size=0, max_size=8
)


def _irreps(triples) -> Irreps:
    return Irreps([MulIr(m, Irrep(l, p)) for m, l, p in triples])


def _term(mul: int, l: int, p: int) -> str:
    return f"{mul}x{l}{'e' if p == 1 else 'o'}"


# ---------------------------------------------------------------- str <-> parse


@given(_TRIPLES)
def test_str_parse_round_trip(triples):
    irreps = _irreps(triples)
    text = str(irreps)
    assert Irreps(text) == irreps
    assert str(Irreps(text)) == text
    assert text == "+".join(_term(*t) for t in triples)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 99),
            st.integers(0, 9),
            st.sampled_from([1, -1]),
            st.booleans(),  # drop the "1x" of a multiplicity 1
            st.sampled_from(["", " ", "  ", "\t"]),  # whitespace around '+' and 'x'
        ),
        min_size=1,
        max_size=6,
    )
)
def test_parse_accepts_e3nn_spellings(items):
    parts = []
    for mul, l, p, short, ws in items:
        ir = f"{l}{'e' if p == 1 else 'o'}"
        parts.append(ir if (short and mul == 1) else f"{mul}{ws}x{ws}{ir}")
    text = (items[0][4] + "+" + items[0][4]).join(parts)
    got = Irreps(text)
    assert [(mi.mul, mi.ir.l, mi.ir.p) for mi in got] == [(m, l, p) for m, l, p, _, _ in items]
    assert str(got) == str(o3.Irreps(text))


def test_single_irrep_means_multiplicity_one():
    assert Irreps("1o") == Irreps("1x1o")
    assert str(Irreps("2e")) == "1x2e"
    assert Irreps("") == Irreps() == Irreps([])
    assert len(Irreps("")) == 0 and Irreps("").dim == 0


# ---------------------------------------------------------------- structure


def test_mul_l_parity_fields():
    irreps = Irreps("3x2o + 1x0e + 12x1e")
    assert [mi.mul for mi in irreps] == [3, 1, 12]
    assert [mi.ir.l for mi in irreps] == [2, 0, 1]
    assert [mi.ir.p for mi in irreps] == [-1, 1, 1]
    mul, ir = irreps[0]  # e3nn-style unpacking
    assert (mul, ir) == (3, Irrep(2, -1))
    assert Irrep.parse("2o") == Irrep(2, -1) and Irrep.parse("0e") == Irrep(0, 1)
    assert str(Irrep(3, -1)) == "3o" and str(Irrep(4, 1)) == "4e"
    assert Irrep(3, 1).dim == 7
    assert MulIr(4, Irrep(2, 1)).dim == 20
    assert irreps.num_irreps == 16
    assert irreps.lmax == 2


def test_dim_slices_offsets_hand_example():
    irreps = Irreps("2x0e+3x1o+1x2e+0x3o+4x0o")
    assert irreps.dim == 2 + 9 + 5 + 0 + 4
    assert irreps.slices() == [slice(0, 2), slice(2, 11), slice(11, 16), slice(16, 16), slice(16, 20)]
    assert irreps.offsets() == [0, 2, 11, 16, 16]


def test_no_implicit_sort_or_merge():
    irreps = Irreps("1x1o+2x0e+3x1o+1x0e+1x0e")
    assert str(irreps) == "1x1o+2x0e+3x1o+1x0e+1x0e"
    assert len(irreps) == 5
    assert [mi.mul for mi in irreps] == [1, 2, 3, 1, 1]
    both = Irreps("2x1o") + Irreps("1x0e") + "2x1o"
    assert str(both) == "2x1o+1x0e+2x1o"
    assert isinstance(both, Irreps)
    sub = irreps[1:3]
    assert isinstance(sub, Irreps) and str(sub) == "2x0e+3x1o"
    assert isinstance(irreps[0], MulIr)
    # order matters for equality: the order is the memory order
    assert Irreps("1x0e+1x1o") != Irreps("1x1o+1x0e")


def test_irreps_is_immutable_and_hashable():
    irreps = Irreps("2x1o+1x0e")
    assert hash(irreps) == hash(Irreps("2x1o + 1x0e"))
    with pytest.raises(TypeError):
        irreps[0] = MulIr(1, Irrep(0, 1))  # type: ignore[index]
    with pytest.raises(AttributeError):
        irreps[0].mul = 5  # type: ignore[misc]


@given(st.integers(0, 6), st.sampled_from([1, -1]), st.integers(0, 6), st.sampled_from([1, -1]))
def test_irrep_product_and_allowed_match_e3nn(l1, p1, l2, p2):
    a, b = Irrep(l1, p1), Irrep(l2, p2)
    ours = [str(x) for x in a * b]
    theirs = [str(x) for x in o3.Irrep(l1, p1) * o3.Irrep(l2, p2)]
    assert ours == theirs
    for lo in range(0, 14):
        for po in (1, -1):
            assert Irrep(lo, po).allowed(a, b) == (str(Irrep(lo, po)) in theirs)


# ---------------------------------------------------------------- against e3nn


@settings(max_examples=200)
@given(_TRIPLES)
def test_agrees_with_e3nn(triples):
    ours = _irreps(triples)
    theirs = o3.Irreps([(m, (l, p)) for m, l, p in triples])
    assert str(ours) == str(theirs)
    assert ours.dim == theirs.dim
    assert ours.num_irreps == theirs.num_irreps
    assert ours.slices() == theirs.slices()
    assert len(ours) == len(theirs)
    if triples and all(m > 0 for m, _, _ in triples):
        # e3nn's lmax ignores 0x blocks (and fails when all are 0x); eqdsl counts every block
        assert ours.lmax == theirs.lmax
    # and each side parses the other's text to the same thing
    assert str(o3.Irreps(str(ours))) == str(ours)
    assert Irreps(str(theirs)) == ours


@settings(max_examples=300)
@given(st.text(alphabet="0123456789xeo+ ", max_size=14))
def test_parser_is_a_subset_of_e3nn(text):
    """Whatever eqdsl accepts, e3nn accepts and reads the same; eqdsl fails only with IrrepsError."""
    try:
        ours = Irreps(text)
    except IrrepsError:
        return
    assert str(o3.Irreps(text)) == str(ours)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "text",
    [
        "1x1o+",
        "+1x1o",
        "1x1o++0e",
        "x1o",
        "1e1",
        "-1x0e",
        "1x-1o",
        "1.5x0e",
        "1xx1o",
        "1o1e",
        "abc",
        "0ee",
        "1X1o",
        "1x1O",
        "1x1",
        "o",
        "1y",  # e3nn reads 'y' as parity (-1)^l; eqdsl accepts only e/o
        "2x1o, 1x0e",
        "1x1o\n+",
    ],
)
def test_bad_strings_raise_irreps_error(text):
    with pytest.raises(IrrepsError) as info:
        Irreps(text)
    assert isinstance(info.value, ValueError)
    assert str(info.value)  # the message says what is wrong


@pytest.mark.parametrize("text", ["", "1", "1x1o", "e", "-1e", "1.0e", "1oe", "x", "1 e"])
def test_bad_irrep_raises(text):
    with pytest.raises(IrrepsError):
        Irrep.parse(text)


def test_irrep_parse_strips_whitespace():
    assert Irrep.parse(" 1e\n") == Irrep(1, 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Irrep(-1, 1),
        lambda: Irrep(1, 0),
        lambda: Irrep(1, 2),
        lambda: Irrep(True, 1),
        lambda: Irrep(1.0, 1),
        lambda: MulIr(-1, Irrep(0, 1)),
        lambda: MulIr(True, Irrep(0, 1)),
        lambda: Irreps("").lmax,
    ],
)
def test_bad_values_raise_irreps_error(make):
    with pytest.raises(IrrepsError):
        make()
