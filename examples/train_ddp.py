"""Data-parallel force training of the main job's interaction layer with torch DDP.

The layer of ``examples/main.py`` (a generated fused convolution ``out[dst] += TP(x[src],
Y(r_ij), w(|r_ij|))`` with e3nn spherical harmonics, a Bessel radial basis with a smooth
cutoff and, here, a learned radial MLP for the per-edge weights, a learned species
embedding for the node features, an invariant energy from the scalar channels, forces
``F = -dE/dpositions`` by autograd), wrapped in ``torch.nn.parallel.
DistributedDataParallel`` and trained for a few optimizer steps on a force loss. The data:
real molecules from ASE's g2 collection, rattled, labelled with ASE's EMT forces; the
molecules are split across the ranks (rank ``r`` takes every ``world``-th one) and each
rank batches its own into one disjoint graph.

The force loss is ``L = sum over all atoms of |F - F_ref|^2 / (3 * atoms)``; each rank
computes its share scaled by the world size, so DDP's average of the ranks' gradients
is exactly ``dL/dparameters`` over all molecules. ``--check`` shows it: after the first
backward, rank 0 recomputes the gradients in one process over all molecules (no DDP)
and compares (``--check-tol``, default 1e-10 relative in float64).

Double backward under DDP (as MACE trains): the forces are computed inside ``forward``
with ``torch.autograd.grad(E, positions, create_graph=True)``. That inner gradient asks
for the positions only, so autograd never runs the parameters' gradient accumulators
there and DDP's reducer hooks do not fire; they fire once per parameter in the
``loss.backward()`` that goes through the forces' graph, where DDP all-reduces in
buckets as usual. Every parameter receives a gradient from the force loss, so the
default ``find_unused_parameters=False`` holds.

Usage::

    torchrun --nproc_per_node=N examples/train_ddp.py [--spec SPEC] [--steps 3] [--check]
    torchrun --nproc_per_node=2 examples/train_ddp.py --backend gloo --check   # CPU, interpreted kernels

GPU runs use NCCL, one GPU per process (``LOCAL_RANK``); the CPU run uses gloo and runs
the Helion kernels in Triton's interpreter (slow: tiny sizes). Multi-node use:
``docs/multi-gpu.md``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from main import N_BASIS, _layout_index, _radial, _scalar_columns  # noqa: E402  (the main job's layer)

# g2 molecules of elements ASE's EMT calculator has parameters for (H, C, N, O)
MOLECULES = ("H2O", "NH3", "CH4", "CH3OH", "C2H4", "HCOOH", "CH3CH2OH", "C6H6")


def dataset(names, cutoff: float, seed: int = 0):
    """``[(numbers, positions, src, dst, forces), ...]``: each g2 molecule of ``names``,
    rattled (0.05 Å, a seed per molecule), its radius graph (ASE ``neighbor_list``, src =
    i, dst = j) and its EMT forces (eV/Å), as numpy arrays."""
    from ase.calculators.emt import EMT
    from ase.collections import g2
    from ase.neighborlist import neighbor_list

    out = []
    for k, name in enumerate(names):
        atoms = g2[name].copy()
        atoms.rattle(stdev=0.05, seed=seed + k)
        atoms.calc = EMT()
        i, j = neighbor_list("ij", atoms, cutoff)
        out.append((atoms.get_atomic_numbers(), atoms.get_positions(), i.astype(np.int64), j.astype(np.int64),
                    atoms.get_forces()))
    return out


def batch(graphs, species: dict, dtype, device):
    """One disjoint graph of ``graphs``: species indices, positions, src, dst (offset per
    graph), reference forces, as tensors on ``device``."""
    import torch

    z, pos, src, dst, forces, offset = [], [], [], [], [], 0
    for numbers, p, i, j, f in graphs:
        z.append([species[int(n)] for n in numbers])
        pos.append(p)
        src.append(i + offset)
        dst.append(j + offset)
        forces.append(f)
        offset += len(numbers)
    t = lambda a, dt: torch.as_tensor(np.concatenate(a), dtype=dt, device=device)  # noqa: E731
    return {"species": t(z, torch.long), "pos": t(pos, dtype), "src": t(src, torch.long), "dst": t(dst, torch.long),
            "forces": t(forces, dtype)}


def build_model(meta, conv, n_species: int, cutoff: float, dtype, device, hidden: int = 16, seed: int = 0):
    """The interaction layer as an ``nn.Module`` with fixed initial parameters (``seed``)."""
    import torch

    class InteractionLayer(torch.nn.Module):
        """Energy and forces of a batch (``batch``'s dict); parameters: species embedding
        ``(n_species, DIM_IN1)`` in the spec's layout, radial MLP ``N_BASIS -> hidden ->
        WEIGHT_NUMEL``, readout of the output's scalar channels."""

        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.randn(n_species, meta.DIM_IN1))
            self.radial = torch.nn.Sequential(
                torch.nn.Linear(N_BASIS, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, meta.WEIGHT_NUMEL))
            cols = _scalar_columns(meta.IRREPS_OUT, meta.LAYOUT)
            # constant column indices: plain attributes, not buffers (DDP would broadcast them)
            self.cols = torch.as_tensor(cols, device=device)
            self.sh_index = torch.as_tensor(_layout_index(meta.IRREPS_IN2, meta.LAYOUT), device=device)
            self.readout = torch.nn.Parameter(torch.randn(len(cols)) / max(len(cols), 1) ** 0.5)

        def forward(self, b):
            from e3nn import o3

            pos = b["pos"].detach().requires_grad_(True)
            src, dst = b["src"], b["dst"]
            vec = pos[dst] - pos[src]
            edge_attr = o3.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True,
                                               normalization="component")[:, self.sh_index]
            w = self.radial(_radial(torch.linalg.norm(vec, dim=1), cutoff, torch))
            h = self.embedding[b["species"]]
            out = conv(h, edge_attr, w, src, dst, pos.shape[0])
            energy = (out[:, self.cols] @ self.readout).sum()
            # inside forward, as MACE and NequIP do: DDP's reducer sees only the loss's backward
            (grad,) = torch.autograd.grad(energy, pos, create_graph=self.training)
            return energy, -grad

    torch.manual_seed(seed)
    return InteractionLayer().to(device=device, dtype=dtype)


def force_loss(model, b, total_atoms: int, scale: float = 1.0):
    """``scale * sum |F - F_ref|^2 / (3 * total_atoms)`` over ``b``'s atoms."""
    _, forces = model(b)
    return scale * ((forces - b["forces"]) ** 2).sum() / (3 * total_atoms)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples/specs/nequip_water.toml"),
                    help="a spec with conv = true; its first such product is trained")
    ap.add_argument("--out", default=str(ROOT / "build/kernels_ddp"), help="where to generate the package")
    ap.add_argument("--no-generate", action="store_true",
                    help="use the package already in --out (e.g. generated once on a shared filesystem)")
    ap.add_argument("--backend", default=None, help="nccl (default with CUDA) or gloo (CPU)")
    ap.add_argument("--molecules", default=",".join(MOLECULES), help="comma-separated g2 names (H, C, N, O only)")
    ap.add_argument("--cutoff", type=float, default=4.0, help="radius-graph cutoff in Å")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--check", action="store_true",
                    help="after the first backward, compare the all-reduced gradients with one process over all molecules")
    ap.add_argument("--check-tol", type=float, default=1e-10, help="largest relative gradient difference accepted")
    ap.add_argument("--save", default=None,
                    help="directory: each rank writes rank<r>.pt (its all-reduced first gradients, initial and final "
                         "parameters; rank 0 with --check also the one-process gradients)")
    args = ap.parse_args(argv)

    if "RANK" not in os.environ:  # started without torchrun: one process
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    backend = args.backend
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    cuda = backend != "gloo"
    if not cuda:  # read when the Helion kernel objects are created, at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")

    import torch
    import torch.distributed as dist

    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 runs: no TF32 in the MLP
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, device_id=device if cuda else None)
    try:
        return _train(args, rank, world, local_rank, device)
    finally:
        dist.destroy_process_group()


def _train(args, rank: int, world: int, local_rank: int, device) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from eqdsl.spec import load_spec

    if local_rank == 0 and not args.no_generate:  # one writer per node
        subprocess.run([sys.executable, "-m", "eqdsl", "generate", args.spec, "-o", args.out], check=True)
    dist.barrier()
    spec = next(s for s in load_spec(args.spec) if s.conv)
    sys.path.insert(0, str(Path(args.out).resolve().parent))
    pkg = f"{Path(args.out).name}.{spec.name}"
    meta = importlib.import_module(pkg)
    conv = importlib.import_module(pkg + ".torch_ops").conv

    dtype = getattr(torch, args.dtype)
    graphs = dataset(args.molecules.split(","), args.cutoff)
    if len(graphs) < world:
        raise SystemExit(f"error: {len(graphs)} molecules for {world} ranks: every rank needs one")
    species = {z: k for k, z in enumerate(sorted({int(n) for g in graphs for n in g[0]}))}
    total_atoms = sum(len(g[0]) for g in graphs)
    mine = graphs[rank::world]
    local = batch(mine, species, dtype, device)

    model = build_model(meta, conv, len(species), args.cutoff, dtype, device)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{spec.name}: {world} ranks ({dist.get_backend()}), {len(graphs)} molecules, {total_atoms} atoms; "
              f"rank 0: {len(mine)} molecules, {len(local['species'])} atoms, {len(local['src'])} edges; {args.dtype}")
    status, saved = 0, {}
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        # this rank's share, scaled so that DDP's average over ranks is the loss over all atoms
        loss = force_loss(ddp, local, total_atoms, scale=world)
        loss.backward()
        if step == 0:
            saved["grads"] = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
            if args.check and rank == 0:
                status = _check(args, meta, conv, species, graphs, total_atoms, initial, saved, device, dtype)
        opt.step()
        total = loss.detach() / world
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}: force loss {total.item():.6e} ({(time.perf_counter() - t0) * 1e3:.0f} ms)")
    saved["initial"] = {n: v.cpu() for n, v in initial.items()}
    saved["params"] = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        torch.save(saved, Path(args.save) / f"rank{rank}.pt")
    return status


def _check(args, meta, conv, species, graphs, total_atoms, initial, saved, device, dtype) -> int:
    """One process, no DDP, all molecules in one batch, the initial parameters: its
    gradients against the all-reduced ones (max |difference| / max |one-process| per
    parameter)."""
    single = build_model(meta, conv, len(species), args.cutoff, dtype, device)
    single.load_state_dict(initial)
    force_loss(single, batch(graphs, species, dtype, device), total_atoms).backward()
    saved["single"] = {n: p.grad.detach().cpu().clone() for n, p in single.named_parameters()}
    worst = 0.0
    for name, want in saved["single"].items():
        got = saved["grads"][name]
        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-300)))
    ok = worst <= args.check_tol
    print(f"gradient check: all-reduced vs one process over all {len(graphs)} molecules: "
          f"max relative difference {worst:.1e} ({'ok' if ok else 'FAILED'}, tolerance {args.check_tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
