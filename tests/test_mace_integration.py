"""eqdsl.integrations.mace.accelerate against the model it modifies (mace-torch 0.3.16, float64,
interpreted kernels): energy, forces, and the gradient of a force loss with respect to every
parameter, in training (forces with create_graph) and in inference; conv=False's energy.

The model is tiny on purpose (CI time is interpreted-kernel compile time, ~1-2 s a kernel): a
ScaleShiftMACE with hidden 4x0e+4x1o, max_ell 1, correlation 2, two
RealAgnosticResidualInteractionBlocks, two elements, on a 5-atom molecule. Its second block's
conv_tp has sorted output irreps (4x0e+4x0e+4x1o+4x1o, path order 0e 1o 1o 0e) with renumbered
instructions, as MACE builds them.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("mace", reason="mace-torch: pip install --no-deps mace-torch==0.3.16 (docs/models.md)")

from e3nn import o3  # noqa: E402
from mace import data, modules  # noqa: E402
from mace.tools import torch_geometric, utils  # noqa: E402

from eqdsl.integrations.mace import MACEConvTP, accelerate, packages  # noqa: E402
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
    torch.manual_seed(0)
    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    m = modules.ScaleShiftMACE(
        r_max=3.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=1, interaction_cls=block,
        interaction_cls_first=block, num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("4x0e+4x1o"),
        MLP_irreps=o3.Irreps("4x0e"), atomic_energies=np.array([-1.0, -2.0]), avg_num_neighbors=3.0,
        atomic_numbers=[1, 8], correlation=2, gate=torch.nn.functional.silu, radial_MLP=[8],
        atomic_inter_scale=1.3, atomic_inter_shift=0.1,
    )
    # random weights everywhere: no parameter left at a special value (zeros, identity) that could
    # hide a wrong path
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def batch():
    from ase import Atoms

    rng = np.random.default_rng(0)
    atoms = Atoms("OH2OH", positions=rng.normal(size=(5, 3)) * 1.1)
    z_table = utils.AtomicNumberTable([1, 8])
    item = data.AtomicData.from_config(data.config_from_atoms(atoms), z_table=z_table, cutoff=3.0)
    b = next(iter(torch_geometric.dataloader.DataLoader(dataset=[item], batch_size=1, shuffle=False)))
    return b.to_dict()


@pytest.fixture(scope="module")
def fast(model, tmp_path_factory):
    return accelerate(copy.deepcopy(model), cache_dir=tmp_path_factory.mktemp("cache"))


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
    # everything else is the same module objects' copies: same parameters, same names
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in model.named_parameters()]


def test_conv_tp_on_directed_edges_is_maces_gather_and_scatter(model, fast):
    """edge_index[0] is the sender. A molecule's edges come in both directions and MACE is
    invariant under inversion, under which swapping every edge's ends changes nothing: the
    model-level tests cannot see a swapped sender and receiver; this one can."""
    orig, new = model.interactions[1].conv_tp, fast.interactions[1].conv_tp
    g = torch.Generator().manual_seed(3)
    n, edge_index = 4, torch.tensor([[0, 0, 1, 3, 3], [1, 2, 2, 0, 2]])
    x = torch.randn(n, orig.irreps_in1.dim, generator=g)
    y = torch.randn(edge_index.shape[1], orig.irreps_in2.dim, generator=g)
    w = torch.randn(edge_index.shape[1], orig.weight_numel, generator=g)
    want = torch.zeros(n, orig.irreps_out.dim).index_add(0, edge_index[1], orig(x[edge_index[0]], y, w))
    assert _rel(new(x, y, w, edge_index), want) <= REL


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
    per_edge = accelerate(copy.deepcopy(model), conv=False, cache_dir=tmp_path_factory.mktemp("cache_tp"))
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
