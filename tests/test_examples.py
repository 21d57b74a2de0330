"""examples/specs: each parses, matches e3nn and the table of standard problems, and inspects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e3nn import o3

from eqdsl.irreps import Irreps
from eqdsl.lower import lower
from eqdsl.spec import load_spec

from model_tps import channelwise_tp

REPO = Path(__file__).resolve().parents[1]
SPEC_DIR = REPO / "examples" / "specs"

# The standard problems (docs/problems.md), an independent source: name -> (mode, irreps_in1,
# irreps_in2, irreps_out (filter for uvu), shared weights, paths, weight_numel). The channelwise
# ones are the models' real edge products (tests/test_model_specs.py checks each against the
# model's own construction): MACE's filter is 0e+1o+2e+3o, NequIP 0.19 orders its features
# 0e, 0o, 1e, 1o, ...
TABLE = {
    "mace_large": ("uvu", "128x0e+128x1o+128x2e", "0e+1o+2e+3o", "0e+1o+2e+3o", False, 17, 2176),
    "mace_medium": ("uvu", "128x0e+128x1o", "0e+1o+2e+3o", "0e+1o+2e+3o", False, 10, 1280),
    "nequip_water": ("uvu", "32x0e+32x0o+32x1e+32x1o", "0e+1o", "0o+0e+1o+1e", False, 10, 320),
    "nequip_aspirin": ("uvu", "64x0e+64x0o+64x1e+64x1o", "0e+1o", "0o+0e+1o+1e", False, 10, 640),
    "nequip_toluene": ("uvu", "64x0e+64x0o+64x1e+64x1o+64x2e+64x2o", "0e+1o+2e", "0o+0e+1o+1e+2o+2e", False,
                       30, 1920),
    "nequip_benzene": ("uvu", "64x0e+64x0o+64x1e+64x1o+64x2e+64x2o+64x3e+64x3o", "0e+1o+2e+3o",
                       "0o+0e+1o+1e+2o+2e+3o+3e", False, 68, 4352),
    "nequix_main": ("uvu", "128x0e+64x1o+32x2e+32x3o", "0e+1o+2e+3o", "0e+1o+2e+3o", False, 23, 1312),
    "sevennet_l3i5": ("uvu", "128x0e+64x1e+32x2e+32x3e", "0e+1e+2e+3e", "0e+1e+2e+3e", False, 34, 1760),
    "diffdock_l2": ("uvw", "10x1o+10x1e+48x0e+48x0o", "0e+1o+2e", "10x1o+10x1e+48x0e+48x0o", False, 12, 7128),
    "tetris_poly_1": ("uvw", "0e+1o+2e+3o", "0e+1o+2e+3o", "64x0e+24x1e+24x1o+16x2e+16x2o", True, 24, 648),
    "e3tools_conv": ("uvw", "64x0e+16x1o", "0e+1o", "80x0e+16x1o", False, 4, 7680),
}

SPEC_FILES = [p for p in sorted(SPEC_DIR.glob("*.toml")) if load_spec(p)]  # tensor products (not symmetric contractions)


def test_every_problem_has_exactly_one_example():
    assert sorted(p.stem for p in SPEC_FILES) == sorted(TABLE)


def _spec(name):
    specs = load_spec(SPEC_DIR / f"{name}.toml")
    assert len(specs) == 1
    assert specs[0].name == name  # the file is named after its tensor product
    return specs[0]


def _e3nn(fn, *args, **kwargs):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_default_dtype(old)


def _key(ins):
    return (ins.i_in1, ins.i_in2, ins.i_out, ins.connection_mode, ins.has_weight)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_example_matches_problem_table_and_e3nn(name):
    mode, in1, in2, out, shared, paths, weight_numel = TABLE[name]
    spec = _spec(name)
    assert spec.mode == mode
    assert spec.irreps_in1 == Irreps(in1)
    assert spec.irreps_in2 == Irreps(in2)
    assert spec.irreps_out_filter == Irreps(out)
    assert spec.shared_weights is shared
    assert len(spec.instructions) == paths
    ir = lower(spec)
    assert len(ir.paths) == paths
    assert ir.weight_numel == weight_numel

    # e3nn, built from the spec's own instructions
    tp = _e3nn(o3.TensorProduct, in1, in2, str(spec.irreps_out), [i.as_tuple() for i in spec.instructions],
               shared_weights=shared, internal_weights=False)
    assert len(tp.instructions) == paths
    assert tp.weight_numel == weight_numel
    assert tp.irreps_out.dim == ir.dim_out
    for p, t in zip(ir.paths, tp.instructions):
        assert p.path_weight == pytest.approx(t.path_weight, rel=1e-15, abs=0.0)

    # e3nn, built the way the model code builds it (independently of eqdsl's expansion)
    if mode == "uvw":
        ref = _e3nn(o3.FullyConnectedTensorProduct, in1, in2, out, shared_weights=shared, internal_weights=False)
        assert str(ref.irreps_out) == str(spec.irreps_out) == str(Irreps(out))
    else:
        ref = _e3nn(channelwise_tp, in1, in2, out, shared=shared,
                    sort_instructions=spec.instruction_order == "output")
        assert str(ref.irreps_out) == str(spec.irreps_out)
    assert [_key(t) for t in ref.instructions] == [_key(t) for t in tp.instructions]
    assert len(ref.instructions) == paths
    assert ref.weight_numel == weight_numel
    for p, t in zip(ir.paths, ref.instructions):
        assert p.path_weight == pytest.approx(t.path_weight, rel=1e-15, abs=0.0)
        assert p.path_shape == tuple(t.path_shape)


def test_inspect_every_example():
    """`python -m eqdsl inspect <spec>` exits 0 and prints a table row for every path."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = {
        p.stem: subprocess.Popen([sys.executable, "-m", "eqdsl", "inspect", str(p.relative_to(REPO))], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for p in SPEC_FILES
    }
    assert len(procs) == len(TABLE)
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {stderr}"
        assert stderr == ""
        spec = _spec(name)
        lines = stdout.splitlines()
        assert lines[0].startswith(f"{name}: ")
        header = next(k for k, line in enumerate(lines) if line.lstrip().startswith("#  instruction"))
        assert set(lines[header + 1].replace(" ", "")) == {"-"}
        rows = [line for line in lines[header + 2 :] if line.strip()]
        assert len(rows) == len(spec.instructions) == TABLE[name][5]
        for k, (row, ins) in enumerate(zip(rows, spec.instructions)):
            cells = row.split()
            assert cells[0] == str(k), row
            assert str(ins) in row  # e3nn's instruction tuple
            m1, m2, mo = spec.irreps_in1[ins.i_in1], spec.irreps_in2[ins.i_in2], spec.irreps_out[ins.i_out]
            assert f"{m1} x {m2} -> {mo}" in row
        assert f"paths {TABLE[name][5]}; weight_numel {TABLE[name][6]}" in stdout


RADIAL_SPEC = """
[[tensor_product]]
name = "main_radial"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
dtypes = ["float64"]
conv = true
radial_features = 6
"""


def test_main_energy_layer_with_conv_radial_matches_e3nn(tmp_path):
    """examples/main.py's layer for a spec with radial_features: the generated ops get the
    radial MLP's hidden features and last matrix (conv_radial, torch and JAX; a plain conv
    call would fail the test) and give e3nn's energy and forces (w = hidden @ matrix)."""
    import importlib.util
    import types

    import jax
    import numpy as np
    from genutil import build_package

    import eqdsl.jax

    spec = importlib.util.spec_from_file_location("eqdsl_main_example", REPO / "examples" / "main.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    pkg = build_package(tmp_path, "main_radial", RADIAL_SPEC)
    torch_ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    jax_ops = importlib.import_module(pkg.__name__ + ".jax_ops")
    assert pkg.RADIAL_FEATURES == 6

    def no_conv(*args):
        raise AssertionError("the layer must call conv_radial, not conv")

    cutoff = 4.0
    label, atoms, src, dst, shifts = main.structures(cutoff)[1]
    assert label == "g2 CH3CH2OH" and len(src) == 70
    params = main.Params(pkg, atoms.get_atomic_numbers())
    assert params.hidden_layer.shape == (main.N_BASIS, 6) and params.theta.shape == (6, pkg.WEIGHT_NUMEL)
    pos0 = atoms.get_positions()

    def torch_energy_forces(energy):
        pos = torch.tensor(pos0, dtype=torch.float64, requires_grad=True)
        e = energy(pos)
        (g,) = torch.autograd.grad(e, pos)
        return e.detach().numpy(), -g.numpy()

    ref = main.torch_layer(pkg, main.e3nn_conv(pkg, torch.float64, "cpu"), params, src, dst, shifts, cutoff,
                           torch.float64, "cpu")
    e_ref, f_ref = torch_energy_forces(ref)
    assert np.abs(f_ref).max() > 1e-3
    fast = main.torch_layer(pkg, no_conv, params, src, dst, shifts, cutoff, torch.float64, "cpu",
                            torch_ops.conv_radial)
    e_t, f_t = torch_energy_forces(fast)
    tol = main.TOLERANCE["float64"]
    assert main._rel(e_t, e_ref) <= tol and main._rel(f_t, f_ref) <= tol

    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        energy = main.jax_layer(pkg, no_conv, params, src, dst, shifts, cutoff, jax.numpy.float64,
                                jax_ops.conv_radial)
        e_j, g_j = jax.value_and_grad(energy)(jax.numpy.asarray(pos0, jax.numpy.float64))
        # eqdsl.jax's wrapper: the same op, weights first; it refuses a package without radial_features
        rng = np.random.default_rng(1)
        hidden, h = rng.standard_normal((len(src), 6)), rng.standard_normal((len(atoms), pkg.DIM_IN1))
        sh = rng.standard_normal((len(src), pkg.DIM_IN2))
        got = eqdsl.jax.conv_radial(pkg, params.theta, hidden, h, sh, src, dst, len(atoms))
        ref_conv = main.e3nn_conv(pkg, torch.float64, "cpu")
        t = torch.as_tensor
        want = ref_conv(t(h), t(sh), t(hidden) @ t(params.theta), t(src), t(dst), len(atoms)).numpy()
        assert main._rel(got, want) <= tol
        no_radial = types.ModuleType("no_radial")
        no_radial.WEIGHT_NUMEL, no_radial.RADIAL_FEATURES = pkg.WEIGHT_NUMEL, None
        with pytest.raises(ValueError, match="no_radial has no radial_features"):
            eqdsl.jax.conv_radial(no_radial, params.theta, hidden, h, sh, src, dst, len(atoms))
    finally:
        jax.config.update("jax_enable_x64", x64)
    assert main._rel(e_j, e_ref) <= tol and main._rel(-np.asarray(g_j), f_ref) <= tol
