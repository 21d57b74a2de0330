#!/usr/bin/env python3
"""MACE end to end: one model, three implementations of its edge tensor product, same inputs.

The model is a mace-torch ``ScaleShiftMACE`` of MACE-MP "medium" size with random weights
(hidden ``128x0e+128x1o+128x2e``, max_ell 3, correlation 3, 2
``RealAgnosticResidualInteractionBlock`` interactions, radial MLP [64, 64, 64], 8 Bessel
functions, r_max 5 A, one element: Si). Implementations:

  e3nn    the model as mace-torch builds it (e3nn ``TensorProduct`` + ``scatter_sum``)
  cueq    mace-torch's own cuEquivariance conversion (``mace.cli.convert_e3nn_cueq.run``:
          ``ir_mul`` layout, every op through cuEquivariance, fused conv on CUDA)
  eqdsl   ``eqdsl.integrations.mace.accelerate(model, products=False)``: each interaction's
          ``conv_tp`` replaced through MACE's ``conv_fusion`` hook by a generated fused convolution
  eqdsl_products
          ``accelerate(model)``: the convs, and each product block's symmetric contraction
          replaced by the generated one (``eqdsl.symmetric``)

Inputs (ase, rattled diamond Si, periodic, r_max 5 A):

  train   a batch of ``--cells`` 512-atom cells (default 7: 3,584 atoms, ~100,000 edges)
  md      one 64-atom cell (2x2x2 cubic cells)

Measured, per implementation and dtype, CUDA events, median over ``--reps`` after warm-up:

  train_ms   a training step: forward (energy), forces by autograd with ``create_graph``,
             a loss on energy and forces, ``loss.backward()`` (parameter gradients)
  md_ms      an MD step on the 64-atom box: energy and forces (no ``create_graph``)
  fwd_ms     the forward alone on the training batch (energy, no forces)
  conv_tp_ms, products_ms
             inside that forward, CUDA events around each interaction's ``conv_tp`` (the
             edge tensor product; for eqdsl the fused conv including its scatter) and each
             product block's ``symmetric_contractions``, summed over layers; the rest is
             ``fwd_ms`` minus both

Before timing, energy and forces of ``cueq`` and ``eqdsl`` are compared with ``e3nn`` on the
training batch (relative Frobenius error, printed; the JSON keeps them).

eqdsl's kernels are compiled before anything is timed, in parallel: the generated packages
``accelerate`` loaded go to ``benchmarks/precompile.py --generated`` (every op, so the
second-order kernels a training step calls are ready).

    python3 benchmarks/bench_mace.py [--dtypes float32,float64] [--impls e3nn,cueq,eqdsl]
                                     [--cells 7] [--reps 10] [--json PATH] [--quick]

``--quick`` (CPU smoke run: tiny model, one small cell, interpreted kernels) checks the
script end to end without a GPU. Output: progress lines and a table printed last; JSON at
``--json`` (default ``$OUT/bench_mace.json``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("e3nn", "cueq", "eqdsl", "eqdsl_products")


def build_model(dtype: torch.dtype, hidden: str, max_ell: int, correlation: int, radial_mlp, seed: int = 0):
    """A ScaleShiftMACE with random weights, built by mace-torch's own constructor."""
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        model = modules.ScaleShiftMACE(
            r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=max_ell,
            interaction_cls=block, interaction_cls_first=block, num_interactions=2, num_elements=1,
            hidden_irreps=o3.Irreps(hidden), MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.zeros(1),
            avg_num_neighbors=28.0, atomic_numbers=[14], correlation=correlation,
            gate=torch.nn.functional.silu, radial_MLP=list(radial_mlp),
            atomic_inter_scale=1.0, atomic_inter_shift=0.0,
            # mace's U_matrix_real in the e3nn basis, what eqdsl generates (mace-torch 0.3.16 defaults to
            # cuEquivariance's reduced basis where cuequivariance imports; the cueq row converts this model)
            use_reduced_cg=False,
        )
    finally:
        torch.set_default_dtype(prev)
    return model


def si_cells(reps: tuple[int, int, int], count: int, seed: int):
    from ase.build import bulk

    out = []
    for k in range(count):
        atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(reps)
        atoms.rattle(stdev=0.05, seed=seed + k)
        out.append(atoms)
    return out


def make_batch(atoms_list, dtype: torch.dtype, device):
    """mace-torch's own data path: Configuration -> AtomicData -> its torch_geometric Batch, as a dict."""
    from mace import data
    from mace.tools import torch_geometric, utils

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        z_table = utils.AtomicNumberTable([14])
        items = [data.AtomicData.from_config(data.config_from_atoms(a), z_table=z_table, cutoff=5.0)
                 for a in atoms_list]
        loader = torch_geometric.dataloader.DataLoader(dataset=items, batch_size=len(items), shuffle=False)
        batch = next(iter(loader)).to(device)
    finally:
        torch.set_default_dtype(prev)
    return batch.to_dict()


def cueq_model(model, device):
    from mace.cli.convert_e3nn_cueq import run

    prev = torch.get_default_dtype()
    try:
        return run(copy.deepcopy(model).to("cpu"), device=device.type, return_model=True).to(device)
    finally:
        torch.set_default_dtype(prev)


def eqdsl_model(model, device, products: bool = False):
    """``eqdsl``: the convs only; ``eqdsl_products``: the convs and the product blocks' symmetric
    contractions (``accelerate(products=True)``)."""
    from eqdsl.integrations.mace import accelerate

    return accelerate(copy.deepcopy(model), products=products).to(device)


def build(name: str, base, device, dtype: str, workers: int, on_gpu: bool, log):
    """The model of implementation ``name`` on ``device``; eqdsl's kernels compiled first (GPU)."""
    if name == "e3nn":
        return copy.deepcopy(base).to(device)
    if name == "cueq":
        return cueq_model(base, device)
    if name in ("eqdsl", "eqdsl_products"):
        m = eqdsl_model(base, device, products=name == "eqdsl_products")
        pkgs = loaded_packages(m)
        log(f"eqdsl packages: {[str(x) for x in pkgs]}")
        if on_gpu and pkgs:
            precompile(pkgs, [dtype], workers, log)
        return m
    raise ValueError(f"unknown implementation {name!r}; expected one of {', '.join(IMPLS)}")


def loaded_packages(model) -> list[Path]:
    """Directories of the generated packages the accelerated model calls (for precompile)."""
    from eqdsl.integrations.mace import packages

    return sorted(Path(pkg.__file__).parent for pkg in packages(model))


def precompile(packages: list[Path], dtypes: list[str], workers: int, log) -> None:
    """Compile every op of every package, in parallel (benchmarks/precompile.py)."""
    procs = []
    per = max(1, workers // max(1, len(packages)))
    for pkg in packages:
        argv = [sys.executable, str(ROOT / "benchmarks" / "precompile.py"), "--generated", str(pkg.parent),
                "--problems", pkg.name, "--dtypes", ",".join(dtypes), "--workers", str(per)]
        procs.append((pkg.name, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for name, p in procs:
        out, _ = p.communicate()
        log(f"precompile {name}: exit {p.returncode}\n" + "\n".join("    " + ln for ln in out.strip().splitlines()[-8:]))


def _events_median(fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _wall_median(fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class ModuleTimer:
    """CUDA events around the forward of selected submodules (summed per group)."""

    def __init__(self, groups: dict[str, list[torch.nn.Module]]):
        self.pairs: dict[str, list] = {g: [] for g in groups}
        self.handles = []
        for g, mods in groups.items():
            for m in mods:
                self.handles.append(m.register_forward_pre_hook(self._pre(g)))
                self.handles.append(m.register_forward_hook(self._post(g)))

    def _pre(self, g):
        def hook(mod, args):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs[g].append([e, None])
        return hook

    def _post(self, g):
        def hook(mod, args, out):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs[g][-1][1] = e
        return hook

    def reset(self):
        for g in self.pairs:
            self.pairs[g] = []

    def totals(self) -> dict[str, float]:
        torch.cuda.synchronize()
        return {g: sum(a.elapsed_time(b) for a, b in ps) for g, ps in self.pairs.items()}

    def close(self):
        for h in self.handles:
            h.remove()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def train_step(model, batch) -> None:
    """One training step: energy, forces with ``create_graph``, a loss on both (reference forces
    zero), ``loss.backward()``; the parameter gradients are dropped after."""
    out = model(batch, training=True, compute_force=True)
    loss = (out["energy"] ** 2).mean() + (out["forces"] ** 2).mean()
    loss.backward()
    for p in model.parameters():
        p.grad = None


def measure(name: str, model, train_batch, md_batch, reps: int, warmup: int, on_gpu: bool) -> dict:
    def train():
        train_step(model, train_batch)

    def md_step():
        out = model(md_batch, training=False, compute_force=True)
        out["forces"].sum().item() if not on_gpu else None

    def fwd():
        with torch.no_grad():
            model(train_batch, training=False, compute_force=False)

    timer_fn = _events_median if on_gpu else _wall_median
    row = {"impl": name}
    row["train_ms"] = timer_fn(train, reps, warmup)
    row["md_ms"] = timer_fn(md_step, reps, warmup)
    row["fwd_ms"] = timer_fn(fwd, reps, warmup)
    if on_gpu:
        groups = {
            "conv_tp": [blk.conv_tp for blk in model.interactions],
            "products": [p.symmetric_contractions for p in model.products],
        }
        timer = ModuleTimer(groups)
        shares = []
        for _ in range(reps):
            timer.reset()
            fwd()
            shares.append(timer.totals())
        timer.close()
        row["conv_tp_ms"] = statistics.median(s["conv_tp"] for s in shares)
        row["products_ms"] = statistics.median(s["products"] for s in shares)
        row["rest_ms"] = row["fwd_ms"] - row["conv_tp_ms"] - row["products_ms"]
    return row


def profile_train(name: str, model, train_batch, top: int, log) -> list[dict]:
    """The training step's CUDA kernels under ``torch.profiler``: the ``top`` largest by total
    device time over 3 steps (after one warm-up step), as rows ``{kernel, calls, ms_per_step}``."""
    from torch.profiler import ProfilerActivity, profile

    train_step(model, train_batch)
    torch.cuda.synchronize()
    steps = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train_step(model, train_batch)
        torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = totals.setdefault(ev.name, [0.0, 0])
        t[0] += ev.time_range.elapsed_us() / 1e3
        t[1] += 1
    rows = sorted(({"kernel": k, "calls": c // steps, "ms_per_step": ms / steps} for k, (ms, c) in totals.items()),
                  key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    log(f"[profile {name}] CUDA kernel time per training step {total:.2f} ms; top {top}:")
    for r in rows[:top]:
        log(f"    {r['ms_per_step']:8.3f} ms  {r['calls']:4d}x  {r['kernel'][:110]}")
    return rows[:top]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--cells", type=int, default=7, help="512-atom Si cells in the training batch")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny model and graphs")
    p.add_argument("--profile", type=int, default=0, metavar="TOP",
                   help="also profile the training step (GPU): the TOP largest CUDA kernels")
    args = p.parse_args()

    def log(msg: str):
        print(msg, flush=True)

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    if args.quick:
        hidden, max_ell, corr, radial = "4x0e+4x1o", 2, 2, (8,)
        train_atoms, md_atoms = si_cells((1, 1, 1), 1, 0), si_cells((1, 1, 1), 1, 100)
        args.reps, args.warmup = 1, 0
    else:
        hidden, max_ell, corr, radial = "128x0e+128x1o+128x2e", 3, 3, (64, 64, 64)
        train_atoms, md_atoms = si_cells((4, 4, 4), args.cells, 0), si_cells((2, 2, 2), 1, 100)
    impls = [s for s in args.impls.split(",") if s]
    dtypes = [s for s in args.dtypes.split(",") if s]
    result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name() if on_gpu else "cpu",
                       "torch": torch.__version__, "hidden": hidden, "max_ell": max_ell, "correlation": corr,
                       "radial_mlp": list(radial)},
              "rows": [], "errors": []}
    try:
        import mace
        result["meta"]["mace"] = getattr(mace, "__version__", "?")
    except ImportError as e:
        log(f"mace-torch is not installed: {e}")
        return 1
    for dt in dtypes:
        dtype = getattr(torch, dt)
        base = build_model(dtype, hidden, max_ell, corr, radial)
        train_batch = make_batch(train_atoms, dtype, device)
        md_batch = make_batch(md_atoms, dtype, device)
        n_edges = int(train_batch["edge_index"].shape[1])
        log(f"[{dt}] train batch: {train_batch['positions'].shape[0]} atoms, {n_edges} edges; "
            f"md: {md_batch['positions'].shape[0]} atoms, {int(md_batch['edge_index'].shape[1])} edges")
        result["meta"][f"edges_{dt}"] = n_edges
        # one model at a time, freed before the next: three float64 models and their
        # training graphs at 100,000 edges do not fit one 80 GB card together
        ref = None
        for name in sorted(impls, key=lambda n: n != "e3nn"):  # e3nn first: the reference
            t0 = time.perf_counter()
            try:
                model = build(name, base, device, dt, args.workers, on_gpu, log)
                log(f"[{dt}] built {name} in {time.perf_counter() - t0:.1f} s")
            except Exception as e:  # a failed build is a row of n/a, the run goes on
                log(f"[{dt}] {name}: n/a ({type(e).__name__}: {e})")
                result["errors"].append({"dtype": dt, "impl": name, "error": f"{type(e).__name__}: {e}"})
                continue
            row = {"dtype": dt}
            try:
                t0 = time.perf_counter()
                out = model(train_batch, training=False, compute_force=True)
                row["first_call_s"] = time.perf_counter() - t0
                energy, forces = out["energy"].detach(), out["forces"].detach()
                del out
                if name == "e3nn":
                    ref = (energy, forces)
                if ref is not None:
                    row["energy_rel_err"] = rel_err(energy, ref[0])
                    row["forces_rel_err"] = rel_err(forces, ref[1])
                    log(f"[{dt}] {name}: energy rel err {row['energy_rel_err']:.2e}, forces {row['forces_rel_err']:.2e}")
                row.update(measure(name, model, train_batch, md_batch, args.reps, args.warmup, on_gpu))
                log(f"[{dt}] {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.endswith("_ms")))
                if args.profile and on_gpu:
                    row["profile"] = profile_train(f"{dt} {name}", model, train_batch, args.profile, log)
            except Exception as e:
                row.update({"impl": name, "error": f"{type(e).__name__}: {e}"})
                log(f"[{dt}] {name}: failed ({row['error']})")
            result["rows"].append(row)
            del model
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()

    cols = ("train_ms", "md_ms", "fwd_ms", "conv_tp_ms", "products_ms", "rest_ms", "forces_rel_err")
    print("\n| dtype | impl | " + " | ".join(cols) + " |")
    print("| --- | --- |" + " ---: |" * len(cols))
    for r in result["rows"]:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("n/a" if v is None else (f"{v:.2e}" if c.endswith("err") else f"{v:.2f}"))
        print(f"| {r['dtype']} | {r['impl']} | " + " | ".join(cells) + " |")
    path = args.json or (Path(os.environ["OUT"]) / "bench_mace.json" if os.environ.get("OUT") else None)
    if path:
        path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
