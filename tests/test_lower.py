"""eqdsl.lower and eqdsl.ir: deterministic, frozen, correctly laid out, honestly counted."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from e3nn import o3

from eqdsl.ir import Block, CGNonzero, PathIR, TensorProductIR
from eqdsl.lower import blocks, lower
from eqdsl.irreps import Irreps
from eqdsl.reference import tensor_product_reference, to_layout
from eqdsl.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = [p for p in sorted((REPO / "examples" / "specs").glob("*.toml")) if load_spec(p)]  # tensor products

MIXED = """
[[tensor_product]]
name = "mixed"
irreps_in1 = "2x0e+3x1o+2x2e"
irreps_in2 = "2x0e+1x1o+3x2e"
irreps_out = "2x1e+3x0e+2x2e+1x1e+2x3o+2x0e+3x1o"
instructions = [
  [1, 1, 0, "uvw", true],
  [0, 0, 5, "uvw", true, 0.25],
  [1, 1, 3, "uvv", false],
  [2, 1, 4, "uvu", true, 3.5],
  [0, 0, 5, "uuu", false],
  [2, 2, 0, "uvw", true],
  [1, 0, 6, "uvu", true],
  [2, 2, 2, "uvw", true],
]
irrep_normalization = "norm"
path_normalization = "path"
shared_weights = false
layout = "ir_mul"
"""


def _one(text: str):
    (spec,) = parse_spec(text)
    return spec


def _spec_text(in1, in2, out, instructions=None, mode=None, shared=True, layout="mul_ir"):
    body = f'[[tensor_product]]\nname = "t"\nirreps_in1 = "{in1}"\nirreps_in2 = "{in2}"\nirreps_out = "{out}"\n'
    body += f'mode = "{mode}"\n' if mode else f"instructions = {instructions}\n"
    body += f"shared_weights = {'true' if shared else 'false'}\nlayout = \"{layout}\"\n"
    return body


# ---------------------------------------------------------------- determinism


_DIGESTS = """
import glob, hashlib, json, sys
from eqdsl.lower import lower
from eqdsl.spec import load_spec, parse_spec
out = {}
for p in sorted(glob.glob("examples/specs/*.toml")):
    for s in load_spec(p):
        out[s.name] = hashlib.sha256(lower(s).to_json().encode()).hexdigest()
for s in parse_spec(sys.argv[1]):
    out[s.name] = hashlib.sha256(lower(s).to_json().encode()).hexdigest()
print(json.dumps(out))
"""


def _digests() -> dict[str, str]:
    out = {}
    for p in EXAMPLES:
        for s in load_spec(p):
            out[s.name] = hashlib.sha256(lower(s).to_json().encode()).hexdigest()
    out["mixed"] = hashlib.sha256(lower(_one(MIXED)).to_json().encode()).hexdigest()
    return out


def test_same_spec_gives_identical_json():
    a, b = lower(_one(MIXED)), lower(_one(MIXED))
    assert a == b
    assert a.to_json() == b.to_json()
    assert a.to_json().endswith("\n")
    assert lower(load_spec(EXAMPLES[0])[0]).to_json() == lower(load_spec(EXAMPLES[0])[0]).to_json()


def test_json_identical_across_processes():
    here = _digests()
    assert len(here) == len(EXAMPLES) + 1
    for seed in ("0", "4242"):  # a different str hash seed must not change anything
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=seed)
        r = subprocess.run([sys.executable, "-c", _DIGESTS, MIXED], capture_output=True, text=True, cwd=REPO,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == here


def test_json_is_complete_and_floats_round_trip():
    ir = lower(_one(MIXED))
    data = json.loads(ir.to_json())
    assert data["name"] == "mixed" and data["layout"] == "ir_mul"
    assert len(data["paths"]) == len(ir.paths) == 8
    for pj, p in zip(data["paths"], ir.paths):
        assert pj["path_weight"] == p.path_weight  # exact
        assert [n["coeff"] for n in pj["nonzeros"]] == [n.coeff for n in p.nonzeros]
        assert tuple(pj["path_shape"]) == p.path_shape
    assert data["weight_numel"] == ir.weight_numel
    assert data["cg_convention"] == ir.cg_convention == "e3nn-0.5"


# ---------------------------------------------------------------- frozen, one-line str


def _walk(x):
    yield x
    if dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            yield from _walk(getattr(x, f.name))
    elif isinstance(x, tuple):
        for y in x:
            yield from _walk(y)


def test_ir_is_frozen_plain_data():
    ir = lower(_one(MIXED))
    for obj in (ir, ir.paths[0], ir.in1[0], ir.paths[0].nonzeros[0]):
        field = dataclasses.fields(obj)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
    kinds = set()
    for x in _walk(ir):
        assert isinstance(x, (TensorProductIR, PathIR, Block, CGNonzero, tuple, str, int, float, bool, type(None))), type(x)
        kinds.add(type(x))
    assert {TensorProductIR, PathIR, Block, CGNonzero} <= kinds
    hash(ir)  # hashable all the way down: no list or dict hides inside
    # nothing in the IR refers to torch or jax objects, and it survives a JSON round trip as data
    assert "torch" not in ir.to_json() and "jax" not in ir.to_json()


def test_str_is_one_line():
    ir = lower(_one(MIXED))
    for obj in (ir, *ir.paths, *ir.in1, *ir.in2, *ir.out, *ir.paths[0].nonzeros):
        s = str(obj)
        assert s and "\n" not in s
    assert str(ir).startswith("mixed: ")
    assert "8 paths" in str(ir)
    for p in load_spec(EXAMPLES[0]):
        assert "\n" not in str(lower(p)) and "\n" not in str(p)


# ---------------------------------------------------------------- layouts


def test_block_offsets_and_strides_hand_example():
    irreps = Irreps("2x0e+3x1o+1x2e+4x1e")
    # (index, mul, l, parity, offset, stride_mul, stride_comp)
    assert [dataclasses.astuple(b) for b in blocks(irreps, "mul_ir")] == [
        (0, 2, 0, 1, 0, 1, 1),
        (1, 3, 1, -1, 2, 3, 1),
        (2, 1, 2, 1, 11, 5, 1),
        (3, 4, 1, 1, 16, 3, 1),
    ]
    assert [dataclasses.astuple(b) for b in blocks(irreps, "ir_mul")] == [
        (0, 2, 0, 1, 0, 1, 2),
        (1, 3, 1, -1, 2, 1, 3),
        (2, 1, 2, 1, 11, 1, 1),
        (3, 4, 1, 1, 16, 1, 4),
    ]
    assert [b.size for b in blocks(irreps, "ir_mul")] == [2, 9, 5, 12]
    assert [b.dim for b in blocks(irreps, "mul_ir")] == [1, 3, 5, 3]


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_addressing_is_a_bijection_matching_e3nn_and_to_layout(layout):
    irreps = Irreps("2x0e+3x1o+1x2e+4x1e+2x3o")
    bl = blocks(irreps, layout)
    e3 = o3.Irreps(str(irreps))
    seen = []
    x = np.arange(irreps.dim, dtype=np.float64)[None, :]  # e3nn (mul_ir) row: value = mul_ir index
    y = to_layout(x, blocks(irreps, "mul_ir"), "mul_ir", layout)
    for b, sl in zip(bl, e3.slices()):
        assert b.offset == sl.start and b.size == sl.stop - sl.start
        for u in range(b.mul):
            for m in range(b.dim):
                addr = b.offset + u * b.stride_mul + m * b.stride_comp
                seen.append(addr)
                e3nn_addr = sl.start + u * b.dim + m  # e3nn: channel-major, component innermost
                assert y[0, addr] == e3nn_addr
    assert sorted(seen) == list(range(irreps.dim))


def test_ir_blocks_follow_spec_layout():
    for layout in ("mul_ir", "ir_mul"):
        ir = lower(_one(_spec_text("2x0e+3x1o", "0e+1o", "0e+1o", mode="uvu", layout=layout)))
        assert ir.layout == layout
        for bs, irreps in ((ir.in1, ir.irreps_in1), (ir.in2, ir.irreps_in2), (ir.out, ir.irreps_out)):
            assert bs == blocks(Irreps(irreps), layout)


# ---------------------------------------------------------------- weights and CG


def test_weight_offsets_and_shapes():
    ir = lower(_one(MIXED))
    # (mul1, mul2, mul_out) for uvw, (mul1, mul2) for uvu/uvv, (mul1,) for uuu
    expected_shapes = [(3, 1, 2), (2, 2, 2), (3, 1), (2, 1), (2,), (2, 3, 2), (3, 2), (2, 3, 2)]
    expected_weighted = [True, True, False, True, False, True, True, True]
    assert [p.path_shape for p in ir.paths] == expected_shapes
    assert [p.has_weight for p in ir.paths] == expected_weighted
    sizes = [6, 8, 0, 2, 0, 12, 6, 12]
    assert [p.weight_numel for p in ir.paths] == sizes
    assert [p.weight_offset for p in ir.paths] == [0, 6, -1, 14, -1, 16, 28, 34]
    assert ir.weight_numel == sum(sizes) == 46


def test_nonzeros_are_e3nn_cg_times_e3nn_path_weight():
    spec = _one(MIXED)
    ir = lower(spec)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tp = o3.TensorProduct(str(spec.irreps_in1), str(spec.irreps_in2), str(spec.irreps_out),
                              [i.as_tuple() for i in spec.instructions], irrep_normalization="norm",
                              path_normalization="path", shared_weights=False, internal_weights=False)
    finally:
        torch.set_default_dtype(old)
    for p, t in zip(ir.paths, tp.instructions):
        l1, l2, lo = (spec.irreps_in1[p.i_in1].ir.l, spec.irreps_in2[p.i_in2].ir.l, spec.irreps_out[p.i_out].ir.l)
        c = o3.wigner_3j(l1, l2, lo, dtype=torch.float64).numpy() * t.path_weight
        got = np.zeros_like(c)
        for n in p.nonzeros:
            assert got[n.i, n.j, n.k] == 0.0, "a nonzero is listed twice"
            got[n.i, n.j, n.k] = n.coeff
        np.testing.assert_allclose(got, c, rtol=0, atol=1e-12)
        assert len(p.nonzeros) == int(np.sum(np.abs(c) > 1e-12))


# every path of this one uses a triple whose sign e3nn 0.4 flips ((1,2,2), (2,1,2), (2,2,1)) or not
CONVENTION = """
[[tensor_product]]
name = "conv"
irreps_in1 = "2x0e+2x1e+2x2e"
irreps_in2 = "0e+1e+2e"
irreps_out = "0e+1e+2e"
mode = "uvu"
output_order = "sorted"
instruction_order = "output"
shared_weights = false
cg_convention = "{}"
"""
E3NN044 = REPO / "tests" / "data" / "e3nn044_wigner_3j.npz"


def test_cg_convention_e3nn04_lowers_e3nn_044s_wigner_3j_times_the_path_weight():
    """The e3nn-0.4 nonzeros are e3nn 0.4.4's own wigner_3j (tests/data) times e3nn's path
    weight, and differ from the default's only by the sign of the triples 0.4 flips."""
    new, old = (lower(_one(CONVENTION.format(c))) for c in ("e3nn-0.5", "e3nn-0.4"))
    assert (new.cg_convention, old.cg_convention) == ("e3nn-0.5", "e3nn-0.4")
    data = np.load(E3NN044)
    spec = _one(CONVENTION.format("e3nn-0.4"))
    flipped = 0
    for pn, po in zip(new.paths, old.paths):
        l1, l2, lo = (spec.irreps_in1[po.i_in1].ir.l, spec.irreps_in2[po.i_in2].ir.l, spec.irreps_out[po.i_out].ir.l)
        c = data[f"{l1},{l2},{lo}"] * po.path_weight
        got = np.zeros_like(c)
        for n in po.nonzeros:
            got[n.i, n.j, n.k] = n.coeff
        np.testing.assert_allclose(got, c, rtol=0, atol=1e-12)
        sign = -1 if sorted((l1, l2, lo)) == [1, 2, 2] else 1
        flipped += sign == -1
        assert [(n.i, n.j, n.k, sign * n.coeff) for n in po.nonzeros] == [(n.i, n.j, n.k, n.coeff) for n in pn.nonzeros]
        assert (po.path_weight, po.weight_offset) == (pn.path_weight, pn.weight_offset)
    assert flipped == 3  # 1e x 2e -> 2e, 2e x 1e -> 2e, 2e x 2e -> 1e
    assert new.to_json() != old.to_json()


def test_zero_path_weight_drops_nonzeros():
    ir = lower(_one(_spec_text("2x1o", "1x1o", "2x0e", instructions='[[0, 0, 0, "uvu", true, 0.0]]')))
    assert ir.paths[0].path_weight == 0.0
    assert ir.paths[0].nonzeros == ()
    x1, x2, w = np.ones((1, 6)), np.ones((1, 3)), np.ones(2)
    assert not tensor_product_reference(ir, x1, x2, w).any()


# ---------------------------------------------------------------- costs, counted by hand
#
# The cost model (eqdsl/ir.py): a direct evaluation per batch element. For every channel
# pair the path visits (u, v) -- u over mul1 and v over mul2; for uuu only u == v -- and
# every CG nonzero (i, j, k), it forms x1[u, i] * x2[v, j] (1 multiply) and accumulates
# c * that into t[k] (1 multiply-add = 2): 3 flops per pair and nonzero. Then t goes into
# the output: weighted, a multiply-add with the weight for every output channel the pair
# feeds (uvw: all mul_out of them; other modes: one) and component (2 flops each);
# unweighted, one add per component. Bytes: x1, x2 and out once each, plus per-batch
# weights, at the dtype's item size.
#
# Known nonzero counts: 1x1->0 is delta_ij (3), 0x1->1 and 1x0->1 are identities (3),
# 0x0->0 is 1, 1x1->1 is the Levi-Civita tensor (6).

COST_CASES = {
    # name: (spec text, nnz per path, flops per batch, elements per batch (shared), weight_numel)
    "uvw 2x1o x 1x1o -> 3x0e": (
        _spec_text("2x1o", "1x1o", "3x0e", instructions='[[0, 0, 0, "uvw", true]]'),
        [3], 2 * 3 * 3 + 2 * 2 * 3 * 1, 6 + 3 + 3, 6),
    "uvu 2x1o x 1x0e -> 2x1o": (
        _spec_text("2x1o", "1x0e", "2x1o", instructions='[[0, 0, 0, "uvu", true]]'),
        [3], 2 * 3 * 3 + 2 * 2 * 3, 6 + 1 + 6, 2),
    "uvu unweighted": (
        _spec_text("2x1o", "1x0e", "2x1o", instructions='[[0, 0, 0, "uvu", false]]'),
        [3], 2 * 3 * 3 + 2 * 3, 6 + 1 + 6, 0),
    "uuu 3x0e x 3x0e -> 3x0e": (
        _spec_text("3x0e", "3x0e", "3x0e", instructions='[[0, 0, 0, "uuu", true]]'),
        [1], 3 * 1 * 3 + 2 * 3 * 1, 3 + 3 + 3, 3),
    "uvv 2x0e x 3x1o -> 3x1o": (
        _spec_text("2x0e", "3x1o", "3x1o", instructions='[[0, 0, 0, "uvv", true]]'),
        [3], 6 * 3 * 3 + 2 * 6 * 3, 2 + 9 + 9, 6),
    "two paths 1x1o x 1x1o -> 1x0e + 2x1e": (
        _spec_text("1x1o", "1x1o", "1x0e+2x1e", instructions='[[0, 0, 0, "uvw", true], [0, 0, 1, "uvw", true]]'),
        [3, 6], (1 * 3 * 3 + 2 * 1 * 1 * 1) + (1 * 3 * 6 + 2 * 1 * 2 * 3), 3 + 3 + 7, 1 + 2),
}


@pytest.mark.parametrize("name", list(COST_CASES))
@pytest.mark.parametrize("shared", [True, False])
def test_flops_and_bytes_by_hand(name, shared):
    text, nnz, flops, elems, wn = COST_CASES[name]
    ir = lower(_one(text.replace("shared_weights = true", f"shared_weights = {'true' if shared else 'false'}")))
    assert [len(p.nonzeros) for p in ir.paths] == nnz
    assert ir.weight_numel == wn
    assert ir.flops_per_batch == flops == sum(p.flops for p in ir.paths)
    per_batch = elems + (0 if shared else wn)
    assert dict(ir.bytes_per_batch) == {"float32": 4 * per_batch, "float64": 8 * per_batch}


def test_bytes_follow_the_spec_dtypes():
    text = _spec_text("2x1o", "1x1o", "3x0e", instructions='[[0, 0, 0, "uvw", true]]') + 'dtypes = ["float64"]\n'
    ir = lower(_one(text))
    assert ir.dtypes == ("float64",)
    assert ir.bytes_per_batch == (("float64", 8 * 12),)


def test_paths_into():
    ir = lower(_one(MIXED))
    assert [p.index for p in ir.paths_into(0)] == [0, 5]
    assert [p.index for p in ir.paths_into(5)] == [1, 4]
    assert ir.paths_into(1) == ()
    assert sorted(p.index for o in range(len(ir.out)) for p in ir.paths_into(o)) == list(range(len(ir.paths)))
