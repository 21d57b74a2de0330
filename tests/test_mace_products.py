"""eqdsl.integrations.mace.accelerate(products=True): each product block's symmetric contraction
(MACESymmetricContraction) against mace-torch 0.3.16's SymmetricContraction it replaces (float64,
interpreted kernels): a whole ScaleShiftMACE's energy, forces and force-loss gradients with
respect to every parameter (1e-10 relative, the conv replaced too, as accelerate's defaults do);
the product module alone with node_attrs requiring grad (its exact gradient); state dict keys;
refusals (a node_attrs that is not one-hot, bad shapes, a basis other than mace's e3nn one, a
converted module) with nothing replaced.

The model is tiny on purpose (CI time is interpreted-kernel compile time): hidden 4x0e+4x1o,
max_ell 1, correlation 2, two interactions, two elements, a 5-atom molecule. The first product
block contracts 4x0e+4x1o -> 4x0e+4x1o (both output blocks, so the ir_mul -> mul_ir conversion is
exercised), the second -> 4x0e.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("mace", reason="mace-torch: pip install --no-deps mace-torch==0.3.16 (docs/models.md)")

from e3nn import o3  # noqa: E402
from mace.modules.symmetric_contraction import SymmetricContraction  # noqa: E402

from mace_tiny import tiny_batch, tiny_mace  # noqa: E402
from eqdsl.integrations.mace import MACEConvTP, MACESymmetricContraction, accelerate, packages  # noqa: E402

REL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(scope="module")
def model():
    return tiny_mace()


@pytest.fixture(scope="module")
def batch():
    return tiny_batch()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def fast(model, cache):
    return accelerate(copy.deepcopy(model), cache_dir=cache)  # products=True is the default


def _rel(a, b) -> float:
    return float((a - b).abs().max().detach() / b.abs().max().detach())


def test_accelerate_replaces_each_symmetric_contraction(model, fast):
    for orig, new in zip(model.products, fast.products):
        assert type(orig.symmetric_contractions) is SymmetricContraction
        sc = new.symmetric_contractions
        assert type(sc) is MACESymmetricContraction
        assert str(sc.irreps_out) == str(orig.symmetric_contractions.irreps_out)
        # the same parameter and buffer names (mace's Contraction children under "contractions")
        assert list(sc.state_dict()) == list(orig.symmetric_contractions.state_dict())
        assert sc.package.LAYOUT == "ir_mul" and sc.package.DTYPES == ("float64",)
    assert [str(p.symmetric_contractions.irreps_out) for p in fast.products] == ["4x0e+4x1o", "4x0e"]
    assert all(isinstance(b.conv_tp, MACEConvTP) for b in fast.interactions)
    # the whole model's keys: only the convs' e3nn buffers are gone (test_mace_integration's business)
    keep = [k for k in model.state_dict() if ".conv_tp." not in k]
    assert [k for k in fast.state_dict() if ".conv_tp." not in k] == keep
    assert fast.load_state_dict({k: model.state_dict()[k] for k in keep}, strict=False).unexpected_keys == []
    names = [p.__name__ for p in packages(fast)]
    assert len(names) == 4 and sum("mace_products_" in n for n in names) == 2
    # a deep copy keeps working on the same package (spec text kept, no module object copied)
    sc = copy.deepcopy(fast.products[0].symmetric_contractions)
    assert sc.package is fast.products[0].symmetric_contractions.package


def test_training_energy_forces_and_force_loss_gradients(model, fast, batch):
    results = []
    for m in (model, fast):
        b = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
        out = m(b, training=True, compute_force=True)
        loss = (out["forces"] ** 2).sum() + 0.5 * (out["energy"] ** 2).sum()
        params = [p for p in m.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        results.append((out["energy"].detach(), out["forces"].detach(), grads))
    (e0, f0, g0), (e1, f1, g1) = results
    assert _rel(e1, e0) <= REL
    assert _rel(f1, f0) <= REL and f0.abs().max() > 1e-3
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    checked = []
    for name, a, b in zip(names, g1, g0):
        assert (a is None) == (b is None), name
        if b is not None and b.abs().max() > 0:
            assert _rel(a, b) <= REL, name
            checked.append(name)
    products = [n for n in names if ".symmetric_contractions." in n]
    assert len(products) == 6 and set(products) <= set(checked)  # every product weight reached and equal
    assert len(checked) >= len(names) - 2


def test_product_module_alone_with_node_attrs_gradient(model, fast):
    """The module with mace's call: random node_feats, one-hot node_attrs requiring grad (as
    AtomicDipolesMACE sets it). Output and gradients in node_feats, node_attrs (the on-demand
    per-element backward) and the weights equal mace's module."""
    orig, new = model.products[0].symmetric_contractions, fast.products[0].symmetric_contractions
    g = torch.Generator().manual_seed(7)
    n = 6
    x = torch.randn(n, 4, 4, generator=g, requires_grad=True)
    y = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 0, 1, 0]), 2).double().requires_grad_(True)
    cot = torch.randn(n, 16, generator=g)
    res = []
    for mod in (orig, new):
        out = mod(x, y)
        ws = [p for p in mod.parameters() if p.requires_grad]
        res.append((out.detach(), torch.autograd.grad((out * cot).sum(), [x, y, *ws])))
    (o0, g0), (o1, g1) = res
    assert o1.shape == (n, 16) and _rel(o1, o0) <= REL
    assert len(g0) == len(g1) == 6
    for a, b in zip(g1, g0):
        assert _rel(a, b) <= REL
    assert g0[1].abs().min() > 0  # every element's gradient entry is nonzero: a real check


def test_refusals(model, fast, cache, batch):
    # a whole model fed a node_attrs that is not one-hot (mace would weight the elements' weights)
    soft = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
    soft["node_attrs"] = 0.75 * soft["node_attrs"] + 0.25 * (1 - soft["node_attrs"])
    with torch.no_grad(), pytest.raises(ValueError, match="not exactly one-hot"):
        fast(soft, training=False, compute_force=False)
    sc = fast.products[0].symmetric_contractions
    x = torch.randn(3, 4, 4)
    with pytest.raises(ValueError, match="not exactly one-hot"):
        sc(x, torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="not exactly one-hot"):
        sc(x, torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"node_feats must have shape \(num_nodes, 4, 4\)"):
        sc(x.reshape(3, 16), torch.eye(2)[[0, 1, 0]])
    with pytest.raises(ValueError, match="node_attrs must be a float"):
        sc(x, torch.tensor([0, 1, 0]))
    # another basis of the same space (a U column negated, as cuEquivariance's basis differs
    # from e3nn's): not mace's U_matrix_real, refused, and nothing of the model replaced
    other = copy.deepcopy(model)
    u = other.products[0].symmetric_contractions.contractions[1].U_matrix_2
    u[..., 0] *= -1
    with pytest.raises(ValueError, match="use_reduced_cg=True"):
        accelerate(other, cache_dir=cache)
    assert isinstance(other.interactions[0].conv_tp, o3.TensorProduct)
    assert type(other.products[0].symmetric_contractions) is SymmetricContraction
    converted = copy.deepcopy(model)
    converted.products[1].symmetric_contractions = torch.nn.Identity()
    with pytest.raises(TypeError, match="not mace's SymmetricContraction"):
        accelerate(converted, cache_dir=cache)
    half = copy.deepcopy(model)
    half.products[1].symmetric_contractions = fast.products[1].symmetric_contractions
    with pytest.raises(ValueError, match="accelerated already"):
        accelerate(half, cache_dir=cache)
    # products=False leaves them mace's
    kept = accelerate(copy.deepcopy(model), products=False, cache_dir=cache)
    assert all(type(p.symmetric_contractions) is SymmetricContraction for p in kept.products)


def test_symmetric_load_caches_by_canonical_text(tmp_path):
    """eqdsl.symmetric.load (what MACESymmetricContraction loads through): the same spec as an
    object, text written differently or a file gives one module; the canonical text reads back
    equal (per-output correlations too); a second spec under a loaded name is refused. No kernel
    runs here."""
    from eqdsl.symmetric import load, parse_symmetric_specs, symmetric_spec_to_toml

    text = ('[[symmetric_contraction]]\nname = "load_probe"\nirreps_in = "2x0e+2x1o"\nirreps_out = "2x0e+2x1o"\n'
            'correlation = { "1o" = 1, "0e" = 2 }  # a comment\nnum_elements = 2\ndtypes = ["float64"]\n')
    (spec,) = parse_symmetric_specs(text)
    canonical = symmetric_spec_to_toml(spec)
    assert parse_symmetric_specs(canonical) == (spec,) and "comment" not in canonical
    file = tmp_path / "s.toml"
    file.write_text(text)
    cache = tmp_path / "cache"
    pkg = load(spec, cache_dir=cache)
    assert load(text, cache_dir=cache) is pkg and load(file, cache_dir=cache) is pkg
    assert pkg.CORRELATION == (2, 1) and pkg.NUM_ELEMENTS == 2
    assert open(pkg.SPEC_FILE).read() == canonical
    assert len([d for d in (cache / "packages").iterdir() if not d.name.startswith(".")]) == 1
    with pytest.raises(ValueError, match="already loaded"):
        load(text.replace("num_elements = 2", "num_elements = 3"), cache_dir=cache)
    with pytest.raises(ValueError, match="no \\[\\[symmetric_contraction\\]\\] table"):
        load('[[tensor_product]]\nname = "x"\n', cache_dir=cache)
