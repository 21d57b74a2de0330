"""eqdsl.symmetric.spec and .lower: [[symmetric_contraction]] tables, one SpecError per bad
spec naming file, table, key and reason; the IR's invariants."""

from __future__ import annotations

import json

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from eqdsl.errors import SpecError
from eqdsl.irreps import Irreps
from eqdsl.symmetric.ir import SymmetricContractionIR
from eqdsl.symmetric.lower import lower
from eqdsl.symmetric.spec import load_symmetric_specs, parse_symmetric_specs

FILE = "specs/bad.toml"
TABLE = "symmetric_contraction.0 (sc)"

GOOD = {
    "name": "sc",
    "irreps_in": "4x0e+4x1o+4x2e",
    "irreps_out": "4x0e+4x1o",
    "correlation": 3,
    "num_elements": 3,
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _toml(*tables: dict) -> str:
    out = []
    for t in tables:
        out.append("[[symmetric_contraction]]")
        out.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in t.items())
    return "\n".join(out) + "\n"


def _spec(**changes) -> dict:
    t = dict(GOOD)
    for k, v in changes.items():
        if v is None:
            t.pop(k, None)
        else:
            t[k] = v
    return t


def _one(**changes):
    (spec,) = parse_symmetric_specs(_toml(_spec(**changes)), FILE)
    return spec


def _error(text: str, filename: str = FILE, lowering: bool = False) -> SpecError:
    with pytest.raises(SpecError) as info:
        for spec in parse_symmetric_specs(text, filename):
            if lowering:
                lower(spec)
    err = info.value
    msg = str(err)
    assert type(err) is SpecError
    assert "\n" not in msg and "\r" not in msg, f"not one line: {msg!r}"
    assert msg.startswith(filename + ": ") and err.path == filename
    assert err.reason and msg.endswith(err.reason)
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__
    return err


def _assert_names(err: SpecError, table: str | None, key: str | None, *reason_words: str):
    msg = str(err)
    assert err.table == table, msg
    assert err.key == key, msg
    if table is not None:
        assert f"[{table}]" in msg
    if key is not None:
        assert f" {key}: " in msg or f": {key}: " in msg, msg
    for w in reason_words:
        assert w in err.reason, msg


# ---------------------------------------------------------------- good specs


def test_good_spec_defaults():
    spec = _one()
    assert spec.name == "sc" and spec.mul == 4
    assert spec.irreps_in == Irreps("4x0e+4x1o+4x2e") and spec.irreps_out == Irreps("4x0e+4x1o")
    assert spec.correlation == (3, 3) and spec.num_elements == 3
    assert (spec.layout, spec.dtypes, spec.basis, spec.cg_convention) == (
        "mul_ir", ("float32", "float64"), "e3nn", "e3nn-0.5")
    assert [str(ir) for ir in spec.coupling_irreps] == ["0e", "1o", "2e"]
    assert "\n" not in str(spec)


def test_good_spec_explicit_values_and_correlation_table():
    spec = _one(irreps_out="4x1o+4x0e", correlation={"0e": 2, "1o": 1}, layout="ir_mul",
                dtypes=["float64"], basis="e3nn", cg_convention="e3nn-0.4", num_elements=89)
    # one correlation per output block, in irreps_out's order (not the table's)
    assert spec.correlation == (1, 2)
    assert (spec.layout, spec.dtypes, spec.cg_convention, spec.num_elements) == ("ir_mul", ("float64",), "e3nn-0.4", 89)


def test_load_reads_a_file_and_ignores_tensor_products(tmp_path):
    p = tmp_path / "s.toml"
    tp = '[[tensor_product]]\nname = "tp"\nirreps_in1 = "0e"\nirreps_in2 = "0e"\nirreps_out = "0e"\nmode = "uvu"\n'
    p.write_text(tp + _toml(_spec(name="a"), _spec(name="b", correlation=1)), encoding="utf-8")
    a, b = load_symmetric_specs(p)
    assert (a.name, b.name, b.correlation) == ("a", "b", (1, 1))
    assert a.origin == (str(p), "symmetric_contraction.0 (a)")
    p.write_text(tp, encoding="utf-8")
    assert load_symmetric_specs(p) == ()


# ---------------------------------------------------------------- bad tables

BAD_TABLES = {
    "missing name": (_spec(name=None), "symmetric_contraction.0", "name", ["missing"]),
    "bad name": (_spec(name="import os"), "symmetric_contraction.0", "name", ["identifier"]),
    "keyword name": (_spec(name="class"), "symmetric_contraction.0", "name", ["identifier"]),
    "unknown key": (_spec(mode="uvu"), "symmetric_contraction.0", "mode", ["unknown key", "correlation"]),
    "missing irreps_in": (_spec(irreps_in=None), TABLE, "irreps_in", ["missing"]),
    "irreps_in not a string": (_spec(irreps_in=3), TABLE, "irreps_in", ["expected str"]),
    "bad irreps_in": (_spec(irreps_in="4x0e+4x1q"), TABLE, "irreps_in", ["'4x1q'"]),
    "empty irreps_in": (_spec(irreps_in=""), TABLE, "irreps_in", ["empty"]),
    "zero mul": (_spec(irreps_in="0x0e+0x1o"), TABLE, "irreps_in", ["positive"]),
    "two muls in": (_spec(irreps_in="4x0e+2x1o"), TABLE, "irreps_in", ["same multiplicity"]),
    "repeated irrep in": (_spec(irreps_in="4x0e+4x1o+4x0e"), TABLE, "irreps_in", ["'0e' appears twice"]),
    "missing irreps_out": (_spec(irreps_out=None), TABLE, "irreps_out", ["missing"]),
    "out mul differs": (_spec(irreps_out="4x0e+2x1o"), TABLE, "irreps_out", ["'2x1o'", "multiplicity 4"]),
    "missing correlation": (_spec(correlation=None), TABLE, "correlation", ["missing"]),
    "correlation 0": (_spec(correlation=0), TABLE, "correlation", ["1..4", "0"]),
    "correlation 5": (_spec(correlation=5), TABLE, "correlation", ["1..4", "5"]),
    "correlation bool": (_spec(correlation=True), TABLE, "correlation", ["1..4", "True"]),
    "correlation float": (_spec(correlation=3.0), TABLE, "correlation", ["1..4"]),
    "correlation string": (_spec(correlation="3"), TABLE, "correlation", ["1..4"]),
    "correlation table misses an output": (_spec(correlation={"0e": 2}), TABLE, "correlation", ["'1o'"]),
    "correlation table extra irrep": (_spec(correlation={"0e": 2, "1o": 2, "2e": 1}), TABLE, "correlation.2e",
                                      ["not an irrep of irreps_out"]),
    "correlation table bad value": (_spec(correlation={"0e": 2, "1o": 9}), TABLE, "correlation.1o", ["1..4"]),
    "correlation table with a repeated output": (
        _spec(irreps_out="4x0e+4x0e", correlation={"0e": 2}), TABLE, "correlation", ["'0e' appears twice"]),
    "missing num_elements": (_spec(num_elements=None), TABLE, "num_elements", ["missing"]),
    "num_elements 0": (_spec(num_elements=0), TABLE, "num_elements", [">= 1"]),
    "num_elements float": (_spec(num_elements=2.0), TABLE, "num_elements", ["expected int"]),
    "bad layout": (_spec(layout="row_major"), TABLE, "layout", ["'row_major'", "mul_ir, ir_mul"]),
    "bad dtypes": (_spec(dtypes=["float16"]), TABLE, "dtypes", ["float16"]),
    "empty dtypes": (_spec(dtypes=[]), TABLE, "dtypes", ["non-empty"]),
    "repeated dtypes": (_spec(dtypes=["float32", "float32"]), TABLE, "dtypes", ["distinct"]),
    "cuequivariance basis": (_spec(basis="cuequivariance"), TABLE, "basis",
                             ["not implemented", "reduced_symmetric_tensor_product_basis", "use_reduced_cg"]),
    "unknown basis": (_spec(basis="spherical"), TABLE, "basis", ["'spherical'", "e3nn"]),
    "bad cg_convention": (_spec(cg_convention="e3nn-0.6"), TABLE, "cg_convention", ["'e3nn-0.6'"]),
    # mace's construction asks e3nn 0.4.4 for wigner_3j(12, ., .) at order 3 with lmax_in = 4
    "e3nn-0.4 beyond its tables": (_spec(irreps_in="4x0e+4x4e", cg_convention="e3nn-0.4"), TABLE,
                                   "cg_convention", ["l = 11", "l = 12", "e3nn-0.5"]),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table(case):
    table, where, key, words = BAD_TABLES[case]
    _assert_names(_error(_toml(table)), where, key, *words)


def test_e3nn04_at_its_limit_is_accepted():
    # lmax_in 3, correlation 3: wigner_3j up to l = 9 <= 11; order 4 is filtered to l < 12
    assert _one(irreps_in="4x0e+4x3o", correlation=4, cg_convention="e3nn-0.4").correlation == (4, 4)


def test_output_no_order_reaches_is_refused_when_lowering():
    # 1e is not in 0e (x 0e ...): mace would keep a zero block; eqdsl refuses it
    err = _error(_toml(_spec(irreps_in="4x0e", irreps_out="4x0e+4x1e", correlation=2)), lowering=True)
    _assert_names(err, TABLE, "irreps_out", "'1e'", "no path", "always be 0")


def test_duplicate_name_names_second_table():
    err = _error(_toml(_spec(name="a"), _spec(name="b"), _spec(name="a")))
    _assert_names(err, "symmetric_contraction.2", "name", "duplicate", "'a'")


def test_error_in_later_table_names_it():
    err = _error(_toml(_spec(name="a"), _spec(name="b", layout="xx")))
    _assert_names(err, "symmetric_contraction.1 (b)", "layout", "'xx'")


@pytest.mark.parametrize(
    "text,key,words",
    [
        ("[[symmetric_contraction]\nname = 'x'\n", None, ["invalid TOML"]),
        ("version = 2\n" + _toml(GOOD), "version", ["unknown top-level key"]),
        ("symmetric_contraction = 3\n", "symmetric_contraction", ["array of tables"]),
        ("symmetric_contraction = [1]\n", "symmetric_contraction", ["array of tables"]),
    ],
)
def test_bad_file_level(text, key, words):
    _assert_names(_error(text), None, key, *words)


def test_unreadable_and_non_utf8_files(tmp_path):
    for path, word in ((tmp_path / "nope.toml", "cannot read file"), (tmp_path, "cannot read file")):
        with pytest.raises(SpecError) as info:
            load_symmetric_specs(path)
        assert str(info.value) == f"{path}: {info.value.reason}" and word in info.value.reason
    p = tmp_path / "latin1.toml"
    p.write_bytes(_toml(GOOD).encode() + b"# caf\xe9\n")
    with pytest.raises(SpecError, match="UTF-8"):
        load_symmetric_specs(p)


_VALUES = st.one_of(st.booleans(), st.integers(-3, 6), st.sampled_from(["", "4x0e", "4x0e+4x1o", "x", "e3nn"]),
                    st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.sampled_from(["0e", "1o"]),
                                                                               st.integers(0, 5), max_size=2))


@settings(max_examples=60)
@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["layout", "dtypes", "basis", "cg_convention"]), _VALUES,
                       max_size=3))
def test_fuzzed_tables_only_raise_spec_error(changes):
    try:
        parse_symmetric_specs(_toml(_spec(**changes)), FILE)
    except SpecError as e:
        assert "\n" not in str(e) and str(e).startswith(FILE + ": ")


# ---------------------------------------------------------------- the IR


def test_ir_invariants_and_weight_layout():
    spec = _one(correlation={"0e": 3, "1o": 2}, layout="ir_mul")
    ir = lower(spec)
    assert isinstance(ir, SymmetricContractionIR)
    assert (ir.irreps_in, ir.irreps_out, ir.mul, ir.dim_in, ir.out_dims) == ("4x0e+4x1o+4x2e", "4x0e+4x1o", 4, 9, (1, 3))
    assert (ir.correlation, ir.num_elements, ir.layout, ir.dtypes) == ((3, 2), 3, "ir_mul", ("float32", "float64"))
    # weights: block 0e (nu = 3, 2, 1), then block 1o (nu = 2, 1), each (K, mul)
    col = 0
    for o in range(2):
        assert len(ir.num_params[o]) == len(ir.weight_offsets[o]) == ir.correlation[o]
        for nu in range(ir.correlation[o], 0, -1):
            assert ir.weight_offsets[o][nu - 1] == col
            col += ir.num_params[o][nu - 1] * ir.mul
    assert ir.weight_numel == col
    # 0e at nu = 1: only 0e itself; 1o at nu = 1: only 1o
    assert ir.num_params[0][0] == ir.num_params[1][0] == 1
    keys = [(t.out, t.m, t.nu, t.k, t.monomial) for t in ir.terms]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for t in ir.terms:
        assert len(t.monomial) == t.nu and list(t.monomial) == sorted(t.monomial)
        assert 0 <= t.monomial[0] and t.monomial[-1] < ir.dim_in and 0 <= t.m < ir.out_dims[t.out]
        assert 0 <= t.k < ir.num_params[t.out][t.nu - 1] and t.coeff != 0.0
    # every (out, nu) with a path has terms; the nu = 1 terms are the identity on the output irrep's components
    assert [(t.out, t.m, t.monomial, t.coeff) for t in ir.terms if t.nu == 1] == [(0, 0, (0,), 1.0)] + [
        (1, m, (1 + m,), 1.0) for m in range(3)]


def test_coefficients_are_the_exact_values_rounded_once():
    ir = lower(_one(irreps_in="2x0e+2x1o+2x2e", irreps_out="2x0e+2x2e", correlation=3))
    for t in ir.terms[::7]:
        exact = sympy.sympify(t.coeff_exact)
        assert t.coeff == float(sympy.N(exact, 40)), (t, exact)


def test_lowering_is_deterministic():
    spec = _one(irreps_in="8x0e+8x1o+8x2e+8x3o", irreps_out="8x0e+8x1o", correlation=3, cg_convention="e3nn-0.4")
    a = lower(spec)
    assert lower(spec).to_json() == a.to_json()
    # MACE-MP's problem: K per order as mace-torch 0.3.16 builds it (U_matrix_real's last axis)
    assert a.num_params == ((1, 4, 23), (1, 6, 51))
    assert a.weight_numel == (1 + 4 + 23 + 1 + 6 + 51) * 8


def test_codegen_path_does_not_import_the_runtime_loader():
    """``eqdsl generate`` / ``eqdsl check`` import ``eqdsl.symmetric``; its run-time loader (file
    locks, the package cache) loads only on first use of ``load``, so checking works where only
    the generator's dependencies are installed."""
    import subprocess
    import sys

    code = ("import sys, eqdsl.symmetric, eqdsl.codegen.generate\n"
            "assert 'eqdsl.loader' not in sys.modules and 'filelock' not in sys.modules, sorted(sys.modules)\n"
            "from eqdsl.symmetric import load\n"
            "assert 'eqdsl.loader' in sys.modules and callable(load)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
