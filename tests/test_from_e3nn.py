"""spec_from_e3nn / spec_from_e3nn_jax: the spec they write computes what the e3nn module computes.

Round trip through text: ``parse_spec(spec_from_e3nn(tp))``, lowered and evaluated by the numpy
reference, against ``tp(x1, x2, w)`` in float64 (rel 1e-12). No kernels run here.
"""

from __future__ import annotations

import contextlib
import tomllib

import numpy as np
import pytest
import torch
from e3nn import o3

from eqdsl import SpecError, cg, lower, parse_spec
from eqdsl.from_e3nn import cg_convention_of, spec_from_e3nn, spec_from_e3nn_jax
from eqdsl.reference import tensor_product_reference

from model_tps import channelwise_tp


@contextlib.contextmanager
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(np.asarray(b)).max(), 1e-300))


def _check_round_trip(tp, text, batch=5, seed=0):
    spec, = parse_spec(text)
    assert str(spec.irreps_in1) == str(tp.irreps_in1)
    assert str(spec.irreps_in2) == str(tp.irreps_in2)
    assert str(spec.irreps_out) == str(tp.irreps_out)  # never sorted or merged
    assert spec.shared_weights == tp.shared_weights
    ir = lower(spec)
    assert ir.weight_numel == tp.weight_numel
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(batch, tp.irreps_in1.dim, generator=g)
    x2 = torch.randn(batch, tp.irreps_in2.dim, generator=g)
    if tp.internal_weights:
        w = tp.weight.detach()
        want = tp(x1, x2)
    else:
        w = torch.randn(tp.weight_numel if tp.shared_weights else (batch, tp.weight_numel), generator=g)
        want = tp(x1, x2, w)
    got = tensor_product_reference(ir, x1.numpy(), x2.numpy(), w.numpy())
    assert _rel(got, want.detach().numpy()) <= 1e-12
    return spec


def _cases():
    return {
        # internal, shared weights; every allowed (i1, i2, i_out), uvw
        "fully_connected": (
            lambda: o3.FullyConnectedTensorProduct("2x0e+1x1o+2x1e", "1x0e+1x1o", "2x1o+2x0e+1x1e"), {}),
        # uuu without weights; output irreps e3nn builds unsorted
        "elementwise": (lambda: o3.ElementwiseTensorProduct("2x0e+2x1o", "2x1o+2x1e"), {}),
        # mixed modes, an unweighted path, per-row weights, non-default normalizations
        "mixed": (lambda: o3.TensorProduct(
            "2x0e+2x1o+1x2e", "2x0e+1x1o+2x2e", "2x1o+2x2e+2x0e+1x1o+2x1e",
            [(1, 2, 0, "uvu", True), (1, 1, 2, "uvu", False), (1, 1, 1, "uvu", True), (0, 0, 2, "uvu", True),
             (2, 1, 3, "uvw", True), (2, 2, 4, "uvv", True), (1, 0, 0, "uuu", True)],
            shared_weights=False, irrep_normalization="norm", path_normalization="path"),
            {"irrep_normalization": "norm", "path_normalization": "path"}),
        "none_normalizations": (lambda: o3.TensorProduct(
            "3x1o+1x2e", "1x1o+1x2e", "3x2e+3x1e+1x1e",
            [(0, 0, 0, "uvu", True), (0, 0, 1, "uvu", True), (1, 1, 2, "uvw", True), (0, 0, 2, "uvw", True)],
            irrep_normalization="none", path_normalization="none"),
            {"irrep_normalization": "none", "path_normalization": "none"}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_spec_round_trip_matches_e3nn(case):
    with float64_default():
        make, norms = _cases()[case]
        torch.manual_seed(1)
        tp = make()
        text = spec_from_e3nn(tp, "from_e3nn", **norms)
        spec = _check_round_trip(tp, text)
    assert spec.name == "from_e3nn" and spec.mode is None
    assert [i.as_tuple()[:5] for i in spec.instructions] == [
        (i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight) for i in tp.instructions]
    assert spec.irrep_normalization == norms.get("irrep_normalization", "component")
    assert spec.path_normalization == norms.get("path_normalization", "element")


def test_options_conv_layout_and_dtypes_reach_the_spec():
    with float64_default():
        tp = o3.TensorProduct("2x0e+2x1o", "0e+1o", "2x1o+2x0e", [(1, 1, 1, "uvu", True), (0, 1, 0, "uvu", True)],
                              shared_weights=False, internal_weights=False)
    text = spec_from_e3nn(tp, "opts", conv=True, layout="ir_mul", dtypes=("float64",), reduce="mean",
                          tuning={"block_b": 4, "fwd": {"num_warps": 2}})
    spec, = parse_spec(text)
    assert (spec.conv, spec.layout, spec.dtypes, spec.reduce) == (True, "ir_mul", ("float64",), "mean")
    assert dict(spec.tuning) == {"block_b": 4, "fwd.num_warps": 2}
    table = tomllib.loads(text)["tensor_product"][0]
    assert "cg_convention" not in table  # the installed e3nn 0.6 has the default convention


def test_a_known_tuning_keeps_only_the_dtypes_the_spec_generates(tmp_path, monkeypatch):
    """A tuned spec of both dtypes offers its tuning to a float32-only spec of the same kernels
    (``eqdsl.tuned``): the float64 keys are dropped, where they would be refused."""
    from eqdsl.backends import check_tuning

    with float64_default():
        tp = o3.TensorProduct("2x0e+2x1o", "0e+1o", "2x1o+2x0e", [(1, 1, 1, "uvu", True), (0, 1, 0, "uvu", True)],
                              shared_weights=False, internal_weights=False)
    monkeypatch.setenv("EQDSL_TUNED_SPECS", str(tmp_path))
    (tmp_path / "tuned.toml").write_text(
        spec_from_e3nn(tp, "tuned", tuning={"pallas_block_batch_float64": 2,
                                            "fwd": {"block_b": 8, "block_b_float64": 2}}))
    spec, = parse_spec(spec_from_e3nn(tp, "derived", dtypes=("float32",)))
    assert dict(spec.tuning) == {"fwd.block_b": 8}
    check_tuning(spec)
    both, = parse_spec(spec_from_e3nn(tp, "derived", dtypes=("float32", "float64")))
    assert dict(both.tuning) == {"fwd.block_b": 8, "fwd.block_b_float64": 2, "pallas_block_batch_float64": 2}


def test_wrong_normalization_is_refused_naming_the_instruction():
    with float64_default():
        tp = o3.TensorProduct("2x0e+2x1o", "0e+1o", "2x1o+2x0e", [(1, 1, 1, "uvu", True), (0, 1, 0, "uvu", True)],
                              irrep_normalization="norm")
    with pytest.raises(ValueError, match=r"instruction 0 \(1, 1, 1, 'uvu', True\): path weight .* "
                                         r"wrong irrep_normalization / path_normalization given\?"):
        spec_from_e3nn(tp, "bad")
    assert parse_spec(spec_from_e3nn(tp, "good", irrep_normalization="norm"))


def test_explicit_path_weights_and_variances_are_refused():
    with float64_default():
        weighted = o3.TensorProduct("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True, 2.0)])
        variances = o3.TensorProduct("2x0e+2x1o", "0e", "2x0e+2x1o", [(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True)],
                                     in1_var=[1.0, 4.0])
    with pytest.raises(ValueError, match="instruction 0 .* wrong irrep_normalization"):
        spec_from_e3nn(weighted, "w")
    with pytest.raises(ValueError, match="instruction 1 .* wrong irrep_normalization"):
        spec_from_e3nn(variances, "v")


def test_unsupported_module_mode_and_options_are_refused():
    with float64_default():
        full = o3.FullTensorProduct("2x0e", "2x1o")  # mode uvuv
        tp = o3.FullyConnectedTensorProduct("2x0e", "0e", "2x0e")
    with pytest.raises(ValueError, match="mode 'uvuv'; eqdsl supports uvw, uvu, uvv, uuu"):
        spec_from_e3nn(full, "full")
    with pytest.raises(TypeError, match="expected an e3nn.o3.TensorProduct, got Linear"):
        spec_from_e3nn(o3.Linear("2x0e", "2x0e"), "lin")
    with pytest.raises(ValueError, match="option 'instructions' comes from the module"):
        spec_from_e3nn(tp, "x", instructions=[])
    with pytest.raises(ValueError, match="option 'shared_weights' comes from the module"):
        spec_from_e3nn(tp, "x", shared_weights=False)
    with pytest.raises(SpecError, match="reduce: only applies to the fused convolution"):
        spec_from_e3nn(tp, "x", reduce="mean")
    with pytest.raises(SpecError, match="name: '1x' is not a valid Python identifier"):
        spec_from_e3nn(tp, "1x")


def test_cg_convention_detection():
    w = cg.wigner_3j(1, 2, 2)
    assert cg_convention_of(w) == "e3nn-0.5"
    assert cg_convention_of(-w) == "e3nn-0.4"
    bad = np.array(w)
    bad[0, 0, 0] += 0.5
    with pytest.raises(ValueError, match="unknown Clebsch-Gordan convention"):
        cg_convention_of(bad)
    # what the installed e3nn computes
    assert cg_convention_of(o3.wigner_3j(1, 2, 2, dtype=torch.float64).numpy()) == "e3nn-0.5"


def test_e3nn_04_signs_give_the_04_convention(monkeypatch):
    """Under an e3nn whose wigner_3j has e3nn 0.4.x's signs, the spec says "e3nn-0.4" and
    computes what that e3nn's TensorProduct computes (e3nn 0.6 with 0.4's wigner_3j patched in)."""
    from e3nn.o3._tensor_product import _codegen

    real = o3.wigner_3j

    def w3j_04(l1, l2, l3, *args, **kwargs):
        c = real(l1, l2, l3, *args, **kwargs)
        return -c if sorted((l1, l2, l3)) in ([1, 2, 2], [1, 3, 3], [1, 4, 4]) else c

    monkeypatch.setattr(o3, "wigner_3j", w3j_04)
    monkeypatch.setattr(_codegen, "wigner_3j", w3j_04)  # what TensorProduct builds its constants with
    with float64_default():
        torch.manual_seed(2)
        tp = o3.FullyConnectedTensorProduct("2x1o+1x2e", "1x2e+1x1o", "2x2o+1x1e+1x0e")
        text = spec_from_e3nn(tp, "old")
        assert tomllib.loads(text)["tensor_product"][0]["cg_convention"] == "e3nn-0.4"
        spec = _check_round_trip(tp, text)
        assert spec.cg_convention == "e3nn-0.4"
        # the same module under the 0.5 convention differs: the check above can fail
        monkeypatch.undo()
        spec05, = parse_spec(text.replace('cg_convention = "e3nn-0.4"', ""))
        x1 = torch.randn(3, tp.irreps_in1.dim)
        x2 = torch.randn(3, tp.irreps_in2.dim)
        w = tp.weight.detach().numpy()
        got05 = tensor_product_reference(lower(spec05), x1.numpy(), x2.numpy(), w)
        assert _rel(got05, tp(x1, x2).detach().numpy()) > 1e-3


def test_e3nn_jax_functional_tensor_product_round_trip():
    jax = pytest.importorskip("jax")
    e3nn_jax = pytest.importorskip("e3nn_jax")
    from e3nn_jax.legacy import FunctionalFullyConnectedTensorProduct, FunctionalTensorProduct

    jax.config.update("jax_enable_x64", True)
    tps = [
        (FunctionalTensorProduct("2x0e+2x1o", "0e+1o+2e", "2x1o+2x2e+2x0e",
                                 [(1, 2, 0, "uvu", True), (1, 1, 1, "uvu", True), (0, 0, 2, "uvu", True),
                                  (1, 1, 2, "uvu", False)]), False),
        (FunctionalFullyConnectedTensorProduct("2x0e+1x1o", "0e+1o", "3x1o+1x0e"), True),
    ]
    for tp, shared in tps:
        text = spec_from_e3nn_jax(tp, "jtp", shared_weights=shared)
        spec, = parse_spec(text)
        assert (str(spec.irreps_in1), str(spec.irreps_out)) == (str(tp.irreps_in1), str(tp.irreps_out))
        ir = lower(spec)
        k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
        x1 = jax.random.normal(k1, (4, tp.irreps_in1.dim), dtype=jax.numpy.float64)
        x2 = jax.random.normal(k2, (4, tp.irreps_in2.dim), dtype=jax.numpy.float64)
        w = jax.random.normal(k3, ((ir.weight_numel,) if shared else (4, ir.weight_numel)), dtype=jax.numpy.float64)

        def one(a, b, wi):
            a, b = e3nn_jax.IrrepsArray(tp.irreps_in1, a), e3nn_jax.IrrepsArray(tp.irreps_in2, b)
            return tp.left_right(wi, a, b).array

        want = jax.vmap(one, in_axes=(0, 0, None if shared else 0))(x1, x2, w)
        assert _rel(tensor_product_reference(ir, x1, x2, w), want) <= 1e-12

    element = FunctionalTensorProduct("2x0e", "2x0e", "2x0e", [(0, 0, 0, "uvw", True)],
                                      gradient_normalization="element")
    with pytest.raises(ValueError, match="gradient_normalization='element'"):
        spec_from_e3nn_jax(element, "g")
    with pytest.raises(TypeError, match="FunctionalTensorProduct"):
        spec_from_e3nn_jax(object(), "x")


def test_standard_problem_kernels_get_their_measured_tuning():
    """MACE's product on the mace_large irreps is mace_large's kernels: the spec carries the
    example's tuning table (eqdsl.tuned); ``tuning={}`` keeps eqdsl's defaults; a product that
    is no standard problem gets none. The tuning never enters the function: same IR paths."""
    from pathlib import Path

    from eqdsl import load_spec

    (example,) = load_spec(Path(__file__).resolve().parents[1] / "examples" / "specs" / "mace_large.toml")
    tp = channelwise_tp("128x0e+128x1o+128x2e", "0e+1o+2e+3o", "0e+1o+2e+3o")
    tuned = parse_spec(spec_from_e3nn(tp, "mace_tp", conv=True))[0]
    assert tuned.tuning == example.tuning and tuned.tuning
    plain = parse_spec(spec_from_e3nn(tp, "mace_tp", conv=True, tuning={}))[0]
    assert plain.tuning == ()
    assert lower(tuned).paths == lower(plain).paths
    other = channelwise_tp("8x0e+8x1o", "0e+1o", "0e+1o")
    assert parse_spec(spec_from_e3nn(other, "small"))[0].tuning == ()
