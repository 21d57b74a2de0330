"""eqdsl.integrations.mace.accelerate against the model it modifies (mace-torch 0.3.16, float64,
interpreted kernels): energy, forces, and the gradient of a force loss with respect to every
parameter, in training (forces with create_graph) and in inference; conv=False's energy. The
accelerated model's convs are conv_radial (the radial MLPs end in e3nn FullyConnectedNet's
bias-free last layer), so these compare conv_radial, with the last layer's matrix formed outside
the op, against e3nn's unfused product; the fallback to conv is checked on the block it is for.

The model is tiny on purpose (CI time is interpreted-kernel compile time, ~1-2 s a kernel): a
ScaleShiftMACE with hidden 4x0e+4x1o, max_ell 1, correlation 2, two
RealAgnosticResidualInteractionBlocks, two elements, on a 5-atom molecule. Its second block's
conv_tp has sorted output irreps (4x0e+4x0e+4x1o+4x1o, path order 0e 1o 1o 0e) with renumbered
instructions, as MACE builds them.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("mace", reason="mace-torch: pip install --no-deps mace-torch==0.3.16 (docs/models.md)")

from e3nn import o3  # noqa: E402

from mace_tiny import tiny_batch, tiny_mace  # noqa: E402
from eqdsl.integrations.mace import (  # noqa: E402
    MACEConvTP,
    MACERadialConvTP,
    RadialHidden,
    _radial_hidden_width,
    accelerate,
    packages,
    radial_blocks,
)
from eqdsl.torch import TensorProduct  # noqa: E402

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
def fast(model, tmp_path_factory):
    # the convs alone (the product blocks' replacement: tests/test_mace_products.py)
    return accelerate(copy.deepcopy(model), radial=True, products=False, cache_dir=tmp_path_factory.mktemp("cache"))


def _run(m, batch, training):
    b = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
    return m(b, training=training, compute_force=True)


def _rel(a, b) -> float:
    return float((a - b).abs().max().detach() / b.abs().max().detach())


def test_accelerate_replaces_each_conv_tp_through_the_fusion_hook(model, fast, batch):
    assert batch["edge_index"].shape[1] >= 12
    for orig, new in zip(model.interactions, fast.interactions):
        assert isinstance(orig.conv_tp, o3.TensorProduct) and not hasattr(orig, "conv_fusion")
        assert isinstance(new.conv_tp, MACEConvTP) and new.conv_fusion is True
        assert str(new.conv_tp.irreps_out) == str(orig.conv_tp.irreps_out)
    second = str(model.interactions[1].conv_tp.irreps_out)
    assert second == "4x0e+4x0e+4x1o+4x1o"  # MACE's sorted, unmerged output
    assert len(packages(fast)) == 2
    assert all(pkg.DTYPES == ("float64",) for pkg in packages(fast))
    # both blocks' radial MLPs ([bessel 4] -> 8 -> weight_numel, e3nn FullyConnectedNet) end in a
    # bias-free linear layer: both convs take the hidden features and the last layer's matrix
    assert radial_blocks(fast) == [True, True]
    for orig, new in zip(model.interactions, fast.interactions):
        assert type(new.conv_tp) is MACERadialConvTP and isinstance(new.conv_tp_weights, RadialHidden)
        assert new.conv_tp.radial_features == 8 and new.conv_tp._radial is new.conv_tp_weights
    assert all(pkg.RADIAL_FEATURES == 8 for pkg in packages(fast))
    # the conv references the block's MLP without registering it: a copy keeps them one object
    block = copy.deepcopy(fast).interactions[1]
    assert block.conv_tp._radial is block.conv_tp_weights
    # everything else is the same module objects' copies: same parameters, same names
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in model.named_parameters()]


def test_radial_hidden_times_matrix_is_the_mlp(model, fast):
    """The split the radial conv relies on: hidden features @ the last layer's matrix (its
    normalization included) is the original MLP's output, and the matrix is a function of the
    layer's own weight (what the force-loss gradient test then follows into the op)."""
    orig, new = model.interactions[0].conv_tp_weights, fast.interactions[0].conv_tp_weights
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(5))
    want = orig(x)
    got = new(x) @ new.matrix()
    assert new(x).shape == (7, 8) and _rel(got, want) <= 1e-14
    last = list(new.children())[-1]
    (g,) = torch.autograd.grad(new.matrix().sum(), last.weight)
    assert torch.allclose(g, torch.full_like(g, 1 / 8 ** 0.5), rtol=1e-14, atol=0)  # e3nn: 1/sqrt(fan_in)


def test_radial_falls_back_to_conv_without_a_bias_free_last_layer(model):
    """MACE's RadialMLP (RealAgnosticResidualNonLinearInteractionBlock) ends in a
    torch.nn.Linear with a bias: no conv_radial there. Checked on the block (no compile)."""
    from mace.modules.radial import RadialMLP

    block = copy.deepcopy(model.interactions[0])
    assert _radial_hidden_width(block) == 8
    block.conv_tp_weights = RadialMLP([4, 8, block.conv_tp.weight_numel])
    assert _radial_hidden_width(block) is None
    block = copy.deepcopy(model.interactions[0])
    list(block.conv_tp_weights.children())[-1].act = torch.tanh  # a last layer with an activation
    assert _radial_hidden_width(block) is None


def test_conv_tp_on_directed_edges_is_maces_gather_and_scatter(model, fast):
    """edge_index[0] is the sender. A molecule's edges come in both directions and MACE is
    invariant under inversion, under which swapping every edge's ends changes nothing: the
    model-level tests cannot see a swapped sender and receiver; this one can."""
    orig, new = model.interactions[1].conv_tp, fast.interactions[1].conv_tp
    g = torch.Generator().manual_seed(3)
    n, edge_index = 4, torch.tensor([[0, 0, 1, 3, 3], [1, 2, 2, 0, 2]])
    x = torch.randn(n, orig.irreps_in1.dim, generator=g)
    y = torch.randn(edge_index.shape[1], orig.irreps_in2.dim, generator=g)
    h = torch.randn(edge_index.shape[1], 8, generator=g)
    w = h @ fast.interactions[1].conv_tp_weights.matrix().detach()
    want = torch.zeros(n, orig.irreps_out.dim).index_add(0, edge_index[1], orig(x[edge_index[0]], y, w))
    assert _rel(new(x, y, h, edge_index), want) <= REL
    assert _rel(MACEConvTP.forward(new, x, y, w, edge_index), want) <= REL


def test_training_energy_forces_and_force_loss_gradients(model, fast, batch):
    results = []
    for m in (model, fast):
        out = _run(m, batch, training=True)
        loss = (out["forces"] ** 2).sum() + 0.5 * (out["energy"] ** 2).sum()
        params = [p for p in m.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        results.append((out["energy"].detach(), out["forces"].detach(), grads))
    (e0, f0, g0), (e1, f1, g1) = results
    assert _rel(e1, e0) <= REL
    assert _rel(f1, f0) <= REL and f0.abs().max() > 1e-3
    used = 0
    for a, b in zip(g1, g0):
        assert (a is None) == (b is None)
        if b is not None and b.abs().max() > 0:
            assert _rel(a, b) <= REL
            used += 1
    assert used >= len(g0) - 2  # the force loss reaches (nearly) every parameter


def test_inference_energy_and_forces(model, fast, batch):
    o0, o1 = _run(model, batch, training=False), _run(fast, batch, training=False)
    assert _rel(o1["energy"], o0["energy"]) <= REL
    assert _rel(o1["forces"], o0["forces"]) <= REL
    assert not o1["forces"].requires_grad


def test_conv_false_replaces_only_the_edge_product(model, batch, tmp_path_factory):
    per_edge = accelerate(copy.deepcopy(model), conv=False, products=False, cache_dir=tmp_path_factory.mktemp("cache_tp"))
    for block in per_edge.interactions:
        assert type(block.conv_tp) is TensorProduct and not hasattr(block, "conv_fusion")
    b0 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
    b1 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
    with torch.no_grad():
        e0 = model(b0, training=False, compute_force=False)["energy"]
        e1 = per_edge(b1, training=False, compute_force=False)["energy"]
    assert _rel(e1, e0) <= REL


def test_refusals(model):
    with pytest.raises(ValueError, match="no MACE interaction block"):
        accelerate(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="float32 or float64"):
        accelerate(copy.deepcopy(model), dtype=torch.float16)
    converted = copy.deepcopy(model)
    converted.interactions[0].conv_tp = torch.nn.Identity()
    with pytest.raises(TypeError, match="not an e3nn.o3.TensorProduct"):
        accelerate(converted)
