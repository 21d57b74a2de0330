"""NequIP 0.19 with its edge convolutions run by eqdsl (``eqdsl.integrations.nequip``).

A tiny NequIP model (two species, l_max 1, two interaction blocks) is built with random
weights by NequIP's own ``NequIPGNNModel``; a copy goes through ``accelerate``. On two
rattled water molecules, in float64 and training mode (forces kept differentiable), both
give the same energy, forces and gradient of a force loss with respect to every
parameter, to 1e-10 relative. In a two-block model the products' sorted outputs happen
to be in path order, so the middle block of a three-block model (every path kind, its
output irreps sorted and its instructions renumbered by NequIP) is checked on its own:
forward, against NequIP's module, on a random graph (not its gradients: a three-block
gradient run costs about twice this whole file's CPU time).

The radial MLPs (``ScalarMLPFunction``, ``bias=False``) end in a bias-free linear layer, so
``accelerate`` fuses it into the conv: these compare ``conv_radial`` (hidden features and the
last layer's matrix, formed outside the op) against NequIP's unfused product, and
``radial=False`` (``conv``) on the middle block.

``nequip.utils.global_state.set_global_state`` (required before any NequIP model is
built) changes process-wide state: the default dtype (float64), RNG seeds, e3nn's
optimization defaults, dynamo and TorchScript settings, torch's sharing strategy and
environment variables. Other test files may share this process (pytest-xdist), so the
module fixture puts every one of them back.
"""

from __future__ import annotations

import copy
import os
import random

import numpy as np
import pytest
import torch
from tolerances import REL_TOL

TOL = REL_TOL["float64"]  # the models in float64 (tests/tolerances.py)
TYPE_NAMES = ["H", "O"]
R_MAX = 3.0


@pytest.fixture(scope="module")
def nequip_state():
    import e3nn
    import torch._dynamo.config as dynamo_config

    env_keys = ("PYTORCH_JIT_USE_NNC_NOT_NVFUSER", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")
    saved = dict(
        dtype=torch.get_default_dtype(),
        e3nn_opt=e3nn.get_optimization_defaults(),
        dyn=(dynamo_config.capture_dynamic_output_shape_ops, dynamo_config.capture_scalar_outputs),
        sharing=torch.multiprocessing.get_sharing_strategy(),
        env={k: os.environ.get(k) for k in env_keys},
        rng=(random.getstate(), np.random.get_state(), torch.get_rng_state()),
        # set_fusion_strategy returns the strategy it replaces: the only way to read it
        fusion=torch.jit.set_fusion_strategy([("DYNAMIC", 10)]),
    )
    torch.jit.set_fusion_strategy(saved["fusion"])
    from nequip.utils.global_state import set_global_state

    set_global_state()
    try:
        yield
    finally:
        torch.set_default_dtype(saved["dtype"])
        e3nn.set_optimization_defaults(**saved["e3nn_opt"])
        dynamo_config.capture_dynamic_output_shape_ops, dynamo_config.capture_scalar_outputs = saved["dyn"]
        torch.multiprocessing.set_sharing_strategy(saved["sharing"])
        for k, v in saved["env"].items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        random.setstate(saved["rng"][0])
        np.random.set_state(saved["rng"][1])
        torch.set_rng_state(saved["rng"][2])
        torch.jit.set_fusion_strategy(saved["fusion"])


def _build(num_layers: int = 2):
    from nequip.model import NequIPGNNModel

    # parity=True (default) and l_max=1: features 0e, 0o, 1o, 1e; with three layers the middle
    # block maps every one of them through every path of 0e+1o edge harmonics
    return NequIPGNNModel(
        seed=1, model_dtype="float64", type_names=TYPE_NAMES, r_max=R_MAX, num_layers=num_layers, l_max=1,
        num_features=[3, 2], radial_mlp_depth=1, radial_mlp_width=4, num_bessels=4, avg_num_neighbors=3.0,
        per_type_energy_scales=1.0, per_type_energy_shifts=0.0,
    )


def _data():
    import ase.build
    from nequip.data import AtomicDataDict, compute_neighborlist_, from_ase

    atoms = ase.build.molecule("H2O")
    other = ase.build.molecule("H2O")
    other.positions += (1.9, 0.6, 0.4)
    atoms += other
    atoms.rattle(0.05, seed=3)
    data = compute_neighborlist_(from_ase(atoms), r_max=R_MAX)
    data[AtomicDataDict.ATOM_TYPE_KEY] = torch.tensor([TYPE_NAMES.index(s) for s in atoms.get_chemical_symbols()])
    return data


def _run(model):
    """Energy, forces and the gradient of a force loss (a gradient of a gradient)."""
    from nequip.data import AtomicDataDict

    model.train()  # NequIP keeps the force graph (create_graph) only in training mode
    model.zero_grad()
    out = model(_data())
    energy, forces = out[AtomicDataDict.TOTAL_ENERGY_KEY], out[AtomicDataDict.FORCE_KEY]
    f_ref = torch.linspace(-1.0, 1.0, forces.numel(), dtype=forces.dtype).reshape(forces.shape)
    loss = ((forces - f_ref) ** 2).mean() + energy.square().sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return energy.detach(), forces.detach(), grads


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_energy_forces_and_force_loss_gradient_match_nequip(nequip_state):
    from eqdsl.integrations.nequip import EqdslRadialTensorProductScatter, RadialHiddenMLP, accelerate

    model = _build()
    fast = accelerate(copy.deepcopy(model), radial=True)
    swapped = [m for m in fast.modules() if isinstance(m, EqdslRadialTensorProductScatter)]
    assert len(swapped) == 2  # one per interaction block, each through conv_radial
    assert all(isinstance(m._radial, RadialHiddenMLP) and "radial_features = 4" in m.eqdsl_spec for m in swapped)
    assert fast.state_dict().keys() == model.state_dict().keys()
    # the scatter references the block's MLP without registering it: a copy keeps them one object
    block = copy.deepcopy(fast).model.func.layer0_convnet.conv
    assert block.tp_scatter._radial is block.edge_mlp

    e0, f0, g0 = _run(model)
    e1, f1, g1 = _run(fast)
    assert _rel(e1, e0) <= TOL and _rel(f1, f0) <= TOL
    assert f0.abs().max() > 1e-3
    assert g1.keys() == g0.keys()
    # the radial MLPs feed only the edge products: their gradients pass through the
    # generated double-backward kernels of every block
    assert sum("edge_mlp" in n for n in g0) >= 2
    for n in g0:
        assert g0[n].abs().max() > 0, n
        assert _rel(g1[n], g0[n]) <= TOL, n


def test_sorted_middle_block_matches_nequip(nequip_state):
    from nequip.nn._tp_scatter_base import TensorProductScatter

    from eqdsl.integrations.nequip import EqdslRadialTensorProductScatter, EqdslTensorProductScatter, accelerate

    model = _build(num_layers=3)
    block = model.model.func.layer1_convnet.conv
    old, old_mlp = block.tp_scatter, block.edge_mlp
    i_out = [ins[2] for ins in old.instructions]  # NequIP keeps (i_in1, i_in2, i_out, mode, train) tuples
    assert i_out != sorted(i_out)  # renumbered by the sort: not in path order
    plain = accelerate(copy.deepcopy(model), radial=False).model.func.layer1_convnet.conv.tp_scatter
    accelerate(model, radial=True)
    new = block.tp_scatter
    assert type(old) is TensorProductScatter and type(new) is EqdslRadialTensorProductScatter and new.tp is old.tp
    assert type(plain) is EqdslTensorProductScatter

    gen = torch.Generator().manual_seed(0)
    n_nodes, n_edges = 5, 14
    x = torch.randn(n_nodes, old.tp.irreps_in1.dim, generator=gen, dtype=torch.float64)
    edge_attr = torch.randn(n_edges, old.tp.irreps_in2.dim, generator=gen, dtype=torch.float64)
    embedding = torch.randn(n_edges, 4, generator=gen, dtype=torch.float64)  # num_bessels
    hidden = block.edge_mlp(embedding)
    weight = old_mlp(embedding)  # the original MLP: hidden @ the last layer's matrix
    assert hidden.shape == (n_edges, 4) and _rel(hidden @ new._radial.matrix(), weight) <= 1e-14
    dst, src = torch.randint(0, n_nodes, (2, n_edges), generator=gen)
    want = old(x, edge_attr, weight, dst, src)
    got = new(x, edge_attr, hidden, dst, src)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert _rel(got, want) <= TOL
    assert _rel(plain(x, edge_attr, weight, dst, src), want) <= TOL


def test_radial_falls_back_to_conv_without_a_bias_free_last_layer(nequip_state):
    """A radial MLP with a bias, or one without nonlinearity (NequIP multiplies its layers into
    one matrix, DeepLinearMLP): no conv_radial. Checked on the block (no compile)."""
    from nequip.nn.mlp import ScalarMLPFunction

    from eqdsl.integrations.nequip import _radial_hidden_width

    block = copy.deepcopy(_build().model.func.layer0_convnet.conv)
    assert _radial_hidden_width(block) == 4
    numel = block.tp_scatter.tp.weight_numel
    for kw in (dict(bias=True), dict(nonlinearity=None)):
        block.edge_mlp = ScalarMLPFunction(input_dim=4, output_dim=numel, hidden_layers_depth=1,
                                           hidden_layers_width=4, **kw)
        assert _radial_hidden_width(block) is None, kw


def test_modify_handles_enable_eqdsl_and_passes_the_rest_to_nequip(nequip_state):
    from eqdsl.integrations.nequip import EqdslTensorProductScatter, accelerate, modify

    model = modify(_build(), [{"modifier": "enable_eqdsl"}])
    assert sum(isinstance(m, EqdslTensorProductScatter) for m in model.modules()) == 2
    with pytest.raises(RuntimeError, match="not a registered model modifier"):
        modify(model, [{"modifier": "no_such_modifier"}])
    with pytest.raises(TypeError, match="takes no arguments"):
        modify(model, [{"modifier": "enable_eqdsl", "conv": False}])
    with pytest.raises(ValueError, match="no nequip TensorProductScatter"):
        accelerate(torch.nn.Linear(2, 2))
