"""The tiny mace-torch 0.3.16 model and molecule the MACE tests share (float64 by default dtype).

``ScaleShiftMACE``: hidden ``4x0e+4x1o``, max_ell 1, correlation 2, two
``RealAgnosticResidualInteractionBlock``s, two elements (H, O), radial MLP [8], every parameter
moved off mace's initial values (no zero or identity left that could hide a wrong path); a
5-atom molecule at cutoff 3 Å. Tiny on purpose: CI time is interpreted-kernel compile time.
"""

from __future__ import annotations

import numpy as np
import torch


def tiny_mace():
    """A fresh model, in the current default dtype (seeded: the same one every call)."""
    from e3nn import o3
    from mace import modules

    torch.manual_seed(0)
    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    m = modules.ScaleShiftMACE(
        r_max=3.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=1, interaction_cls=block,
        interaction_cls_first=block, num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("4x0e+4x1o"),
        MLP_irreps=o3.Irreps("4x0e"), atomic_energies=np.array([-1.0, -2.0]), avg_num_neighbors=3.0,
        atomic_numbers=[1, 8], correlation=2, gate=torch.nn.functional.silu, radial_MLP=[8],
        atomic_inter_scale=1.3, atomic_inter_shift=0.1,
    )
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def tiny_batch() -> dict:
    """mace's batch dict of the 5-atom molecule ``OH2OH`` (positions seeded)."""
    from ase import Atoms
    from mace import data
    from mace.tools import torch_geometric, utils

    rng = np.random.default_rng(0)
    atoms = Atoms("OH2OH", positions=rng.normal(size=(5, 3)) * 1.1)
    item = data.AtomicData.from_config(data.config_from_atoms(atoms), z_table=utils.AtomicNumberTable([1, 8]),
                                       cutoff=3.0)
    return next(iter(torch_geometric.dataloader.DataLoader(dataset=[item], batch_size=1, shuffle=False))).to_dict()
