"""examples/specs: each channelwise example is the edge tensor product its model really builds.

For MACE, NequIP, SevenNet and Nequix, the few lines with which the model builds its edge
tensor product (paths, output sort, instruction order) are copied below, each naming its
source; the e3nn ``TensorProduct`` they give must have the example's irreps, instructions
in order, path weights and weight count. A small version of each is then evaluated with
``eqdsl.reference`` against e3nn (e3nn-jax for Nequix, which calls
``e3nn_jax.tensor_product``). The copies were checked once against the installed
packages (mace-torch 0.3.16 ``ScaleShiftMACE``, nequip 0.19.1 ``NequIPGNNModel``, nequix
0.4.5 ``NequixConvolution``), which CI does not install; SevenNet was read from its
repository (MDIL-SNU/SevenNet at b3d99aa, version 0.12.2.dev).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from e3nn import o3

from eqdsl.cg import convention_sign
from eqdsl.instructions import normalized_path_weights
from eqdsl.lower import lower
from eqdsl.reference import tensor_product_reference
from eqdsl.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]
SPEC_DIR = REPO / "examples" / "specs"
E3NN044 = REPO / "tests" / "data" / "e3nn044_wigner_3j.npz"


# ---------------------------------------------------------------- the models' constructions


def mace_tp_out_irreps_with_instructions(irreps1, irreps2, target_irreps):
    """mace-torch 0.3.16 ``mace/modules/irreps_tools.py: tp_out_irreps_with_instructions``
    (called by ``RealAgnosticResidualInteractionBlock._setup`` for ``conv_tp``), verbatim."""
    trainable = True
    irreps_out_list = []
    instructions = []
    for i, (mul, ir_in) in enumerate(irreps1):
        for j, (_, ir_edge) in enumerate(irreps2):
            for ir_out in ir_in * ir_edge:  # | l1 - l2 | <= l <= l1 + l2
                if ir_out in target_irreps:
                    k = len(irreps_out_list)  # instruction index
                    irreps_out_list.append((mul, ir_out))
                    instructions.append((i, j, k, "uvu", trainable))
    irreps_out = o3.Irreps(irreps_out_list)
    irreps_out, permut, _ = irreps_out.sort()
    instructions = [
        (i_in1, i_in2, permut[i_out], mode, train)
        for i_in1, i_in2, i_out, mode, train in instructions
    ]
    instructions = sorted(instructions, key=lambda x: x[2])
    return irreps_out, instructions


def nequip_interaction_tp(feature_irreps_in, irreps_edge_attr, feature_irreps_out):
    """nequip 0.19.1 ``nequip/nn/interaction_block.py: InteractionBlock.__init__``, the lines
    that build ``tp_scatter``'s ``TensorProduct``: sorted output, instructions NOT re-sorted."""
    irreps_mid = []
    instructions = []
    for i, (mul, ir_in) in enumerate(feature_irreps_in):
        for j, (_, ir_edge) in enumerate(irreps_edge_attr):
            for ir_out in ir_in * ir_edge:
                if ir_out in feature_irreps_out:
                    k = len(irreps_mid)
                    irreps_mid.append((mul, ir_out))
                    instructions.append((i, j, k, "uvu", True))
    irreps_mid = o3.Irreps(irreps_mid)
    irreps_mid, p, _ = irreps_mid.sort()
    instructions = [
        (i_in1, i_in2, p[i_out], mode, train)
        for i_in1, i_in2, i_out, mode, train in instructions
    ]
    return irreps_mid, instructions


def sevennet_irreps_convolution(irreps_x, irreps_filter, irreps_out):
    """SevenNet 0.12.2.dev (b3d99aa) ``sevenn/nn/convolution.py: IrrepsConvolution.__init__``."""
    instructions = []
    irreps_mid = []
    for i, (mul_x, ir_x) in enumerate(irreps_x):
        for j, (_, ir_filter) in enumerate(irreps_filter):
            for ir_out in ir_x * ir_filter:
                if ir_out in irreps_out:  # here we drop l > lmax
                    k = len(irreps_mid)
                    irreps_mid.append((mul_x, ir_out))
                    instructions.append((i, j, k, "uvu", True))
    irreps_mid = o3.Irreps(irreps_mid)
    irreps_mid, p, _ = irreps_mid.sort()
    instructions = [
        (i_in1, i_in2, p[i_out], mode, train)
        for i_in1, i_in2, i_out, mode, train in instructions
    ]
    instructions = sorted(instructions, key=lambda x: x[2])  # "From v0.11.x, to compatible with cuEquivariance"
    return irreps_mid, instructions


def nequix_kernel_tp(input_irreps, sh_irreps, output_irreps):
    """nequix 0.4.5 ``nequix/model.py: NequixConvolution.__init__`` with ``kernel=True``
    (nequix-mp-1): an OpenEquivariance product on the unsorted ``tp_irreps`` with the
    instructions reordered by ``tp_irreps.sort()``'s ``inv``, followed by its ``Sort``
    module, which moves the output blocks into sorted order. Returned as the one e3nn
    product it amounts to: the ``Sort`` applied to the output, i.e. each ``i_out`` mapped
    to its block's sorted position."""
    irreps_out_tp = []
    instructions = []
    for i, (mul, ir_in1) in enumerate(input_irreps):
        for j, (_, ir_in2) in enumerate(sh_irreps):
            for ir_out in ir_in1 * ir_in2:
                if ir_out in output_irreps:
                    k = len(irreps_out_tp)
                    irreps_out_tp.append((mul, ir_out))
                    instructions.append((i, j, k, "uvu", True))
    tp_irreps = o3.Irreps(irreps_out_tp)
    irreps_sorted, p, inv = tp_irreps.sort()
    instructions = [instructions[i] for i in inv]
    # Sort: output block inv[n] of the kernel's output becomes block n
    return irreps_sorted, [(i1, i2, p[io], mode, w) for i1, i2, io, mode, w in instructions]


# name -> (construction, irreps_in1, irreps_in2, the model's irreps_out argument, instruction_order,
#          cg_convention). Only the irreps of the last argument matter (`ir_out in ...`); they are the
#          model's own: MACE's interaction_irreps, NequIP's Gate.irreps_in.simplify(), Nequix's hidden irreps,
#          SevenNet's irreps_out_tp (util.infer_irreps_out, l <= 3; any multiplicity).
SH1, SH2, SH3 = "1x0e+1x1o", "1x0e+1x1o+1x2e", "1x0e+1x1o+1x2e+1x3o"
MODELS = {
    "mace_large": (mace_tp_out_irreps_with_instructions, "128x0e+128x1o+128x2e", SH3,
                   "128x0e+128x1o+128x2e+128x3o", "output", "e3nn-0.4"),
    "mace_medium": (mace_tp_out_irreps_with_instructions, "128x0e+128x1o", SH3,
                    "128x0e+128x1o+128x2e+128x3o", "output", "e3nn-0.4"),
    "nequip_water": (nequip_interaction_tp, "32x0e+32x0o+32x1e+32x1o", SH1, "32x0o+96x0e+32x1o+32x1e", "paths",
                     "e3nn-0.5"),
    "nequip_aspirin": (nequip_interaction_tp, "64x0e+64x0o+64x1e+64x1o", SH1, "64x0o+192x0e+64x1o+64x1e", "paths",
                       "e3nn-0.5"),
    "nequip_toluene": (nequip_interaction_tp, "64x0e+64x0o+64x1e+64x1o+64x2e+64x2o", SH2,
                       "64x0o+320x0e+64x1o+64x1e+64x2o+64x2e", "paths", "e3nn-0.5"),
    "nequip_benzene": (nequip_interaction_tp, "64x0e+64x0o+64x1e+64x1o+64x2e+64x2o+64x3e+64x3o", SH3,
                       "64x0o+448x0e+64x1o+64x1e+64x2o+64x2e+64x3o+64x3e", "paths", "e3nn-0.5"),
    "nequix_main": (nequix_kernel_tp, "128x0e+64x1o+32x2e+32x3o", SH3, "128x0e+64x1o+32x2e+32x3o", "output",
                    "e3nn-0.5"),
    "sevennet_l3i5": (sevennet_irreps_convolution, "128x0e+64x1e+32x2e+32x3e", "1x0e+1x1e+1x2e+1x3e",
                      "256x0e+224x1e+256x2e+224x3e", "output", "e3nn-0.5"),
}


def _f64(fn, *args, **kwargs):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_default_dtype(old)


def _model_tp(name, in1=None, out=None, compile_left_right=False) -> o3.TensorProduct:
    build, in1_, in2, out_, _, _ = MODELS[name]
    in1, in2, out = o3.Irreps(in1 or in1_), o3.Irreps(in2), o3.Irreps(out or out_)
    irreps_mid, instructions = build(in1, in2, out)
    # as the models: o3.TensorProduct(..., shared_weights=False, internal_weights=False), e3nn's default
    # normalizations (component, element)
    return _f64(o3.TensorProduct, in1, in2, irreps_mid, instructions, shared_weights=False, internal_weights=False,
                compile_left_right=compile_left_right)


def test_every_channelwise_example_is_a_model():
    uvu = sorted(p.stem for p in SPEC_DIR.glob("*.toml") if load_spec(p) and load_spec(p)[0].mode == "uvu")
    assert uvu == sorted(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_example_is_the_models_tensor_product(name):
    (spec,) = load_spec(SPEC_DIR / f"{name}.toml")
    _, _, _, _, instruction_order, cg_convention = MODELS[name]
    tp = _model_tp(name)
    assert str(spec.irreps_in1) == str(tp.irreps_in1)
    assert str(spec.irreps_in2) == str(tp.irreps_in2)
    assert str(spec.irreps_out) == str(tp.irreps_out)
    assert [i.as_tuple()[:5] for i in spec.instructions] == [
        (t.i_in1, t.i_in2, t.i_out, t.connection_mode, t.has_weight) for t in tp.instructions
    ]
    weights = normalized_path_weights(spec.irreps_in1, spec.irreps_in2, spec.irreps_out, spec.instructions,
                                      spec.irrep_normalization, spec.path_normalization)
    for w, t in zip(weights, tp.instructions, strict=True):
        assert w == pytest.approx(t.path_weight, rel=1e-15, abs=0.0)
    ir = lower(spec)
    assert ir.weight_numel == tp.weight_numel
    assert [p.path_shape for p in ir.paths] == [tuple(t.path_shape) for t in tp.instructions]
    assert spec.shared_weights is False and spec.layout == "mul_ir"
    assert (spec.output_order, spec.instruction_order, spec.cg_convention) == ("sorted", instruction_order,
                                                                             cg_convention)
    if cg_convention == "e3nn-0.4":
        # MACE's filter keeps natural-parity outputs only, and every triple e3nn 0.4 negates has an odd
        # l1 + l2 + l3: none is used, so the e3nn 0.6 product above is also e3nn 0.4.4's
        ls = [(spec.irreps_in1[i.i_in1].ir.l, spec.irreps_in2[i.i_in2].ir.l, spec.irreps_out[i.i_out].ir.l)
              for i in spec.instructions]
        assert all(convention_sign(*t, "e3nn-0.4") == 1 for t in ls)


# ---------------------------------------------------------------- numbers, on small versions


def _small_spec(name, in1, filter_, **extra) -> str:
    (spec,) = load_spec(SPEC_DIR / f"{name}.toml")
    keys = dict(name="small", irreps_in1=in1, irreps_in2=str(spec.irreps_in2), irreps_out=filter_, mode="uvu",
                output_order=spec.output_order, instruction_order=spec.instruction_order,
                cg_convention=spec.cg_convention, shared_weights=False)
    keys.update(extra)
    return "[[tensor_product]]\n" + "".join(
        f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}\n".replace("'", '"') for k, v in keys.items()
    )


def _inputs(ir, rows=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, ir.dim_in1)), rng.standard_normal((rows, ir.dim_in2)),
            rng.standard_normal((rows, ir.weight_numel)))


# name -> (small irreps_in1, the model's irreps_out argument for it)
SMALL = {
    "mace_large": ("3x0e+3x1o+3x2e", "3x0e+3x1o+3x2e+3x3o"),
    "nequip_toluene": ("2x0e+2x0o+2x1e+2x1o+2x2e+2x2o", "2x0o+10x0e+2x1o+2x1e+2x2o+2x2e"),
    "sevennet_l3i5": ("3x0e+2x1e+2x2e+2x3e", "0e+1e+2e+3e"),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_version_reference_equals_the_models_e3nn_product(name):
    in1, target = SMALL[name]
    filter_ = "+".join(str(ir) for _, ir in o3.Irreps(target))
    (spec,) = parse_spec(_small_spec(name, in1, filter_))
    tp = _model_tp(name, in1=in1, out=target, compile_left_right=True)
    assert str(spec.irreps_out) == str(tp.irreps_out)
    ir = lower(spec)
    x1, x2, w = _inputs(ir)
    want = _f64(tp, torch.from_numpy(x1), torch.from_numpy(x2), torch.from_numpy(w)).numpy()
    got = tensor_product_reference(ir, x1, x2, w)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_small_nequix_reference_equals_e3nn_jax_tensor_product_times_radial_weights():
    """nequix 0.4.5 NequixConvolution.__call__ without kernel:
    ``e3nn.tensor_product(messages, sh, filter_ir_out=self.tp_irreps) * radial_message``."""
    import e3nn_jax
    import jax

    in1 = "4x0e+3x1o+2x2e+2x3o"
    (spec,) = parse_spec(_small_spec("nequix_main", in1, "0e+1o+2e+3o"))
    ir = lower(spec)
    x1, x2, w = _inputs(ir)
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        messages = e3nn_jax.IrrepsArray(in1, jax.numpy.asarray(x1))
        sh = e3nn_jax.IrrepsArray(e3nn_jax.s2_irreps(3), jax.numpy.asarray(x2))
        tp_irreps = e3nn_jax.Irreps(in1)  # NequixConvolution's filter: its hidden (output) irreps
        out = e3nn_jax.tensor_product(messages, sh, filter_ir_out=tp_irreps) * jax.numpy.asarray(w)
        want = np.asarray(out.array)
    finally:
        jax.config.update("jax_enable_x64", old)
    assert want.dtype == np.float64
    # e3nn-jax sorts and regroups (merges) its output: in mul_ir memory the same as the sorted blocks
    assert str(out.irreps) == str(e3nn_jax.Irreps(str(spec.irreps_out)).regroup())
    got = tensor_product_reference(ir, x1, x2, w)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_small_e3nn04_product_uses_e3nn_044s_coefficients():
    """cg_convention = "e3nn-0.4" where it matters (all-even irreps, as SevenNet's, use (1,2,2)): the
    reference equals the uvu product written with e3nn 0.4.4's own wigner_3j (tests/data) and e3nn's
    path weights, and differs from the e3nn 0.6 product."""
    in1 = "2x0e+2x1e+2x2e"
    (spec,) = parse_spec(_small_spec("sevennet_l3i5", in1, "0e+1e+2e", cg_convention="e3nn-0.4"))
    ir = lower(spec)
    tp = _model_tp("sevennet_l3i5", in1=in1, out="0e+1e+2e", compile_left_right=True)
    x1, x2, w = _inputs(ir, seed=1)
    c044 = np.load(E3NN044)
    want = np.zeros((x1.shape[0], ir.dim_out))
    s1, s2, so = tp.irreps_in1.slices(), tp.irreps_in2.slices(), tp.irreps_out.slices()
    offset = 0
    for t in tp.instructions:  # uvu: out[z, u, k] += pw * W[z, u, v] C[i, j, k] x1[z, u, i] x2[z, v, j]
        (m1, ir1), (m2, ir2), (_, iro) = tp.irreps_in1[t.i_in1], tp.irreps_in2[t.i_in2], tp.irreps_out[t.i_out]
        ww = w[:, offset : offset + m1 * m2].reshape(-1, m1, m2)
        offset += m1 * m2
        a = x1[:, s1[t.i_in1]].reshape(-1, m1, ir1.dim)
        b = x2[:, s2[t.i_in2]].reshape(-1, m2, ir2.dim)
        c = c044[f"{ir1.l},{ir2.l},{iro.l}"]
        want[:, so[t.i_out]] += t.path_weight * np.einsum("zuv,ijk,zui,zvj->zuk", ww, c, a, b).reshape(len(w), -1)
    got = tensor_product_reference(ir, x1, x2, w)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    e3nn06 = _f64(tp, torch.from_numpy(x1), torch.from_numpy(x2), torch.from_numpy(w)).numpy()
    assert np.abs(e3nn06 - want).max() > 0.1  # the flipped paths change the result
