#!/usr/bin/env python3
"""MACE with its symmetric contraction replaced (accelerate's ``products=True``): accuracy and speed.

The model: a mace-torch 0.3.16 ``ScaleShiftMACE`` of MACE-MP "medium" shape with random
weights (mace's initialization; hidden ``128x0e+128x1o``, max_ell 3, correlation 3, 2
``RealAgnosticResidualInteractionBlock`` interactions, radial MLP [64, 64, 64], 8 Bessel
functions, r_max 5 A, ``--elements`` 10 or 89 chemical elements, ``use_reduced_cg=False``:
mace's e3nn basis, so cuequivariance is not needed and, if installed, not used). Its product
blocks contract ``128x0e+128x1o+128x2e+128x3o`` into ``128x0e+128x1o`` and ``128x0e``.

Inputs (ase, mace-torch's own data path): ``--cells`` rattled 512-atom diamond-Si cells
(default 7: 3,584 atoms, ~100,000 edges), an eighth of the atoms turned into C and an eighth
into Ge (seeded), so the per-element weights of three elements are used.

Implementations, each a deep copy of the same model:

  e3nn           the model as mace-torch builds it (e3nn conv_tp, mace's SymmetricContraction)
  conv           ``accelerate(model, products=False)``: the convs only
  conv+products  ``accelerate(model)``: the convs and every product block's symmetric contraction

Accuracy (every dtype of ``--dtypes``, default float64 and float32; the float32 model is the
float64 one converted, ``.to(torch.float32)``): energy and forces of the
training batch (``compute_force=True``), and in float64 the gradient of a force loss with
respect to every parameter; printed as max |dE|, max |dF| and relative errors (max abs
difference over max abs reference). The check FAILS (exit status 1, "FAILED" lines after the
table) when, in float64, any relative error of an accelerated model against e3nn exceeds 1e-10
(issue 27's bar), or when, in float32, an accelerated model's forces are further from the
float64 e3nn forces than 10x e3nn float32's own error plus 1e-6.

Speed (``--time-dtype``, default float32; CUDA events, median of ``--reps`` after ``--warmup``):

  fwd_ms        forward, energy only, no grad
  md_ms         energy and forces (no create_graph)
  train_ms      forward, forces with create_graph, loss on energy and forces, backward
  sc_in_fwd_ms  inside fwd: the product blocks' ``symmetric_contractions`` (events around each,
                summed over both blocks)
  sc_fwd_ms, sc_fwd_bwd_ms
                those modules alone on the inputs they get in the model (captured), summed
                over both blocks: forward; forward + backward to node_feats and weights

On a GPU, the tensor-product packages are compiled first (``benchmarks/precompile.py``, as
``bench_mace.py`` does); the symmetric-contraction kernels compile on first use, in the
warm-up. ``--tiny``: a CPU smoke run (tiny model, one 8-atom cell, interpreted kernels, wall
clock) that checks the script end to end.

    python3 benchmarks/mace_products_check.py [--cells 7] [--elements 10] [--dtypes float64,float32]
                                              [--time-dtype float32] [--reps 10] [--json PATH] [--tiny]

Compile time counts against a device call: the tensor-product kernels of both dtypes (a few
minutes with 15 workers) and the symmetric kernels, compiled one after another in this process
on first use. If one call cannot hold it all, run ``--dtypes float64 --time-dtype ''`` and then
``--dtypes float32`` on the same warm machine (the Triton and eqdsl caches stay).

Prints progress lines, then a table last; JSON at ``--json`` (default
``$OUT/mace_products_check.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():  # before any generated op is imported: interpreted kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("EQDSL_KERNELS", "helion")  # no Triton code lowered ahead of time on the CPU
    os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_mace import ModuleTimer, precompile, si_cells  # noqa: E402

# atomic numbers of the model's elements (--elements 10); 89: 1..89. Both hold C, Si, Ge.
ELEMENTS_10 = [1, 3, 6, 7, 8, 14, 15, 16, 29, 32]
IMPLS = ("e3nn", "conv", "conv+products")
F64_REL = 1e-10


def build_model(dtype, hidden: str, max_ell: int, correlation: int, radial_mlp, zs, seed: int = 0):
    """A ScaleShiftMACE with mace's random initialization, in mace's e3nn basis."""
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        return modules.ScaleShiftMACE(
            r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=max_ell, interaction_cls=block,
            interaction_cls_first=block, num_interactions=2, num_elements=len(zs), hidden_irreps=o3.Irreps(hidden),
            MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.zeros(len(zs)), avg_num_neighbors=28.0,
            atomic_numbers=list(zs), correlation=correlation, gate=torch.nn.functional.silu,
            radial_MLP=list(radial_mlp), atomic_inter_scale=1.0, atomic_inter_shift=0.0, use_reduced_cg=False,
        )
    finally:
        torch.set_default_dtype(prev)


def alloy(atoms_list, seed: int):
    """An eighth of each cell's atoms turned into C, an eighth into Ge (seeded)."""
    rng = np.random.default_rng(seed)
    for atoms in atoms_list:
        z = atoms.get_atomic_numbers()
        idx = rng.permutation(len(z))
        k = max(1, len(z) // 8)
        z[idx[:k]], z[idx[k:2 * k]] = 6, 32
        atoms.set_atomic_numbers(z)
    return atoms_list


def make_batch(atoms_list, dtype, device, zs):
    from mace import data
    from mace.tools import torch_geometric, utils

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        table = utils.AtomicNumberTable(list(zs))
        items = [data.AtomicData.from_config(data.config_from_atoms(a), z_table=table, cutoff=5.0) for a in atoms_list]
        batch = next(iter(torch_geometric.dataloader.DataLoader(dataset=items, batch_size=len(items), shuffle=False)))
    finally:
        torch.set_default_dtype(prev)
    return batch.to(device).to_dict()


def variant(name: str, base, device, cache_dir):
    from eqdsl.integrations.mace import accelerate

    m = copy.deepcopy(base)
    if name == "conv":
        m = accelerate(m, products=False, cache_dir=cache_dir)
    elif name == "conv+products":
        m = accelerate(m, cache_dir=cache_dir)
    return m.to(device)


def tp_package_dirs(model) -> list[Path]:
    """The tensor-product packages (precompile.py's kind) the model calls."""
    from eqdsl.integrations.mace import packages

    return sorted(Path(p.__file__).parent for p in packages(model) if hasattr(p, "IRREPS_IN1"))


def _clone(batch):
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}


def energy_forces(model, batch):
    out = model(_clone(batch), training=False, compute_force=True)
    return out["energy"].detach(), out["forces"].detach()


def force_loss_grads(model, batch):
    out = model(_clone(batch), training=True, compute_force=True)
    loss = (out["forces"] ** 2).mean() + (out["energy"] ** 2).mean()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    return {n: (g.detach() if g is not None else None) for (n, _), g in zip(params, grads)}


def rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300))


def timer(on_gpu: bool, reps: int, warmup: int):
    def run(fn) -> float:
        for _ in range(warmup):
            fn()
        if on_gpu:
            torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            if on_gpu:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return run


def measure(model, batch, on_gpu: bool, reps: int, warmup: int, log) -> dict:
    run = timer(on_gpu, reps, warmup)
    ref_forces = torch.zeros_like(batch["positions"])
    scs = [p.symmetric_contractions for p in model.products]

    def fwd():
        with torch.no_grad():
            model(batch, training=False, compute_force=False)

    def md():
        model(batch, training=False, compute_force=True)

    def train():
        out = model(batch, training=True, compute_force=True)
        loss = (out["energy"] ** 2).mean() + ((out["forces"] - ref_forces) ** 2).mean()
        loss.backward()
        for p in model.parameters():
            p.grad = None

    t0 = time.perf_counter()
    train()  # first call: compiles what is not compiled yet (the symmetric kernels)
    if on_gpu:
        torch.cuda.synchronize()
    log(f"    first training step {time.perf_counter() - t0:.1f} s")
    row = {"fwd_ms": run(fwd), "md_ms": run(md), "train_ms": run(train)}
    # the product modules' inputs in the model, captured once
    captured = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: captured.append((mod, *[a.detach() for a in args])))
             for m in scs]
    fwd()
    for h in hooks:
        h.remove()
    with torch.no_grad():
        cots = [torch.randn_like(mod(x, y)) for mod, x, y in captured]

    def sc_fwd():
        with torch.no_grad():
            for mod, x, y in captured:
                mod(x, y)

    leaves = [(mod, x.clone().requires_grad_(True), y) for mod, x, y in captured]

    def sc_fwd_bwd():
        for (mod, x, y), cot in zip(leaves, cots):
            ws = [p for p in mod.parameters() if p.requires_grad]
            torch.autograd.grad((mod(x, y) * cot).sum(), [x, *ws])

    row["sc_fwd_ms"] = run(sc_fwd)
    row["sc_fwd_bwd_ms"] = run(sc_fwd_bwd)
    if on_gpu:
        t = ModuleTimer({"sc": scs})
        shares = []
        for _ in range(reps):
            t.reset()
            fwd()
            shares.append(t.totals()["sc"])
        t.close()
        row["sc_in_fwd_ms"] = statistics.median(shares)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", type=int, default=7, help="512-atom Si cells in the batch")
    p.add_argument("--elements", type=int, default=10, choices=(10, 89))
    p.add_argument("--dtypes", default="float64,float32", help="accuracy checks")
    p.add_argument("--time-dtype", default="float32", help="timings ('' for none)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--no-grad-check", action="store_true", help="skip the float64 force-loss gradients")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, one 8-atom cell")
    args = p.parse_args()

    def log(msg: str):
        print(msg, flush=True)

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in every implementation
    torch.backends.cudnn.allow_tf32 = False
    zs = ELEMENTS_10 if args.elements == 10 else list(range(1, 90))
    if args.tiny:
        hidden, max_ell, corr, radial = "4x0e+4x1o", 1, 2, (8,)
        atoms = alloy(si_cells((1, 1, 1), 1, 0), 1)
        args.reps, args.warmup = 1, 0
    else:
        hidden, max_ell, corr, radial = "128x0e+128x1o", 3, 3, (64, 64, 64)
        atoms = alloy(si_cells((4, 4, 4), args.cells, 0), 1)
    cache_dir = None  # eqdsl's cache ($EQDSL_CACHE_DIR or ~/.cache/eqdsl)
    dtypes = [d for d in args.dtypes.split(",") if d]
    result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
                       "hidden": hidden, "max_ell": max_ell, "correlation": corr, "radial_mlp": list(radial),
                       "elements": len(zs), "atoms": sum(len(a) for a in atoms)},
              "accuracy": [], "timing": [], "failures": []}
    failures = result["failures"]
    path = args.json or (Path(os.environ["OUT"]) / "mace_products_check.json" if os.environ.get("OUT") else None)

    def dump():  # after every row: a run cut off by a time limit keeps what it measured
        if path:
            path.write_text(json.dumps(result, indent=1))

    ref64 = None
    precompiled: set = set()

    def ready(model, dt):
        """Precompile the model's tensor-product packages for dt (GPU), once each."""
        pkgs = [d for d in tp_package_dirs(model) if (d, dt) not in precompiled]
        if on_gpu and pkgs:
            precompile(pkgs, [dt], args.workers, log)
        precompiled.update((d, dt) for d in pkgs)

    # one model: the float32 one is the float64 one converted, so float32 errors are rounding only
    base64 = build_model(torch.float64, hidden, max_ell, corr, radial, zs)
    for dt in dtypes:
        dtype = getattr(torch, dt)
        base = copy.deepcopy(base64).to(dtype)
        batch = make_batch(atoms, dtype, device, zs)
        log(f"[{dt}] {batch['positions'].shape[0]} atoms, {int(batch['edge_index'].shape[1])} edges, "
            f"{len(zs)} elements")
        ref = ref_grads = None
        for name in IMPLS:
            t0 = time.perf_counter()
            model = variant(name, base, device, cache_dir)
            ready(model, dt)
            e, f = energy_forces(model, batch)
            grads = force_loss_grads(model, batch) if dt == "float64" and not args.no_grad_check else None
            log(f"[{dt}] {name}: energy and forces in {time.perf_counter() - t0:.1f} s")
            row = {"dtype": dt, "impl": name}
            if name == "e3nn":
                ref, ref_grads = (e, f), grads
                if dt == "float64":
                    ref64 = (e, f)
            else:
                row.update(dE=float((e - ref[0]).abs().max()), dF=float((f - ref[1]).abs().max()),
                           rel_E=rel(e, ref[0]), rel_F=rel(f, ref[1]))
                if grads is not None:
                    worst = max(((rel(grads[n], ref_grads[n]), n) for n in grads
                                 if ref_grads[n] is not None and ref_grads[n].abs().max() > 0), default=(0.0, ""))
                    missing = [n for n in grads if (grads[n] is None) != (ref_grads[n] is None)]
                    row.update(rel_grad=worst[0], worst_param=worst[1])
                    if missing:
                        failures.append(f"{dt} {name}: gradients missing for {missing}")
                if dt == "float64":
                    for k in ("rel_E", "rel_F", "rel_grad"):
                        if row.get(k, 0.0) > F64_REL:
                            failures.append(f"{dt} {name}: {k} = {row[k]:.2e} > {F64_REL:.0e} "
                                            f"{row.get('worst_param', '') if k == 'rel_grad' else ''}")
            if dt != "float64" and ref64 is not None:
                row["rel_F_vs_f64"] = rel(f, ref64[1].to(f.device))
            log(f"[{dt}] {name}: " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in row.items() if k not in ("dtype", "impl")))
            result["accuracy"].append(row)
            dump()
            del model
            gc.collect()
        if dt != "float64" and ref64 is not None:
            rows = {r["impl"]: r for r in result["accuracy"] if r["dtype"] == dt}
            bar = 10 * rows["e3nn"]["rel_F_vs_f64"] + 1e-6
            for name in IMPLS[1:]:
                if rows[name]["rel_F_vs_f64"] > bar:
                    failures.append(f"{dt} {name}: forces {rows[name]['rel_F_vs_f64']:.2e} from float64 e3nn, "
                                    f"more than 10x e3nn {dt}'s {rows['e3nn']['rel_F_vs_f64']:.2e} + 1e-6")
        del base
        if on_gpu:
            torch.cuda.empty_cache()

    if args.time_dtype:
        dt = args.time_dtype
        dtype = getattr(torch, dt)
        base = copy.deepcopy(base64).to(dtype)
        batch = make_batch(atoms, dtype, device, zs)
        for name in IMPLS:
            model = variant(name, base, device, cache_dir)
            ready(model, dt)
            log(f"[{dt}] timing {name}")
            row = {"dtype": dt, "impl": name, **measure(model, batch, on_gpu, args.reps, args.warmup, log)}
            log(f"[{dt}] {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.endswith("_ms")))
            result["timing"].append(row)
            dump()
            del model
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()

    dump()
    unit = "ms (CUDA events)" if on_gpu else "ms (wall clock, interpreted)"
    print(f"\nAccuracy against e3nn ({result['meta']['atoms']} atoms; rel = max|diff| / max|reference|):")
    print("| dtype | impl | max dE | max dF | rel E | rel F | rel grad (f64) | rel F vs f64 e3nn |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["accuracy"]:
        cells = [r.get(k) for k in ("dE", "dF", "rel_E", "rel_F", "rel_grad", "rel_F_vs_f64")]
        print(f"| {r['dtype']} | {r['impl']} | " + " | ".join("-" if v is None else f"{v:.1e}" for v in cells) + " |")
    if result["timing"]:
        cols = ("fwd_ms", "md_ms", "train_ms", "sc_in_fwd_ms", "sc_fwd_ms", "sc_fwd_bwd_ms")
        print(f"\nTimings, {unit}, {result['meta']['device']}:")
        print("| dtype | impl | " + " | ".join(cols) + " |")
        print("| --- | --- |" + " ---: |" * len(cols))
        for r in result["timing"]:
            print(f"| {r['dtype']} | {r['impl']} | "
                  + " | ".join("n/a" if r.get(c) is None else f"{r[c]:.2f}" for c in cols) + " |")
    if failures:
        for line in failures:
            print(f"FAILED: {line}")
        return 1
    print("OK: every accelerated model within the bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
