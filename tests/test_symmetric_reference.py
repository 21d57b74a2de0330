"""eqdsl.symmetric: exact U tensors equal mace-torch's ``U_matrix_real``; the IR's terms, the
dense U contraction and mace's ``SymmetricContraction`` compute the same function (float64);
it is equivariant under rotations and inversion.

mace-torch 0.3.16 pins e3nn 0.4.4; the environment has e3nn 0.6. mace's U with the installed
e3nn is the ``"e3nn-0.5"`` convention. For ``"e3nn-0.4"``, mace's ``o3.wigner_3j`` is replaced
by e3nn 0.4.4's own tables (``tests/data/e3nn044_wigner_3j.npz``, every triple with l <= 5,
written by e3nn 0.4.4 itself; see ``tests/data/make_e3nn044_wigner.py``); a triple beyond them
returns NaN, which would poison any U that used it.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eqdsl.errors import SpecError
from eqdsl.irreps import Irrep
from eqdsl.symmetric.lower import lower, mace_weight_blocks, spec_from_mace, weights_from_mace, weights_to_mace
from eqdsl.symmetric.reference import dense_reference, from_channels, symmetric_contraction_reference, to_channels
from eqdsl.symmetric.spec import parse_symmetric_specs
from eqdsl.symmetric.u_tensors import coupling_irreps, u_tensor_dense

e3nn_o3 = pytest.importorskip("e3nn.o3")
mace_cg = pytest.importorskip("mace.tools.cg")
mace_sc = pytest.importorskip("mace.modules.symmetric_contraction")

E3NN044 = Path(__file__).resolve().parent / "data" / "e3nn044_wigner_3j.npz"


def _spec(irreps_in, irreps_out, correlation, num_elements=3, layout="mul_ir", cg="e3nn-0.5"):
    corr = correlation if isinstance(correlation, int) else \
        "{" + ", ".join(f'"{k}" = {v}' for k, v in correlation.items()) + "}"
    (spec,) = parse_symmetric_specs(
        f'[[symmetric_contraction]]\nname = "s"\nirreps_in = "{irreps_in}"\nirreps_out = "{irreps_out}"\n'
        f'correlation = {corr}\nnum_elements = {num_elements}\nlayout = "{layout}"\ncg_convention = "{cg}"\n')
    return spec


@pytest.fixture
def e3nn044(monkeypatch):
    """mace.tools.cg with e3nn 0.4.4's wigner_3j (its tables, l <= 5; NaN beyond)."""
    data = np.load(E3NN044)
    assert str(data["e3nn_version"]) == "0.4.4" and int(data["lmax"]) == 5
    tables = {tuple(int(x) for x in k.split(",")): data[k] for k in data.files if "," in k}
    used = set()

    def wigner_3j(l1, l2, l3, dtype=None, device=None):
        c = tables.get((l1, l2, l3))
        if c is None:
            c = np.full((2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1), np.nan)
        else:
            used.add((l1, l2, l3))
        return torch.tensor(c, dtype=dtype or torch.get_default_dtype(), device=device)

    shim = types.SimpleNamespace(Irreps=e3nn_o3.Irreps, Irrep=e3nn_o3.Irrep, wigner_3j=wigner_3j)
    monkeypatch.setattr(mace_cg, "o3", shim)
    return used


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _mace_u(irreps, out, nu):
    return mace_cg.U_matrix_real(irreps, out, nu, use_cueq_cg=False, dtype=torch.float64)[-1].numpy()


def _compare_u(irreps, outs, nus, convention):
    """max |ours - mace| over the cases; asserts each has mace's shape (up to its squeezes)."""
    diffs = {}
    for out in outs:
        for nu in nus:
            theirs = _mace_u(irreps, out, nu)
            ours = u_tensor_dense(coupling_irreps(irreps), Irrep.parse(out), nu, convention)
            assert not np.isnan(theirs).any(), (out, nu)
            if ours.shape[-1] == 0:  # no path: mace keeps one parameter of zeros
                assert theirs.shape[-1] == 1 and not theirs.any(), (out, nu)
                continue
            # mace squeezes every axis of size 1 (the 2L+1 axis of a scalar output)
            assert theirs.shape == tuple(n for n in ours.shape[:-1] if n != 1) + ours.shape[-1:], (out, nu)
            err = float(np.abs(ours.reshape(theirs.shape) - theirs).max())
            assert err <= 1e-12, f"U({irreps} -> {out}, nu={nu}, {convention}) differs from mace's by {err}"
            diffs[(out, nu)] = ours
    return diffs


# ---------------------------------------------------------------- U tensors against mace's


def test_u_equals_mace_e3nn05_up_to_correlation_3():
    # 1e has paths at orders 2 and 3 only (order 1: mace's zeros); 2e's order 3 has 26 paths
    _compare_u("0e+1o+2e", ["0e", "1o", "2e", "1e"], [1, 2, 3], "e3nn-0.5")


def test_u_equals_mace_at_correlation_4_with_its_natural_parity_filter():
    # mace filters every intermediate and final irrep of order 4 to natural parity (l, (-1)^l):
    # 1e has paths at order 3 and none at order 4
    _compare_u("0e+1o", ["0e", "1o", "1e"], [3, 4], "e3nn-0.5")
    assert u_tensor_dense(coupling_irreps("0e+1o"), Irrep.parse("1e"), 4).shape[-1] == 0
    assert u_tensor_dense(coupling_irreps("0e+1o"), Irrep.parse("1e"), 3).shape[-1] > 0


def test_u_equals_mace_with_e3nn044_signs(e3nn044):
    # (MACE-MP's case, 0e+1o+2e+3o at correlation 3, is compared as a function with mace's
    # module below: its U here would cost mace ~3 s per output on CI's cores)
    ours04 = _compare_u("0e+1o+2e", ["0e", "1o", "2e"], [1, 2, 3], "e3nn-0.4")
    ours04.update({(k[0], 4): v for k, v in _compare_u("0e+1o", ["0e", "1o"], [4], "e3nn-0.4").items()})
    # the e3nn 0.4.4 tables were used, including triples whose sign differs from e3nn >= 0.5
    assert {(1, 2, 2), (2, 1, 2), (2, 2, 1)} <= e3nn044
    differ = [key for key, u in ours04.items()
              if not np.array_equal(u, u_tensor_dense(coupling_irreps(
                  "0e+1o+2e" if key[1] < 4 else "0e+1o"), Irrep.parse(key[0]), key[1], "e3nn-0.5"))]
    assert differ, "the two conventions gave the same U everywhere: the e3nn-0.4 comparison proves nothing"


def test_u_is_memoized_and_read_only():
    """A second request returns the same array (computed once per process; how long the
    first takes is a benchmark's business, not a test's), which nobody can modify."""
    irreps = coupling_irreps("0e+1o+2e+3o")  # MACE-MP's A basis (its module test below reuses the cache)
    a = u_tensor_dense(irreps, Irrep.parse("1o"), 3, "e3nn-0.4")
    b = u_tensor_dense(irreps, Irrep.parse("1o"), 3, "e3nn-0.4")
    assert a is b and not a.flags.writeable
    assert np.abs(a).max() > 0.1


# ---------------------------------------------------------------- the three evaluations agree


def _inputs(spec, n=7, seed=0):
    rng = np.random.default_rng(seed)
    ir = lower(spec)
    x = rng.normal(size=(n, ir.dim_in * ir.mul))
    w = rng.normal(size=(ir.num_elements, ir.weight_numel))
    elem = rng.integers(0, ir.num_elements, n)
    return ir, x, w, elem


@pytest.mark.parametrize("case", [
    ("2x0e+2x1o+2x2e+2x3o", "2x0e+2x1o", 3, "mul_ir"),
    ("3x0e+3x1o+3x2e", "3x2e+3x0e+3x1e", {"0e": 1, "2e": 3, "1e": 2}, "ir_mul"),
    ("2x0e+2x1o", "2x0e+2x1o", 4, "ir_mul"),
    ("2x1o+2x0e+2x1e", "2x1o+2x0e", 2, "mul_ir"),
])
def test_ir_terms_equal_the_dense_u_contraction(case):
    spec = _spec(*case[:3], layout=case[3])
    ir, x, w, elem = _inputs(spec)
    ours = symmetric_contraction_reference(x, w, elem, ir)
    dense = dense_reference(spec, x, w, elem)
    assert ours.shape == dense.shape == (x.shape[0], sum(ir.out_dims) * ir.mul)
    assert np.abs(dense).max() > 0.1
    np.testing.assert_allclose(ours, dense, rtol=0, atol=1e-12 * np.abs(dense).max())


_IRS = ["0e", "1o", "1e", "2e", "2o"]


@settings(max_examples=15)
@given(st.lists(st.sampled_from(_IRS), min_size=1, max_size=3, unique=True),
       st.lists(st.sampled_from(_IRS), min_size=1, max_size=2, unique=True),
       st.lists(st.integers(1, 3), min_size=2, max_size=2), st.integers(1, 2), st.sampled_from(["mul_ir", "ir_mul"]))
def test_ir_terms_equal_dense_u_for_random_specs(ins, outs, corrs, mul, layout):
    spec = _spec("+".join(f"{mul}x{i}" for i in ins), "+".join(f"{mul}x{o}" for o in outs),
                 {o: corrs[k] for k, o in enumerate(outs)}, num_elements=2, layout=layout)
    try:
        lower(spec)
    except SpecError as e:
        assume("no path" not in e.reason)
        raise
    ir, x, w, elem = _inputs(spec, n=4)
    dense = dense_reference(spec, x, w, elem)
    np.testing.assert_allclose(symmetric_contraction_reference(x, w, elem, ir), dense, rtol=0,
                               atol=1e-12 * max(1.0, np.abs(dense).max()))


def _mace_module(spec):
    return mace_sc.SymmetricContraction(e3nn_o3.Irreps(str(spec.irreps_in)), e3nn_o3.Irreps(str(spec.irreps_out)),
                                        correlation=spec.correlation[0], num_elements=spec.num_elements)


def _compare_with_mace(spec, seed=0, layouts=("mul_ir",)):
    """Our IR reference (in each of ``layouts``) against mace's module with random weights,
    through the weight mapping."""
    torch.manual_seed(seed)
    module = _mace_module(spec)
    ir = lower(spec)
    with torch.no_grad():  # random, not mace's init, so every weight matters
        for p in module.parameters():
            if p.requires_grad:
                p.normal_()
    w = weights_from_mace(ir, mace_weight_blocks(module))
    assert tuple(w.shape) == (ir.num_elements, ir.weight_numel)
    # the spec read back from the module, its CG convention recognized from its U buffers
    assert spec_from_mace(module, spec.name) == spec
    rng = np.random.default_rng(seed)
    n, dims = 9, tuple(mi.ir.dim for mi in spec.irreps_in)
    xc = rng.normal(size=(n, sum(dims), ir.mul))  # (node, component, channel)
    elem = rng.integers(0, ir.num_elements, n)
    y = torch.nn.functional.one_hot(torch.tensor(elem), ir.num_elements).double()
    # mace's input is (node, channel, component); its output is mul_ir
    theirs_mul_ir = module(torch.tensor(xc).transpose(1, 2), y).detach().numpy()
    assert np.abs(theirs_mul_ir).max() > 0.1
    for layout in layouts:
        ir_l = dataclasses.replace(ir, layout=layout)
        theirs = from_channels(to_channels(theirs_mul_ir, ir.out_dims, ir.mul, "mul_ir"), ir.out_dims, layout)
        ours = symmetric_contraction_reference(from_channels(xc, dims, layout), w.detach().numpy(), elem, ir_l)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12 * np.abs(theirs).max())
    return module, ir, w


def test_equals_mace_symmetric_contraction(float64):
    _compare_with_mace(_spec("3x0e+3x1o+3x2e", "3x0e+3x1o+3x2e", 3), layouts=("mul_ir", "ir_mul"))


def test_equals_mace_symmetric_contraction_e3nn044(float64, e3nn044):
    module, ir, _ = _compare_with_mace(_spec("3x0e+3x1o+3x2e+3x3o", "3x0e+3x1o", 3, cg="e3nn-0.4"))
    assert ir.num_params == ((1, 4, 23), (1, 6, 51))  # MACE-MP's contraction at mul 3
    assert {(1, 2, 2), (1, 3, 3)} <= {tuple(sorted(t)) for t in e3nn044}


def test_equals_mace_at_correlation_4(float64):
    module, _, _ = _compare_with_mace(_spec("2x0e+2x1o", "2x0e+2x1o", 4))
    # U buffers of another basis (here: one path's sign flipped) are refused
    with torch.no_grad():
        module.contractions[1].U_matrix_2[..., 0] *= -1
    with pytest.raises(ValueError, match="neither CG convention.*use_reduced_cg=True"):
        spec_from_mace(module, "s")


def test_equals_mace_where_its_zeroed_weights_belong_to_another_order(float64):
    # 0e+1o -> 2e has no path at order 1; mace then zeroes (and freezes) `weights[0]`, which is
    # order N-1 = 2, not order 1: the mapping reads the parameters as they are, so the
    # functions agree (order 2 contributes 0 in both)
    module, ir, w = _compare_with_mace(_spec("3x0e+3x1o", "3x2e", 3))
    assert ir.num_params[0][0] == 0 and ir.num_params[0][1] > 0
    (w_max, ws), = mace_weight_blocks(module)
    assert not ws[0].any() and ws[1].any()  # order 2 zeroed, order 1's placeholder random
    off, k = ir.weight_offsets[0][1], ir.num_params[0][1]
    assert not w[:, off:off + k * ir.mul].any()


# ---------------------------------------------------------------- weight mapping


def test_weight_mapping_round_trip_and_errors(float64):
    spec = _spec("2x0e+2x1o", "2x0e+2x2e", 3)
    ir = lower(spec)
    module = _mace_module(spec)
    blocks = mace_weight_blocks(module)
    w = weights_from_mace(ir, blocks)
    assert w.requires_grad  # only reshapes and a concatenation: differentiable
    back = weights_to_mace(ir, w.detach())
    for (a_max, a), (b_max, b) in zip(blocks, back):
        assert torch.equal(a_max, b_max) or (not a_max.any() and not b_max.any())
        for x, y in zip(a, b):
            assert x.shape == y.shape
            assert torch.equal(x, y) or not y.any()  # no path: mace's placeholder, zeros here
    # numpy in, numpy out; column order as documented
    wn = np.arange(ir.num_elements * ir.weight_numel, dtype=np.float64).reshape(ir.num_elements, ir.weight_numel)
    (b0_max, b0), _ = weights_to_mace(ir, wn)
    assert b0_max.shape == (3, ir.num_params[0][2], 2) and b0_max[1, 0, 1] == wn[1, 1]
    np.testing.assert_array_equal(weights_from_mace(ir, weights_to_mace(ir, wn)), wn)
    with pytest.raises(ValueError, match="expected"):
        weights_to_mace(ir, wn[:, 1:])
    with pytest.raises(ValueError, match="output blocks"):
        weights_from_mace(ir, blocks[:1])
    with pytest.raises(ValueError, match="shape"):
        weights_from_mace(ir, [(blocks[0][0][:, :, :1], blocks[0][1]), blocks[1]])


# ---------------------------------------------------------------- equivariance


@pytest.mark.parametrize("cg", ["e3nn-0.5", "e3nn-0.4"])
def test_equivariant_under_rotation_and_inversion(float64, cg):
    spec = _spec("2x0e+2x1o+2x2e+2x3o", "2x0e+2x1o+2x2e+2x1e", 3, cg=cg)
    ir, x, w, elem = _inputs(spec, n=5, seed=1)
    torch.manual_seed(0)
    r = e3nn_o3.rand_matrix()
    d_in = e3nn_o3.Irreps(ir.irreps_in)
    d_out = e3nn_o3.Irreps(ir.irreps_out)
    out = symmetric_contraction_reference(x, w, elem, ir)
    for mat in (r, -r, -torch.eye(3)):  # rotation, rotation with inversion, inversion
        a, b = d_in.D_from_matrix(mat).numpy(), d_out.D_from_matrix(mat).numpy()
        rotated = symmetric_contraction_reference(x @ a.T, w, elem, ir)
        np.testing.assert_allclose(rotated, out @ b.T, rtol=0, atol=1e-11 * np.abs(out).max())
    # the odd and even 1 outputs really differ under inversion (1e is not 0 here)
    assert np.abs(out[:, -6:]).max() > 0.1
