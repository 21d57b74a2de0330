"""eqdsl.spec: every bad spec gives one SpecError naming file, table, key and reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqdsl.backends import check_tuning
from eqdsl.errors import SpecError
from eqdsl.instructions import Instruction
from eqdsl.irreps import Irreps
from eqdsl.lower import lower
from eqdsl.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]
FILE = "specs/bad.toml"
TABLE = "tensor_product.0 (tp)"  # how errors name the first table once its name is known

GOOD = {
    "name": "tp",
    "irreps_in1": "2x0e+2x1o",
    "irreps_in2": "0e+1o",
    "irreps_out": "0e+1o",
    "mode": "uvu",
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
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
        out.append("[[tensor_product]]")
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


def _error(text: str, filename: str = FILE) -> SpecError:
    with pytest.raises(SpecError) as info:
        for spec in parse_spec(text, filename):
            check_tuning(spec)  # the backends own the tuning keys: checked before generating
    return _check_one_error(info.value, filename)


def _check_one_error(err: SpecError, filename: str) -> SpecError:
    assert type(err) is SpecError
    msg = str(err)
    assert "\n" not in msg and "\r" not in msg, f"not one line: {msg!r}"
    assert msg.startswith(filename + ": ")
    assert err.path == filename
    assert err.reason and msg.endswith(err.reason)
    # ONE error: nothing chained that a traceback would print
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


# ---------------------------------------------------------------- the good case and defaults


def test_good_spec_defaults():
    (spec,) = parse_spec(_toml(GOOD), FILE)
    assert spec.name == "tp"
    assert spec.irrep_normalization == "component"
    assert spec.path_normalization == "element"
    assert spec.shared_weights is True
    assert spec.layout == "mul_ir"
    assert spec.dtypes == ("float32", "float64")
    assert spec.mode == "uvu"
    assert spec.irreps_in1 == Irreps("2x0e+2x1o") and spec.irreps_in2 == Irreps("1x0e+1x1o")
    assert spec.irreps_out_filter == Irreps("0e+1o")
    # uvu: one mul x ir_out block per path, in path order
    # (0e x 0e -> 0e, 0e x 1o -> 1o, 1o x 0e -> 1o, 1o x 1o -> 0e; 1e and 2e are filtered out)
    assert str(spec.irreps_out) == "2x0e+2x1o+2x1o+2x0e"
    assert [i.as_tuple() for i in spec.instructions] == [
        (0, 0, 0, "uvu", True, 1.0),
        (0, 1, 1, "uvu", True, 1.0),
        (1, 0, 2, "uvu", True, 1.0),
        (1, 1, 3, "uvu", True, 1.0),
    ]
    assert (spec.output_order, spec.instruction_order, spec.cg_convention) == ("paths", "paths", "e3nn-0.5")
    assert "\n" not in str(spec)


def test_good_spec_explicit_values():
    t = _spec(
        mode=None,
        irreps_out="3x1e+2x0e",
        instructions=[[1, 1, 0, "uvw", True], [0, 0, 1, "uvu", False, 0.5], [1, 1, 1, "uvu", True, 2]],
        irrep_normalization="norm",
        path_normalization="path",
        shared_weights=False,
        layout="ir_mul",
        dtypes=["float64", "float32"],
    )
    (spec,) = parse_spec(_toml(t), FILE)
    assert spec.mode is None
    assert spec.irreps_out == spec.irreps_out_filter == Irreps("3x1e+2x0e")
    assert spec.instructions == (
        Instruction(1, 1, 0, "uvw", True, 1.0),
        Instruction(0, 0, 1, "uvu", False, 0.5),
        Instruction(1, 1, 1, "uvu", True, 2.0),
    )
    assert isinstance(spec.instructions[2].path_weight, float)
    assert (spec.irrep_normalization, spec.path_normalization) == ("norm", "path")
    assert spec.shared_weights is False and spec.layout == "ir_mul"
    assert spec.dtypes == ("float32", "float64")  # canonical order
    # explicit instructions: the output and the instruction order are the file's
    assert (spec.output_order, spec.instruction_order) == ("given", "given")


# ---------------------------------------------------------------- output order, CG convention

# GOOD's paths, in path order: 0e x 0e -> 0e (block 0), 0e x 1o -> 1o (1), 1o x 0e -> 1o (2), 1o x 1o -> 0e (3)


def _one(**changes):
    (spec,) = parse_spec(_toml(_spec(**changes)), FILE)
    return spec


def test_sorted_output_renumbers_and_orders_instructions_as_mace():
    spec = _one(output_order="sorted", instruction_order="output")
    # e3nn's Irreps.sort(): by irrep, ties in path order (block 0 before 3, 1 before 2); never merged
    assert str(spec.irreps_out) == "2x0e+2x0e+2x1o+2x1o"
    # i_out renumbered (0 -> 0, 1 -> 2, 2 -> 3, 3 -> 1), then sorted by i_out (MACE, SevenNet, Nequix)
    assert [i.as_tuple()[:3] for i in spec.instructions] == [(0, 0, 0), (1, 1, 1), (0, 1, 2), (1, 0, 3)]
    assert (spec.output_order, spec.instruction_order) == ("sorted", "output")


def test_sorted_output_with_instructions_in_path_order_as_nequip():
    spec = _one(output_order="sorted", instruction_order="paths")
    assert str(spec.irreps_out) == "2x0e+2x0e+2x1o+2x1o"
    # NequIP renumbers i_out but keeps the instructions, hence the weights, in path order
    assert [i.as_tuple()[:3] for i in spec.instructions] == [(0, 0, 0), (0, 1, 2), (1, 0, 3), (1, 1, 1)]
    assert lower(spec).weight_numel == lower(_one()).weight_numel == 8


def test_sorted_puts_odd_before_even_as_e3nn():
    # e3nn's Irrep is the tuple (l, p), p = -1 for odd: 0o < 0e < 1o < 1e
    spec = _one(irreps_in1="1x1e+2x0e+3x0o", irreps_in2="0e", irreps_out="0e+0o+1e", output_order="sorted",
                instruction_order="output")
    assert str(spec.irreps_out) == "3x0o+2x0e+1x1e"
    assert [i.as_tuple()[:3] for i in spec.instructions] == [(2, 0, 0), (1, 0, 1), (0, 0, 2)]


def test_paths_order_ignores_instruction_order():
    # in path order i_out already increases along the paths: both instruction orders agree
    assert _one(instruction_order="output").instructions == _one().instructions


@pytest.mark.parametrize("order", ["paths", "sorted"])
def test_explicit_multiplicities_are_the_exact_output(order):
    out = {"paths": "2x0e+2x1o+2x1o+2x0e", "sorted": "2x0e+2x0e+2x1o+2x1o"}[order]
    spec = _one(irreps_out=out, output_order=order, instruction_order="output")
    assert str(spec.irreps_out) == out
    # one term with a multiplicity is enough ("1o" then means 1x1o)
    spec = _one(irreps_in1="1x0e+1x1o", irreps_out="1x0e+1o+1o+0e")
    assert str(spec.irreps_out) == "1x0e+1x1o+1x1o+1x0e"


def test_bare_filter_keeps_its_meaning_with_mul_1_when_it_is_the_output():
    # multiplicity 1 everywhere and the filter spells the output itself: both readings agree
    spec = _one(irreps_in1="0e+1o", irreps_in2="1o", irreps_out="1o+0e+1e+2e")
    assert str(spec.irreps_out) == "1x1o+1x0e+1x1e+1x2e"
    spec = _one(irreps_in1="0e+1o", irreps_in2="1o", irreps_out="0e+1o+1e+2e", output_order="sorted",
                instruction_order="output")
    assert str(spec.irreps_out) == "1x0e+1x1o+1x1e+1x2e"
    # a filter that does not list the output's irreps one by one is a filter
    spec = _one(irreps_in1="0e+1o", irreps_in2="0e+1o", irreps_out="1o+0e")
    assert str(spec.irreps_out) == "1x0e+1x1o+1x1o+1x0e"


@pytest.mark.parametrize("convention", ["e3nn-0.5", "e3nn-0.4"])
def test_cg_convention_is_recorded(convention):
    assert _one(cg_convention=convention).cg_convention == convention
    assert _one(cg_convention=convention, mode=None, irreps_out="2x0e",
                instructions=[[0, 0, 0, "uvu", True]]).cg_convention == convention


def test_radial_features_is_recorded():
    (spec,) = parse_spec(_toml(_spec(conv=True, shared_weights=False, radial_features=16)), FILE)
    assert spec.radial_features == 16
    (spec,) = parse_spec(_toml(_spec(conv=True, shared_weights=False)), FILE)
    assert spec.radial_features is None


def test_tuning_table():
    (spec,) = parse_spec(_toml(GOOD), FILE)
    assert spec.tuning == ()
    (spec,) = parse_spec(_toml(_spec(tuning={"num_warps": 8, "block_b": 32, "maxnreg_partials": 0})), FILE)
    assert spec.tuning == (("block_b", 32), ("maxnreg_partials", 0), ("num_warps", 8))
    # the TOML sub-table form, as `eqdsl tune` writes it
    (spec,) = parse_spec(_toml(GOOD) + "[tensor_product.tuning]\nblock_c = 64\n", FILE)
    assert spec.tuning == (("block_c", 64),)
    # per-op sub-tables: "<op>.<key>" pairs, applied over the top-level keys for that op only
    (spec,) = parse_spec(_toml(GOOD) + "[tensor_product.tuning]\nblock_c = 64\n[tensor_product.tuning.fwd]\nblock_c = 32\nnum_warps = 8\n", FILE)
    assert spec.tuning == (("block_c", 64), ("fwd.block_c", 32), ("fwd.num_warps", 8))
    from eqdsl.backends.helion.tuning import tuning_for

    assert (tuning_for(spec.tuning, "fwd").block_c, tuning_for(spec.tuning, "fwd").num_warps) == (32, 8)
    assert (tuning_for(spec.tuning, "bwd_x1").block_c, tuning_for(spec.tuning, "bwd_x1").num_warps) == (64, 4)
    (spec,) = parse_spec(_toml(GOOD) + "[tensor_product.tuning]\ngrid_c = 0\n", FILE)
    assert spec.tuning == (("grid_c", 0),)


def test_several_tables_keep_order_and_specs_are_frozen():
    specs = parse_spec(_toml(_spec(name="a"), _spec(name="b", mode="uvw", irreps_out="3x1o")), FILE)
    assert [s.name for s in specs] == ["a", "b"]
    assert isinstance(specs, tuple)
    with pytest.raises(AttributeError):
        specs[0].name = "c"  # type: ignore[misc]


def test_load_spec_reads_a_file(tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text(_toml(GOOD), encoding="utf-8")
    assert load_spec(p) == parse_spec(_toml(GOOD), str(p))


# ---------------------------------------------------------------- bad tables

# (changes to GOOD, key blamed, words of the reason)
BAD_TABLES = {
    "unknown key": (dict(colour="red"), "colour", ["unknown key"]),
    "misspelt key": (dict(irrep_normalisation="norm"), "irrep_normalisation", ["unknown key"]),
    "bad irreps string": (dict(irreps_in1="2x1q"), "irreps_in1", ["bad irreps"]),
    "bad irreps in2": (dict(irreps_in2="1o+"), "irreps_in2", ["bad irreps"]),
    "bad irreps out": (dict(irreps_out="1xo"), "irreps_out", ["bad irreps"]),
    "empty irreps": (dict(irreps_in2=""), "irreps_in2", ["empty"]),
    "zero multiplicity": (dict(irreps_in1="0x0e+1x1o"), "irreps_in1", ["positive"]),
    "missing name": (dict(name=None), "name", ["missing"]),
    "missing irreps_in1": (dict(irreps_in1=None), "irreps_in1", ["missing"]),
    "missing irreps_in2": (dict(irreps_in2=None), "irreps_in2", ["missing"]),
    "missing irreps_out": (dict(irreps_out=None), "irreps_out", ["missing"]),
    "name wrong type": (dict(name=5), "name", ["expected str", "int"]),
    "irreps wrong type": (dict(irreps_in1=["0e"]), "irreps_in1", ["expected str", "list"]),
    "shared_weights wrong type": (dict(shared_weights="yes"), "shared_weights", ["expected bool"]),
    "shared_weights int": (dict(shared_weights=1), "shared_weights", ["expected bool"]),
    "mode wrong type": (dict(mode=1), "mode", ["expected str"]),
    "layout wrong type": (dict(layout=1), "layout", ["expected str"]),
    "dtypes wrong type": (dict(dtypes="float32"), "dtypes", ["expected list"]),
    "instructions wrong type": (dict(mode=None, instructions="uvw"), "instructions", ["expected list"]),
    "bad dtype": (dict(dtypes=["float16"]), "dtypes", ["float16"]),
    "empty dtypes": (dict(dtypes=[]), "dtypes", ["non-empty"]),
    "repeated dtype": (dict(dtypes=["float32", "float32"]), "dtypes", ["distinct"]),
    "dtype not a string": (dict(dtypes=[32]), "dtypes", ["float32"]),
    "bad layout": (dict(layout="mul_ir_mul"), "layout", ["mul_ir_mul", "mul_ir", "ir_mul"]),
    "bad irrep_normalization": (dict(irrep_normalization="integral"), "irrep_normalization", ["integral", "component"]),
    "bad path_normalization": (dict(path_normalization="fan_in"), "path_normalization", ["fan_in", "element"]),
    "bad mode": (dict(mode="uvx"), "mode", ["uvx", "uvw"]),
    "conv wrong type": (dict(conv={"reduce": "sum"}), "conv", ["expected bool"]),
    "reduce without conv": (dict(reduce="sum"), "reduce", ["conv = true"]),
    "deterministic without conv": (dict(deterministic=True), "deterministic", ["conv = true"]),
    "bad reduce": (dict(conv=True, reduce="max"), "reduce", ["max", "sum", "mean"]),
    "deterministic wrong type": (dict(conv=True, deterministic="yes"), "deterministic", ["expected bool"]),
    "radial_features without conv": (dict(radial_features=64, shared_weights=False), "radial_features",
                                     ["conv = true"]),
    "radial_features shared weights": (dict(conv=True, radial_features=64), "radial_features",
                                       ["shared_weights = false"]),
    "radial_features zero": (dict(conv=True, shared_weights=False, radial_features=0), "radial_features",
                             ["positive integer", "0"]),
    "radial_features bool": (dict(conv=True, shared_weights=False, radial_features=True), "radial_features",
                             ["expected int"]),
    "radial_features unweighted path": (
        dict(conv=True, shared_weights=False, radial_features=8, mode=None,
             instructions=[[0, 0, 0, "uvu", True], [1, 1, 0, "uvu", False]], irreps_out="2x0e"),
        "radial_features", ["every path weighted"]),
    "both mode and instructions": (dict(instructions=[[0, 0, 0, "uvu", True]]), "mode", ["mode", "instructions"]),
    "mode gives no path": (dict(irreps_in1="1o", irreps_in2="1o", irreps_out="0o"), "irreps_out", ["no path"]),
    "uuu mode with no equal multiplicities": (
        dict(irreps_in1="2x0e", irreps_in2="3x0e", irreps_out="0e", mode="uuu"), "irreps_out", ["no path"]),
    # explicit instructions
    "index out of range (out)": (dict(mode=None, instructions=[[0, 0, 5, "uvu", True]]), "instructions",
                                 ["i_out=5", "out of range"]),
    "index out of range (in1)": (dict(mode=None, instructions=[[2, 0, 0, "uvu", True]]), "instructions",
                                 ["i_in1=2", "out of range"]),
    "negative index": (dict(mode=None, instructions=[[0, -1, 0, "uvu", True]]), "instructions", ["out of range"]),
    "parity violation": (dict(mode=None, irreps_out="2x0o", instructions=[[0, 0, 0, "uvu", True]]),
                         "instructions", ["parity"]),
    "triangle violation": (dict(mode=None, irreps_out="2x3e", instructions=[[1, 1, 0, "uvu", True]]),
                           "instructions", ["triangle"]),
    "triangle violation 0 x 1 -> 2": (dict(mode=None, irreps_out="2x2o", instructions=[[0, 1, 0, "uvu", True]]),
                                      "instructions", ["triangle"]),
    "uvu multiplicity mismatch": (dict(mode=None, irreps_out="3x0e", instructions=[[0, 0, 0, "uvu", True]]),
                                  "instructions", ["uvu", "mul_in1 == mul_out"]),
    "uvv multiplicity mismatch": (dict(mode=None, irreps_out="2x0e", instructions=[[0, 0, 0, "uvv", True]]),
                                  "instructions", ["uvv", "mul_in2 == mul_out"]),
    "uuu multiplicity mismatch in2": (dict(mode=None, irreps_out="2x0e", instructions=[[0, 0, 0, "uuu", True]]),
                                      "instructions", ["uuu", "mul_in1 == mul_in2"]),
    "uuu multiplicity mismatch out": (dict(mode=None, irreps_in2="2x0e", irreps_out="3x0e",
                                           instructions=[[0, 0, 0, "uuu", True]]),
                                      "instructions", ["uuu", "mul_in1 == mul_out"]),
    "unknown instruction mode": (dict(mode=None, instructions=[[0, 0, 0, "uvx", True]]), "instructions", ["uvx"]),
    "uvw without weight": (dict(mode=None, irreps_out="7x0e", instructions=[[0, 0, 0, "uvw", False]]),
                           "instructions", ["has_weight"]),
    "instruction too short": (dict(mode=None, instructions=[[0, 0, 0, "uvu"]]), "instructions[0]", ["expected"]),
    "instruction too long": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True, 1.0, 2]]), "instructions[0]",
                             ["expected"]),
    "instruction not a list": (dict(mode=None, instructions=[{"i_in1": 0}]), "instructions[0]", ["expected"]),
    "instruction index not int": (dict(mode=None, instructions=[[0, 0.0, 0, "uvu", True]]), "instructions[0]",
                                  ["i_in2", "integer"]),
    "instruction index bool": (dict(mode=None, instructions=[[True, 0, 0, "uvu", True]]), "instructions[0]",
                               ["i_in1", "integer"]),
    "instruction mode not str": (dict(mode=None, instructions=[[0, 0, 0, 3, True]]), "instructions[0]", ["mode"]),
    "has_weight not bool": (dict(mode=None, instructions=[[0, 0, 0, "uvu", 1]]), "instructions[0]", ["has_weight"]),
    "negative path_weight": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True, -1.0]]), "instructions[0]",
                             ["path_weight"]),
    "nan path_weight": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True, float("nan")]]), "instructions[0]",
                        ["path_weight"]),
    "inf path_weight": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True, float("inf")]]), "instructions[0]",
                        ["path_weight"]),
    "path_weight not a number": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True, "1"]]), "instructions[0]",
                                 ["path_weight"]),
    "second instruction is bad": (dict(mode=None, instructions=[[0, 0, 0, "uvu", True], [0, 0]]), "instructions[1]",
                                  ["expected"]),
    "duplicate instruction": (dict(mode=None, irreps_out="2x0e", instructions=[[0, 0, 0, "uvu", True], [0, 0, 0, "uvu", False]]),
                              "instructions", ["twice"]),
    "no instructions": (dict(mode=None, instructions=[]), "instructions", ["at least one"]),
    # output order, instruction order, CG convention
    "bad output_order": (dict(output_order="e3nn"), "output_order", ["'e3nn'", "paths", "sorted"]),
    "bad instruction_order": (dict(instruction_order="weights"), "instruction_order", ["'weights'", "output"]),
    "output_order with instructions": (dict(mode=None, output_order="sorted", instructions=[[0, 0, 0, "uvu", True]]),
                                       "output_order", ["explicit instructions", "as written"]),
    "instruction_order with instructions": (dict(mode=None, instruction_order="paths",
                                                 instructions=[[0, 0, 0, "uvu", True]]),
                                            "instruction_order", ["explicit instructions"]),
    "output_order with uvw": (dict(mode="uvw", irreps_out="3x0e", output_order="paths"), "output_order",
                              ["mode 'uvw'", "uvu, uvv and uuu"]),
    "sorted without instruction_order": (dict(output_order="sorted"), "instruction_order",
                                          ["'output'", "MACE", "'paths'", "NequIP"]),
    "multiplicities in another order": (dict(irreps_out="2x0e+2x0e+2x1o+2x1o"), "irreps_out",
                                        ["exact output", "'2x0e+2x1o+2x1o+2x0e'",
                                         "output_order = 'sorted' gives exactly irreps_out: set it"]),
    "multiplicities, sorted, in path order": (dict(irreps_out="2x0e+2x1o+2x1o+2x0e", output_order="sorted",
                                                   instruction_order="paths"), "irreps_out",
                                              ["'2x0e+2x0e+2x1o+2x1o'", "output_order = 'paths' gives exactly"]),
    "multiplicities matching neither order": (dict(irreps_out="2x0e+2x1o"), "irreps_out",
                                              ["exact output", "output_order = 'paths' gives '2x0e+2x1o+2x1o+2x0e'",
                                               "with output_order = 'sorted' it is '2x0e+2x0e+2x1o+2x1o'",
                                               "never merges"]),
    "merged multiplicities": (dict(irreps_out="4x0e+4x1o", output_order="sorted", instruction_order="output"),
                              "irreps_out", ["exact output", "never merges"]),
    "mul 1 filter in another order than the output": (dict(irreps_in1="0e+1o", irreps_in2="1o",
                                                           irreps_out="0e+1o+1e+2e"), "irreps_out",
                                                      ["ambiguous", "'1x1o+1x0e+1x1e+1x2e'",
                                                       "output_order = 'sorted' gives exactly irreps_out"]),
    "mul 1 filter matching neither order": (dict(irreps_in1="0e+1o", irreps_in2="1o", irreps_out="2e+1e+1o+0e"),
                                            "irreps_out", ["ambiguous", "with output_order = 'sorted' it is"]),
    "duplicate in a filter": (dict(irreps_out="0e+1o+0e"), "irreps_out", ["'0e' appears twice", "multiplicity"]),
    "duplicate in a mul 1 filter": (dict(irreps_in1="0e+1o", irreps_in2="0e+1o", irreps_out="0e+0e+1o"),
                                    "irreps_out", ["'0e' appears twice"]),
    "bad cg_convention": (dict(cg_convention="e3nn-0.6"), "cg_convention", ["'e3nn-0.6'", "e3nn-0.5", "e3nn-0.4"]),
    "cg_convention wrong type": (dict(cg_convention=0.4), "cg_convention", ["expected str"]),
    "e3nn-0.4 beyond its tables": (dict(irreps_in1="2x12e", irreps_in2="0e", irreps_out="12e",
                                        cg_convention="e3nn-0.4"), "cg_convention", ["l = 11", "l = 12", "e3nn-0.5"]),
    # the tuning table
    "tuning not a table": (dict(tuning=5), "tuning", ["expected dict"]),
    "tuning unknown key": (dict(tuning={"warps": 4}), "tuning.warps", ["unknown", "num_warps"]),
    "tuning block not a power of two": (dict(tuning={"block_b": 24}), "tuning.block_b", ["power of two", "24"]),
    "tuning block too large": (dict(tuning={"block_c": 512}), "tuning.block_c", ["[1, 256]"]),
    "tuning bool": (dict(tuning={"num_warps": True}), "tuning.num_warps", ["integer"]),
    "tuning float": (dict(tuning={"num_stages": 2.0}), "tuning.num_stages", ["integer"]),
    "tuning num_warps": (dict(tuning={"num_warps": 3}), "tuning.num_warps", ["1, 2, 4, 8, 16", "3"]),
    "tuning maxnreg": (dict(tuning={"maxnreg_partials": 100}), "tuning.maxnreg_partials", ["0 (off)", "100"]),
    "tuning max_terms": (dict(tuning={"max_terms": 4}), "tuning.max_terms", ["at least 16"]),
    "tuning op not a table": (dict(tuning={"fwd": 8}), "tuning.fwd", ["expected a table", "num_warps"]),
    "tuning op unknown key": (dict(tuning={"bwd_x2": {"warps": 4}}), "tuning.bwd_x2.warps", ["unknown", "num_warps"]),
    "tuning pallas per op": (dict(tuning={"fwd": {"pallas_num_warps": 4}}), "tuning.fwd.pallas_num_warps", ["every op"]),
    "tuning pallas block": (dict(tuning={"pallas_block_batch": 6}), "tuning.pallas_block_batch", ["power of two"]),
    "tuning op bad value": (dict(tuning={"conv_fwd": {"block_c": 48}}), "tuning.conv_fwd.block_c", ["power of two", "48"]),
    "tuning grid_c": (dict(tuning={"grid_c": 2}), "tuning.grid_c", ["0 (a channel loop", "1 (channel tiles", "2"]),
    "tuning segment": (dict(tuning={"conv_fwd": {"segment": 2}}), "tuning.conv_fwd.segment", ["0 (hl.atomic_add", "2"]),
    "tuning segment_min_edges": (dict(tuning={"segment_min_edges": -1}), "tuning.segment_min_edges", ["[0, 2**31]", "-1"]),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table(case):
    changes, key, words = BAD_TABLES[case]
    err = _error(_toml(_spec(**changes)))
    # errors found before the name is read (unknown and reserved keys, the name itself)
    # name the table by its index only
    early = key == "name" or "unknown key" in words
    table = "tensor_product.0" if early else TABLE
    _assert_names(err, table, key, *words)


def test_neither_mode_nor_instructions():
    err = _error(_toml(_spec(mode=None)))
    assert err.table == TABLE
    assert "mode" in str(err) and "instructions" in str(err) and "exactly one" in err.reason


@pytest.mark.parametrize(
    "name",
    ["import os", "1abc", "class", "None", "def", "a-b", "a.b", "_x", "", " tp", "tp ", "tp\n", "tp\nimport os",
     "na\u00efve", "x;y", "tp\t"],
)
def test_non_identifier_name(name):
    err = _error(_toml(_spec(name=name)))
    _assert_names(err, "tensor_product.0", "name", "identifier", repr(name))


def test_duplicate_name_names_second_table():
    err = _error(_toml(_spec(name="a"), _spec(name="b"), _spec(name="a")))
    _assert_names(err, "tensor_product.2", "name", "duplicate", "'a'")


def test_error_in_later_table_names_it():
    err = _error(_toml(_spec(name="a"), _spec(name="b", layout="xx")))
    _assert_names(err, "tensor_product.1 (b)", "layout", "'xx'")


# ---------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    "text,key,words",
    [
        ("[[tensor_product]\nname = 'x'\n", None, ["invalid TOML"]),
        ("[[tensor_product]]\nname = \n", None, ["invalid TOML"]),
        ("[[tensor_product]]\nname = 'a'\nname = 'b'\n", None, ["invalid TOML"]),
        ('"x\ny" = 1\n', None, ["invalid TOML"]),
        ("", "tensor_product", ["no [[tensor_product]]"]),
        ("# only a comment\n", "tensor_product", ["no [[tensor_product]]"]),
        ("tensor_product = 3\n", "tensor_product", ["array of tables"]),
        ("tensor_product = [1, 2]\n", "tensor_product", ["array of tables"]),
        ("tensor_product = []\n", "tensor_product", ["no tensor product"]),
        ("version = 2\n" + _toml(GOOD), "version", ["unknown top-level key"]),
        ("[conv]\nreduce = 'sum'\n" + _toml(GOOD), "conv", ["unknown top-level key"]),
    ],
)
def test_bad_file_level(text, key, words):
    err = _error(text)
    _assert_names(err, None, key, *words)


def test_key_with_newline_stays_one_line():
    err = _error('[[tensor_product]]\n"bad\\nkey" = 1\n')
    assert "unknown key" in err.reason
    assert "bad\\nkey" in str(err)  # shown escaped


def test_unreadable_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    err = _check_one_error(info.value, str(missing))
    _assert_names(err, None, None, "cannot read file")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)  # a directory
    _assert_names(_check_one_error(info.value, str(tmp_path)), None, None, "cannot read file")


def test_non_utf8_file(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes(_toml(_spec(name="caf")).encode() + b"# caf\xe9\n")
    with pytest.raises(SpecError) as info:
        load_spec(p)
    _assert_names(_check_one_error(info.value, str(p)), None, None, "UTF-8")


def test_load_spec_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(_toml(_spec(layout="row_major")), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(p)
    _assert_names(_check_one_error(info.value, str(p)), TABLE, "layout", "row_major")


# ---------------------------------------------------------------- fuzz: only SpecError ever escapes

_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 8),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from(["0e", "1o", "2x1o+1x0e", "3x0e", "uvw", "uvu", "uvv", "uuu", "float32", "mul_ir",
                     "component", "path", "", "x", "1y", "tp", "class", "paths", "sorted", "output", "e3nn-0.4",
                     "0e+0e", "1x0e+2x1o"]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=6), max_leaves=12)
_KEYS = st.sampled_from(sorted(GOOD) + ["instructions", "irrep_normalization", "path_normalization",
                                        "shared_weights", "layout", "dtypes", "conv", "other", "output_order",
                                        "instruction_order", "cg_convention"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _VALUES, max_size=5), st.booleans())
def test_fuzzed_tables_only_raise_spec_error(changes, drop_mode):
    t = dict(GOOD)
    if drop_mode:
        t.pop("mode")
    t.update(changes)
    try:
        specs = parse_spec(_toml(t), FILE)
    except SpecError as e:
        _check_one_error(e, FILE)
        assert e.table is None or e.table.startswith("tensor_product.0")
        return
    # anything accepted is a consistent spec
    (spec,) = specs
    assert spec.name.isidentifier()
    assert spec.instructions
    for ins in spec.instructions:
        assert 0 <= ins.i_in1 < len(spec.irreps_in1)
        assert 0 <= ins.i_in2 < len(spec.irreps_in2)
        assert 0 <= ins.i_out < len(spec.irreps_out)
        assert spec.irreps_out[ins.i_out].ir.allowed(spec.irreps_in1[ins.i_in1].ir, spec.irreps_in2[ins.i_in2].ir)
    ir = lower(spec)  # whatever the parser accepts can be lowered
    assert len(ir.paths) == len(spec.instructions)


# ---------------------------------------------------------------- the CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "eqdsl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


@pytest.mark.parametrize(
    "content",
    [
        "[[tensor_product]\n",  # invalid TOML
        _toml(_spec(colour="red")),
        _toml(_spec(mode=None, irreps_out="2x3e", instructions=[[1, 1, 0, "uvu", True]])),
        '[[tensor_product]]\n"bad\\nkey" = 1\n',
        None,  # the file does not exist
    ],
    ids=["invalid-toml", "unknown-key", "triangle", "newline-key", "missing-file"],
)
def test_cli_inspect_bad_spec(tmp_path, content):
    p = tmp_path / "bad.toml"
    if content is not None:
        p.write_text(content, encoding="utf-8")
    r = _cli("inspect", str(p))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    assert str(p) in lines[0]
    assert r.stdout == ""


def test_generating_checks_the_backends_tuning_keys(tmp_path):
    """``parse_spec`` passes a tuning table through as data; generating refuses a key that
    no backend owns, in the one-line form of every spec error (file, table, key)."""
    from eqdsl.codegen.generate import generate_files

    path = tmp_path / "t.toml"
    path.write_text(_toml(_spec(tuning={"warps": 4})))
    (spec,) = parse_spec(path.read_text(), str(path))
    assert spec.tuning == (("warps", 4),)
    with pytest.raises(SpecError) as info:
        generate_files(path, tmp_path / "out", triton=False)
    _assert_names(_check_one_error(info.value, str(path)), TABLE, "tuning.warps", "unknown", "num_warps")
