"""eqdsl.torch.TensorProduct / Conv against the e3nn modules they are built from (float64,
interpreted kernels), their e3nn metadata, internal weights, copies and refusals; eqdsl.jax's
init / apply / conv against e3nn-jax.

Two small channelwise products keep the interpreted kernels few (CI time; their backward is
one fused kernel): one with internal (shared) weights, and a MACE-like conv with per-edge
weights; forward and first derivatives of each."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from e3nn import o3

import eqdsl.torch as et

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("eqdsl-cache")


@pytest.fixture(scope="module")
def fc(cache):
    torch.manual_seed(0)
    tp = o3.TensorProduct("2x0e+1x1o", "1x0e+1x1o", "2x0e+2x1o+1x1e+1x0e",
                          [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 1, 2, "uvu", True),
                           (1, 1, 3, "uvu", True)])
    assert tp.internal_weights
    return tp, et.TensorProduct.from_e3nn(tp, dtypes=["float64"], cache_dir=cache)


@pytest.fixture(scope="module")
def conv(cache):
    tp = o3.TensorProduct("2x0e+2x1o", "0e+1o", "2x0e+2x1o+2x1o+2x0e",
                          [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 2, "uvu", True),
                           (1, 1, 3, "uvu", True)], shared_weights=False, internal_weights=False)
    return tp, et.Conv.from_e3nn(tp, dtypes=["float64"], cache_dir=cache)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().detach() / b.abs().max().detach())


def test_metadata_is_e3nns(fc, conv):
    for tp, m in (fc, conv):
        assert (str(m.irreps_in1), str(m.irreps_in2), str(m.irreps_out)) == (
            str(tp.irreps_in1), str(tp.irreps_in2), str(tp.irreps_out))
        assert (m.weight_numel, m.shared_weights, m.internal_weights) == (
            tp.weight_numel, tp.shared_weights, tp.internal_weights)
        assert len(m.instructions) == len(tp.instructions)
        for a, b in zip(m.instructions, tp.instructions):
            assert a[:5] == tuple(b[:5]) and a.path_shape == b.path_shape
            assert abs(a.path_weight - b.path_weight) <= 1e-15 * b.path_weight
    tp, m = fc
    assert torch.equal(m.weight, tp.weight) and m.weight is not tp.weight  # copied, not shared
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert list(conv[1].parameters()) == []


def test_tensor_product_matches_e3nn_with_broadcast_and_gradients(fc):
    tp, m = fc
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(2, 3, tp.irreps_in1.dim, generator=g, requires_grad=True)
    x2 = torch.randn(3, tp.irreps_in2.dim, generator=g, requires_grad=True)  # broadcast over the first dim
    want, got = tp(x1, x2), m(x1, x2)
    assert got.shape == want.shape == (2, 3, tp.irreps_out.dim)
    assert _rel(got, want) <= 1e-12
    cot = torch.randn(want.shape, generator=g)
    gw = torch.autograd.grad((want * cot).sum(), (x1, x2, tp.weight))
    gg = torch.autograd.grad((got * cot).sum(), (x1, x2, m.weight))
    for a, b in zip(gg, gw):
        assert _rel(a, b) <= 1e-12
    # explicit weights override the internal ones, as in e3nn
    w = torch.randn(tp.weight_numel, generator=g)
    assert _rel(m(x1[0], x2, w), tp(x1[0], x2, w)) <= 1e-12


def test_conv_matches_e3nn_gather_scatter_and_gradients(conv):
    tp, m = conv
    g = torch.Generator().manual_seed(2)
    n, src, dst = 5, torch.tensor([0, 1, 2, 3, 4, 0, 2, 4]), torch.tensor([1, 2, 3, 4, 0, 2, 2, 1])
    x = torch.randn(n, tp.irreps_in1.dim, generator=g, requires_grad=True)
    y = torch.randn(len(src), tp.irreps_in2.dim, generator=g, requires_grad=True)
    w = torch.randn(len(src), tp.weight_numel, generator=g, requires_grad=True)
    want = torch.zeros(n, tp.irreps_out.dim).index_add(0, dst, tp(x[src], y, w))
    got = m(x, y, w, src, dst, n)
    assert _rel(got, want) <= 1e-12
    cot = torch.randn(want.shape, generator=g)
    gw = torch.autograd.grad((want * cot).sum(), (x, y, w))
    gg = torch.autograd.grad((got * cot).sum(), (x, y, w))
    for a, b in zip(gg, gw):
        assert _rel(a, b) <= 1e-12


def test_copies_and_pickles_keep_the_package(fc):
    tp, m = fc
    x1, x2 = torch.randn(4, tp.irreps_in1.dim), torch.randn(4, tp.irreps_in2.dim)
    out = m(x1, x2)
    c = copy.deepcopy(m)
    assert c.package is m.package and torch.equal(c(x1, x2), out)
    p = pickle.loads(pickle.dumps(m))
    assert torch.equal(p.weight, m.weight) and p.package is m.package
    # a fresh process loads the package again from the module's spec text (no kernel runs)
    script = textwrap.dedent(f"""
        import pickle, sys
        sys.path.insert(0, {str(ROOT)!r})
        m = pickle.loads(sys.stdin.buffer.read())
        print(m.package.IRREPS_OUT, m.package.WEIGHT_NUMEL)
    """)
    r = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(m), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().split() == [str(tp.irreps_out), str(tp.weight_numel)]


def test_defaults_and_refusals(fc, conv):
    tp, m = fc
    pkg, cpkg = m.package, conv[1].package
    assert et.TensorProduct(pkg).internal_weights  # e3nn's default: shared and weighted
    assert et.TensorProduct(pkg, internal_weights=False).weight is None
    assert et.TensorProduct(cpkg).internal_weights is False
    assert et.TensorProduct(cpkg).weight is None
    with pytest.raises(ValueError, match="internal weights need shared weights"):
        et.TensorProduct(cpkg, internal_weights=True)
    with pytest.raises(ValueError, match="weights must be given"):
        et.TensorProduct(pkg, internal_weights=False)(torch.randn(1, 5), torch.randn(1, 4))
    with pytest.raises(ValueError, match="has no conv = true"):
        et.Conv(pkg)
    with pytest.raises(TypeError, match="not a generated eqdsl package"):
        et.TensorProduct(torch)
    fresh = et.TensorProduct(pkg)
    assert fresh.weight.shape == (tp.weight_numel,) and not torch.equal(fresh.weight, m.weight)


def test_jax_functions_match_e3nn_jax(fc, conv):
    """eqdsl.jax on the same packages: apply against e3nn-jax, conv against a gather / scatter."""
    jax = pytest.importorskip("jax")
    e3nn_jax = pytest.importorskip("e3nn_jax")
    from e3nn_jax.legacy import FunctionalTensorProduct

    import eqdsl.jax as ej

    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    tp, m = fc
    pkg = m.package
    w = ej.init(jax.random.PRNGKey(0), pkg, dtype=jnp.float64)
    assert w.shape == (pkg.WEIGHT_NUMEL,) and w.dtype == jnp.float64
    ref = FunctionalTensorProduct(pkg.IRREPS_IN1, pkg.IRREPS_IN2, pkg.IRREPS_OUT,
                                  [tuple(i[:5]) for i in pkg.INSTRUCTIONS])
    x1 = jax.random.normal(jax.random.PRNGKey(1), (2, 3, pkg.DIM_IN1), dtype=jnp.float64)
    x2 = jax.random.normal(jax.random.PRNGKey(2), (3, pkg.DIM_IN2), dtype=jnp.float64)
    got = jax.jit(lambda w, a, b: ej.apply(pkg, w, a, b))(w, x1, x2)
    want = jax.vmap(jax.vmap(lambda a, b: ref.left_right(w, e3nn_jax.IrrepsArray(ref.irreps_in1, a),
                                                         e3nn_jax.IrrepsArray(ref.irreps_in2, b)).array),
                    in_axes=(0, None))(x1, x2)
    assert got.shape == (2, 3, pkg.DIM_OUT)
    assert float(jnp.abs(got - want).max() / jnp.abs(want).max()) <= 1e-12

    ctp, cm = conv
    cpkg = cm.package
    with pytest.raises(ValueError, match="per-row weights"):
        ej.init(jax.random.PRNGKey(0), cpkg)
    with pytest.raises(ValueError, match="has no conv = true"):
        ej.conv(pkg, w, x1[0], x2, jnp.zeros(3, int), jnp.zeros(3, int), 3)
    n, src, dst = 5, np.array([0, 1, 2, 3, 4, 0, 2, 4]), np.array([1, 2, 3, 4, 0, 2, 2, 1])
    rng = np.random.default_rng(3)
    x, y, we = (rng.normal(size=s) for s in ((n, cpkg.DIM_IN1), (len(src), cpkg.DIM_IN2),
                                              (len(src), cpkg.WEIGHT_NUMEL)))
    got = ej.conv(cpkg, jnp.asarray(we), jnp.asarray(x), jnp.asarray(y), jnp.asarray(src), jnp.asarray(dst), n)
    t = [torch.from_numpy(a) for a in (x, y, we)]
    want = torch.zeros(n, cpkg.DIM_OUT).index_add(0, torch.from_numpy(dst), ctp(t[0][src], t[1], t[2]))
    assert float(np.abs(np.asarray(got) - want.numpy()).max() / want.abs().max()) <= 1e-12
