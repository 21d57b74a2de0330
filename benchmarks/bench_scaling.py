#!/usr/bin/env python3
"""Multi-device weak scaling of force training with one generated conv layer (torch DDP, JAX shard_map).

The workload is one training step of a NequIP/MACE-style interaction layer around the
fused convolution of ``generated/mace_large`` (``128x0e+128x1o+128x2e`` x
``0e+1o+2e+3o``, channelwise ``uvu``, per-edge weights, ``conv = true``), float32:

1. node features: a learned per-species embedding ``(species, DIM_IN1)`` in the spec's
   layout (bulk Si has one species: every atom starts from the same row);
2. edge vectors ``pos[dst] - pos[src] + shift`` (periodic images), their spherical
   harmonics (irreps = the spec's ``irreps_in2``, l <= 3 here, component normalization,
   e3nn / e3nn-jax) as ``edge_attr``;
3. per-edge weights from a learned radial MLP: 8 Bessel functions times a smooth
   polynomial cutoff (``examples/main.py``'s ``_radial``) -> 64 (SiLU) -> ``WEIGHT_NUMEL``;
4. the generated ``conv``, an energy from the output's scalar (0e) channels through a
   learned readout, forces ``F = -dE/dpos`` with ``create_graph`` (double backward through
   the conv's kernels), loss ``sum |F - F_ref|^2 / (3 atoms)`` against fixed random
   reference forces (a throughput workload: the labels only have to be fixed);
5. backward, gradient averaging over the devices (DDP's all-reduce / ``jax.lax.pmean``),
   an SGD step.

Weak scaling: every device gets its own graph of the same size, a rattled (0.05 Å, one
seed per device) diamond Si supercell of ``--atoms`` atoms (default 2,048 = 8x8x4 cubic
cells) at a ``--cutoff`` of 5 Å, periodic, ASE ``neighbor_list`` (i = src, j = dst, edges
sorted by dst): 28 neighbours per atom, 57,344 edges. One device runs one graph per step,
N devices N graphs per step. Throughput = graphs (or edges) per second over all devices;
speedup = throughput(N) / throughput(1); target >= 1.9x on 2 devices.

torch: ``torch.multiprocessing`` spawns the processes itself (no ``torchrun``), one per GPU,
NCCL (gloo with ``--quick``), the layer wrapped in ``DistributedDataParallel``. The
1-device baseline is plain single-process training (no DDP, no process group), so the
speedup includes DDP's cost. Every rank's first ``--warmup`` steps are untimed (the first
loads the Helion kernels, compiled beforehand by ``precompile.py`` into
``$EQDSL_CACHE_DIR`` / ``$TRITON_CACHE_DIR``). A timed step is wall clock between two
``torch.cuda.synchronize()``; a step's time is the slowest rank's; the median of
``--reps`` steps is reported (CUDA-event medians are in the JSON). TF32 is off.

JAX: ``examples/train_jax_dp.make_dp_step``: ``jax.shard_map`` over a 1-D mesh ``"dp"`` of
N devices (1 for the baseline), each device's graph padded to common sizes with
``jax_ops.pad_graph`` (nodes to a multiple of 16 with at least one dummy node, edges to a
multiple of 64, not to power-of-two buckets, so no device does more than about 1% extra
work), ``value_and_grad`` of the loss, ``pmean`` of the gradients, the SGD update, all
under one ``jax.jit``; inputs placed on their devices once. ``check_vma``: the default
(True) on a GPU; if the first steps fail with it (an error, or gradients that fail the
check below), False; the JSON and the table say which ran and why. On the CPU it is
False (Pallas interpret mode cannot run with it). Timed: wall clock per step ended by
``block_until_ready``, median of ``--reps`` after the untimed steps. Matmul precision
``highest``.

Correctness, before anything is timed: the gradients of one N-device step against one
device over the same N graphs (torch: rank 0 recomputes them with a plain copy of the
model, graph after graph; JAX: the 1-device step on each graph, averaged): max over
parameters of max |difference| / max |one device| <= ``--check-tol`` (1e-4, float32).

Output: progress lines, then a Markdown table printed last; JSON at ``--json`` (default
``$OUT/bench_scaling.json``, else ``bench_scaling.json`` here): date, host, per framework
its device name, versions, graph sizes, check, and per N the step time, steps/s, graphs/s,
edges/s and speedup. An existing file's other frameworks are kept (the torch and JAX runs
may be separate invocations writing one file); the table covers every framework in it.

``--quick``: a CPU smoke run of the same code: a tiny spec (``4x0e+4x2e`` x ``0e+2e``,
``uvu``; the ``2e`` blocks matter, see ``QUICK_SPEC``) generated into a temp
dir, 2 devices (gloo processes with Helion in Triton's interpreter; 2 forced XLA host
devices with Pallas in interpret mode), 8 atoms at a 3 Å cutoff (32 edges), 1 untimed
and 1 timed step. Its numbers time the interpreters, nothing else (the table says so and
judges no target).

Usage::

    python3 benchmarks/bench_scaling.py --framework torch            # GPUs: N = every visible GPU
    python3 benchmarks/bench_scaling.py --framework jax --devices 2
    python3 benchmarks/bench_scaling.py --quick                       # CPU, both frameworks
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
from main import N_BASIS, _layout_index, _radial, _scalar_columns  # noqa: E402  (examples/main.py's layer pieces)

TARGET_SPEEDUP_2 = 1.9
SI_LATTICE = 5.43  # Å, diamond cubic cell
HIDDEN = 64
# With one species every atom has the same features. Without 2e x 2e -> 0e paths, the radial
# MLP's output bias then adds to the energy (scalar channels only) a constant plus terms odd in
# each edge vector (1o x Y1), which cancel over the edge pairs i->j, j->i: its gradient is pure
# rounding and no relative check can compare it. The 2e blocks (as mace_large's) give it a real
# one. Five paths only: each process generates every Helion kernel again in the interpreter.
QUICK_SPEC = """\
[[tensor_product]]
name = "scaling_quick"
irreps_in1 = "4x0e+4x2e"
irreps_in2 = "0e+2e"
irreps_out = "0e+2e"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float32"]
conv = true
"""


# ----------------------------------------------------------------------------- CLI


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", default="torch,jax", help="comma-separated: torch, jax (default both)")
    p.add_argument("--devices", type=int, default=None,
                   help="N (default: every visible GPU / JAX device; --quick: 2)")
    p.add_argument("--package", type=Path, default=ROOT / "generated" / "mace_large",
                   help="generated package directory with conv = true (default generated/mace_large)")
    p.add_argument("--atoms", type=int, default=None, help="atoms per device graph, a multiple of 8 "
                   "(default 2048; --quick 8)")
    p.add_argument("--cutoff", type=float, default=None, help="radius-graph cutoff in Å (default 5; --quick 3)")
    p.add_argument("--reps", type=int, default=None, help="timed steps (default 50; --quick 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (at least 1; default 2, --quick 1)")
    p.add_argument("--lr", type=float, default=1e-5, help="SGD learning rate")
    p.add_argument("--check-tol", type=float, default=1e-4,
                   help="largest relative gradient difference, N devices vs one (default 1e-4, float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None,
                   help="default $OUT/bench_scaling.json, or ./bench_scaling.json without OUT")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny spec and graph, 2 devices, 1 rep")
    p.add_argument("--print-table", action="store_true", help="only print the table of the JSON at --json")
    p.add_argument("--warm-only", action="store_true",
                   help="JAX: compile and run the untimed part (check included) with the same lowerings as the "
                   "timed run, then exit, filling JAX's persistent compilation cache; nothing written")
    args = p.parse_args(argv)
    args.framework = [f.strip() for f in args.framework.split(",") if f.strip()]
    bad = [f for f in args.framework if f not in ("torch", "jax")]
    if bad or not args.framework:
        p.error(f"--framework: torch and/or jax, got {bad or 'nothing'}")
    args.atoms = args.atoms or (8 if args.quick else 2048)
    args.cutoff = args.cutoff or (3.0 if args.quick else 5.0)
    args.reps = args.reps or (1 if args.quick else 50)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    if args.quick and args.devices is None:
        args.devices = 2
    if args.atoms % 8:
        p.error(f"--atoms {args.atoms}: a multiple of 8 (atoms of the diamond cubic cell)")
    if args.warmup < 1:
        p.error("--warmup: at least 1 (the first step loads or compiles the kernels)")
    if args.json is None:
        out = os.environ.get("OUT")
        args.json = Path(out) / "bench_scaling.json" if out else Path("bench_scaling.json")
    return args


# ----------------------------------------------------------------------------- graphs


def supercell(atoms: int) -> tuple[int, int, int]:
    """Repeats ``(a, b, c)``, ``a >= b >= c``, of the 8-atom cubic cell with ``8abc = atoms``,
    as close to a cube as the factorization allows (2048 -> (8, 8, 4))."""
    cells = atoms // 8
    best = None
    for c in range(1, round(cells ** (1 / 3)) + 2):
        if cells % c:
            continue
        for b in range(c, math.isqrt(cells // c) + 1):
            if (cells // c) % b:
                continue
            a = cells // c // b
            if a >= b and (best is None or a / c < best[0] / best[2]):
                best = (a, b, c)
    return best


def si_graph(atoms: int, cutoff: float, seed: int) -> dict:
    """A rattled periodic diamond Si supercell and its radius graph, as numpy arrays.

    Returns ``{"pos" (n, 3) float64 Å, "species" (n,) int64 (all 0), "src", "dst" (e,)
    int64 sorted by dst, "shift" (e, 3) float64 Å (edge vector = pos[dst] - pos[src] +
    shift), "forces" (n, 3) float64 random reference forces, "desc" str}``. Raises
    ``ImportError`` without ASE."""
    from ase.build import bulk
    from ase.neighborlist import neighbor_list

    reps = supercell(atoms)
    cell = bulk("Si", "diamond", a=SI_LATTICE, cubic=True).repeat(reps)
    # a thermal snapshot: in the perfect crystal every force is zero by symmetry
    cell.rattle(stdev=0.05, seed=seed)
    i, j, shifts = neighbor_list("ijS", cell, cutoff)
    order = np.argsort(j, kind="stable")  # dst-sorted edges, as bench_conv's graphs
    rng = np.random.default_rng(10_000 + seed)
    return {
        "pos": cell.get_positions(),
        "species": np.zeros(len(cell), np.int64),
        "src": i[order].astype(np.int64),
        "dst": j[order].astype(np.int64),
        "shift": (shifts[order] @ np.asarray(cell.cell)).astype(np.float64),
        "forces": rng.standard_normal((len(cell), 3)),
        "desc": f"Si diamond {reps[0]}x{reps[1]}x{reps[2]} cubic cells, {len(cell)} atoms, periodic, rattled 0.05 Å, "
                f"cutoff {cutoff:g} Å, {len(i)} edges",
    }


# ----------------------------------------------------------------------------- package


def quick_package(tmp: Path) -> Path:
    """Generate ``QUICK_SPEC`` into ``tmp``; returns the package directory."""
    from eqdsl.codegen.generate import generate

    spec = tmp / "scaling_quick.toml"
    spec.write_text(QUICK_SPEC, encoding="utf-8")
    generate(spec, tmp / "scaling_pkgs")
    return tmp / "scaling_pkgs" / "scaling_quick"


def import_package(pkg: Path, module: str | None = None):
    """Import the generated package at directory ``pkg`` (or its ``module``) as
    ``<parent name>.<name>``, the way ``precompile.py`` imports ``generated/<problem>``."""
    import importlib

    pkg = pkg.resolve()
    if not (pkg / "__init__.py").is_file():
        raise SystemExit(f"error: {pkg}: not a generated package (no __init__.py)")
    if str(pkg.parent.parent) not in sys.path:
        sys.path.insert(0, str(pkg.parent.parent))
    importlib.invalidate_caches()
    meta = importlib.import_module(f"{pkg.parent.name}.{pkg.name}")
    if not getattr(meta, "CONV", False):
        raise SystemExit(f"error: {pkg}: generated without conv = true")
    if "float32" not in meta.DTYPES:
        raise SystemExit(f"error: {pkg}: no float32 kernels (dtypes {meta.DTYPES})")
    return meta if module is None else importlib.import_module(f"{meta.__name__}.{module}")


# ----------------------------------------------------------------------------- torch


def torch_layer(meta, conv, cutoff: float, n_species: int, device, seed: int):
    """The interaction layer as a float32 ``nn.Module``, parameters drawn from ``seed``.

    ``forward(b)`` takes a graph dict of tensors (``si_graph``'s keys) and returns
    ``(energy, forces)``, forces by ``torch.autograd.grad(..., create_graph=True)`` inside
    forward as MACE and NequIP do (so DDP's reducer sees only the loss's backward).
    ``examples/train_ddp.build_model`` has no periodic shifts, hence this copy."""
    import torch
    from e3nn import o3

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.randn(n_species, meta.DIM_IN1))
            self.radial = torch.nn.Sequential(torch.nn.Linear(N_BASIS, HIDDEN), torch.nn.SiLU(),
                                              torch.nn.Linear(HIDDEN, meta.WEIGHT_NUMEL))
            cols = _scalar_columns(meta.IRREPS_OUT, meta.LAYOUT)
            # constant indices: plain attributes, not buffers (DDP would broadcast them)
            self.cols = torch.as_tensor(cols, device=device)
            self.sh_index = torch.as_tensor(_layout_index(meta.IRREPS_IN2, meta.LAYOUT), device=device)
            self.readout = torch.nn.Parameter(torch.randn(len(cols)) / max(len(cols), 1) ** 0.5)
            self.check_indices = True  # the conv's host-side index check: first call only (one sync)

        def forward(self, b):
            pos = b["pos"].detach().requires_grad_(True)
            src, dst = b["src"], b["dst"]
            vec = pos[dst] - pos[src] + b["shift"]
            sh = o3.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True,
                                        normalization="component")[:, self.sh_index]
            w = self.radial(_radial(torch.linalg.norm(vec, dim=1), cutoff, torch))
            out = conv(self.embedding[b["species"]], sh, w, src, dst, pos.shape[0], check=self.check_indices)
            self.check_indices = False
            energy = (out[:, self.cols] @ self.readout).sum()
            (grad,) = torch.autograd.grad(energy, pos, create_graph=True)
            return energy, -grad

    torch.manual_seed(seed)
    return Layer().to(device=device, dtype=torch.float32)


def _force_loss(model, b):
    _, forces = model(b)
    return ((forces - b["forces"]) ** 2).sum() / forces.numel()


def _torch_graph(g: dict, device) -> dict:
    import torch

    f32 = lambda k: torch.as_tensor(g[k], dtype=torch.float32, device=device)  # noqa: E731
    return {"pos": f32("pos"), "shift": f32("shift"), "forces": f32("forces"),
            **{k: torch.as_tensor(g[k], dtype=torch.long, device=device) for k in ("species", "src", "dst")}}


def _torch_worker(rank: int, world: int, cfg: dict) -> None:
    """One process of the torch run (``torch.multiprocessing.spawn`` target). Rank 0
    writes ``cfg["result"]`` (JSON)."""
    import torch
    import torch.distributed as dist

    cuda = cfg["backend"] == "nccl"
    if cuda:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # the ranks share the host's cores
    if world > 1:
        dist.init_process_group(cfg["backend"], rank=rank, world_size=world, device_id=device if cuda else None)
    try:
        meta = import_package(Path(cfg["package"]))
        conv = import_package(Path(cfg["package"]), "torch_ops").conv
        graphs = {r: si_graph(cfg["atoms"], cfg["cutoff"], cfg["seed"] + r)
                  for r in (range(world) if rank == 0 and world > 1 else [rank])}
        b = _torch_graph(graphs[rank], device)
        model = torch_layer(meta, conv, cfg["cutoff"], 1, device, cfg["seed"])
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[rank] if cuda else None)
        else:
            net = model
        opt = torch.optim.SGD(net.parameters(), lr=cfg["lr"])
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        wall, events, losses, check = [], [], [], None
        total = cfg["warmup"] + cfg["reps"]
        for step in range(total):
            timed = step >= cfg["warmup"]
            if timed and cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            sync()
            t0 = time.perf_counter()
            if timed and cuda:
                ev[0].record()
            opt.zero_grad(set_to_none=True)
            loss = _force_loss(net, b)
            loss.backward()
            if step == 0 and world > 1:
                check = _torch_check(cfg, meta, conv, model, initial, graphs, device) if rank == 0 else None
            opt.step()
            if timed and cuda:
                ev[1].record()
            sync()
            if timed:
                wall.append((time.perf_counter() - t0) * 1e3)
                if cuda:
                    events.append(ev)
            if step in (0, total - 1):
                losses.append(float(loss.detach()))
            if step == cfg["warmup"] - 1 and world > 1:
                dist.barrier()  # every rank starts the timed steps together
        event_ms = [a.elapsed_time(z) for a, z in events]
        mem = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
        mine = {"wall": wall, "events": event_ms, "mem_gib": mem, "losses": losses}
        ranks = [None] * world
        if world > 1:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        if rank == 0:
            step_wall = [max(r["wall"][i] for r in ranks) for i in range(cfg["reps"])]
            step_events = [max(r["events"][i] for r in ranks) for i in range(cfg["reps"])] if cuda else []
            g = graphs[0]
            result = {
                "devices": world, "backend": cfg["backend"] if world > 1 else "none (one process, no DDP)",
                "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
                "graph": g["desc"], "atoms_per_device": len(g["pos"]), "edges_per_device": len(g["src"]),
                "step_ms": statistics.median(step_wall), "step_ms_all": step_wall,
                "step_ms_events": statistics.median(step_events) if step_events else None,
                "rank_step_ms": [statistics.median(r["wall"]) for r in ranks],
                "max_memory_gib": [r["mem_gib"] for r in ranks], "loss_first_last": ranks[0]["losses"],
                "check": check,
            }
            Path(cfg["result"]).write_text(json.dumps(result), encoding="utf-8")
    finally:
        if world > 1:
            dist.destroy_process_group()


def _torch_check(cfg, meta, conv, model, initial, graphs, device) -> dict:
    """Rank 0, after the first backward: a plain copy of the model with the initial
    parameters computes the mean loss over every rank's graph, one graph at a time; its
    gradients against the all-reduced ones."""
    single = torch_layer(meta, conv, cfg["cutoff"], 1, device, cfg["seed"])
    single.load_state_dict(initial)
    for g in graphs.values():
        (_force_loss(single, _torch_graph(g, device)) / len(graphs)).backward()
    return _compare({n: p.grad for n, p in model.named_parameters()},
                    {n: p.grad for n, p in single.named_parameters()}, cfg["check_tol"], len(graphs))


def _compare(got: dict, want: dict, tol: float, n: int) -> dict:
    """Max over parameters of max |got - want| / max |want|."""
    worst, where = 0.0, None
    for k in want:
        a = np.asarray(got[k].detach().cpu() if hasattr(got[k], "detach") else got[k], np.float64)
        b = np.asarray(want[k].detach().cpu() if hasattr(want[k], "detach") else want[k], np.float64)
        rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))
        if not np.isfinite(rel):
            rel = math.inf
        if rel >= worst:
            worst, where = rel, k
    return {"max_rel": worst, "parameter": where, "tol": tol, "ok": worst <= tol,
            "what": f"gradients of one {n}-device step vs one device over the same {n} graphs"}


def run_torch(args, package: Path, n: int):
    """Spawn the N-device run (with the check), then the 1-device baseline; yields the
    framework's JSON entry after each (the caller writes it, so that a run killed later
    keeps what it had). Raises ``SystemExit`` if fewer than N GPUs are visible."""
    import torch
    import torch.multiprocessing as mp

    cuda = torch.cuda.is_available() and not args.quick
    if cuda and torch.cuda.device_count() < n:
        raise SystemExit(f"error: --devices {n}: {torch.cuda.device_count()} GPUs visible")
    if not cuda:
        # read when the Helion kernel objects are created: before the children import torch_ops
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")
    from train_ddp import _free_port

    entry = {"device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
             "backend": "nccl" if cuda else "gloo", "interpreted": not cuda, "versions": _versions("torch"),
             "runs": {}}
    with tempfile.TemporaryDirectory(prefix="eqdsl_scaling_") as tmp:
        for world in dict.fromkeys([n, 1]):
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(_free_port())
            cfg = {"backend": entry["backend"], "package": str(package), "atoms": args.atoms, "cutoff": args.cutoff,
                   "seed": args.seed, "lr": args.lr, "warmup": args.warmup, "reps": args.reps,
                   "check_tol": args.check_tol, "result": str(Path(tmp) / f"torch_{world}.json")}
            t = time.perf_counter()
            mp.spawn(_torch_worker, args=(world, cfg), nprocs=world, join=True)
            res = json.loads(Path(cfg["result"]).read_text(encoding="utf-8"))
            res["process_s"] = time.perf_counter() - t
            check = res.pop("check")
            if check is not None:
                entry["check"] = _compare_line(check)
            entry["runs"][str(world)] = res
            _finish_entry(entry)
            _progress("torch", res)
            yield entry


def _compare_line(check: dict) -> dict:
    print(f"check: {check['what']}: max relative difference {check['max_rel']:.1e} in {check['parameter']} "
          f"({'ok' if check['ok'] else 'FAILED'}, tolerance {check['tol']:g})", flush=True)
    return check


# ----------------------------------------------------------------------------- JAX


def jax_loss(meta, jax_ops, num_nodes: int, cutoff: float):
    """``loss(params, g)``: the layer's force loss on one padded graph (``pad_graphs``'
    keys, no leading axis), mean over the graph's real atoms."""
    import e3nn_jax
    import jax
    import jax.numpy as jnp

    cols = _scalar_columns(meta.IRREPS_OUT, meta.LAYOUT)
    sh_index = _layout_index(meta.IRREPS_IN2, meta.LAYOUT)

    def energy(pos, params, g):
        em, nm = g["edge_mask"], g["node_mask"]
        vec = pos[g["dst"]] - pos[g["src"]] + g["shift"]
        # padded edges join the dummy node to itself: a unit vector (no 0/0 in the harmonics
        # or the basis) and zero weights (they add nothing to the conv)
        vec = jnp.where(em[:, None], vec, jnp.array([1.0, 0.0, 0.0], vec.dtype))
        sh = e3nn_jax.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component").array
        hidden = jax.nn.silu(_radial(jnp.linalg.norm(vec, axis=1), cutoff, jnp) @ params["w1"] + params["b1"])
        w = (hidden @ params["w2"] + params["b2"]) * em[:, None]
        h = params["embed"][g["species"]] * nm[:, None]
        out = jax_ops.conv(h, sh[:, sh_index], w, g["src"], g["dst"], num_nodes, check=False)
        return jnp.sum((out[:, cols] @ params["readout"]) * nm)

    def loss(params, g):
        forces = -jax.grad(energy)(g["pos"], params, g)
        err = jnp.sum((forces - g["forces"]) ** 2, axis=1) * g["node_mask"]
        return jnp.sum(err) / (3 * jnp.sum(g["node_mask"]))

    return loss


def jax_params(meta, seed: int) -> dict:
    """Float32 parameters (torch ``nn.Linear``'s init scale): species embedding, radial MLP, readout."""
    rng = np.random.default_rng(seed)
    cols = _scalar_columns(meta.IRREPS_OUT, meta.LAYOUT)
    u = lambda fan_in, shape: rng.uniform(-1, 1, shape) / math.sqrt(fan_in)  # noqa: E731
    p = {"embed": rng.standard_normal((1, meta.DIM_IN1)), "w1": u(N_BASIS, (N_BASIS, HIDDEN)), "b1": u(N_BASIS, HIDDEN),
         "w2": u(HIDDEN, (HIDDEN, meta.WEIGHT_NUMEL)), "b2": u(HIDDEN, meta.WEIGHT_NUMEL),
         "readout": rng.standard_normal(len(cols)) / math.sqrt(max(len(cols), 1))}
    return {k: v.astype(np.float32) for k, v in p.items()}


def pad_graphs(jax_ops, graphs: list[dict]) -> tuple[dict, int]:
    """Every graph padded with ``jax_ops.pad_graph`` to the same sizes (nodes: the largest
    count + 1 dummy, rounded up to 16; edges: the largest count rounded up to 64) and
    stacked on a leading axis: float32 pos, shift, forces; int32 species, src, dst; bool
    node_mask, edge_mask. Returns ``(batch, padded node count)``."""
    n_pad = -(-(max(len(g["pos"]) for g in graphs) + 1) // 16) * 16
    e_pad = -(-max(len(g["src"]) for g in graphs) // 64) * 64
    out = {k: [] for k in ("pos", "shift", "forces", "species", "src", "dst", "node_mask", "edge_mask")}
    for g in graphs:
        n, e = len(g["pos"]), len(g["src"])
        # the layer computes the conv's operands from the positions: pad_graph gives the padded
        # index arrays and masks (zero-width stand-ins for the operands)
        p = jax_ops.pad_graph(np.zeros((n, 0), np.float32), np.zeros((e, 0), np.float32),
                              np.zeros((e, 0), np.float32), g["src"], g["dst"], n, min_nodes=n_pad, min_edges=e_pad)
        assert p.num_nodes == n_pad and len(p.src) == e_pad, (p.num_nodes, len(p.src))
        out["pos"].append(np.pad(g["pos"], ((0, n_pad - n), (0, 0))))
        out["forces"].append(np.pad(g["forces"], ((0, n_pad - n), (0, 0))))
        out["species"].append(np.pad(g["species"], (0, n_pad - n)))
        out["shift"].append(np.pad(g["shift"], ((0, e_pad - e), (0, 0))))
        out["src"].append(np.asarray(p.src))
        out["dst"].append(np.asarray(p.dst))
        out["node_mask"].append(np.asarray(p.node_mask))
        out["edge_mask"].append(np.asarray(p.edge_mask))
    dtypes = {"pos": np.float32, "shift": np.float32, "forces": np.float32, "species": np.int32, "src": np.int32,
              "dst": np.int32, "node_mask": bool, "edge_mask": bool}
    return {k: np.stack(v).astype(dtypes[k]) for k, v in out.items()}, n_pad


def run_jax(args, package: Path, n: int):
    """Check, then time the N-device and the 1-device step; yields the framework's JSON
    entry after each measurement (nothing with ``--warm-only``). Raises ``SystemExit`` if
    JAX sees fewer than N devices; re-raises what the first steps raise with
    ``check_vma=False``."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from train_jax_dp import make_dp_step

    jax.config.update("jax_default_matmul_precision", "highest")
    on_cpu = jax.default_backend() == "cpu"
    if jax.device_count() < n:
        hint = "; set XLA_FLAGS=--xla_force_host_platform_device_count=N" if on_cpu else ""
        raise SystemExit(f"error: --devices {n}: jax sees {jax.device_count()} devices ({jax.default_backend()}){hint}")
    meta = import_package(package)
    jax_ops = import_package(package, "jax_ops")
    devs = jax.devices()[:n]
    graphs = [si_graph(args.atoms, args.cutoff, args.seed + r) for r in range(n)]
    batch, n_pad = pad_graphs(jax_ops, graphs)
    loss = jax_loss(meta, jax_ops, n_pad, args.cutoff)
    meshes = {1: Mesh(np.array(devs[:1]), ("dp",)), n: Mesh(np.array(devs), ("dp",))}  # Auto axes
    entry = {"device": f"{devs[0].device_kind} ({devs[0].platform})", "interpreted": on_cpu,
             "versions": _versions("jax"), "runs": {}}
    params0 = jax_params(meta, args.seed)

    def place(k: int, first: int):
        b = {key: v[first:first + k] for key, v in batch.items()}
        return (jax.device_put(params0, NamedSharding(meshes[k], P())),
                jax.device_put(b, NamedSharding(meshes[k], P("dp"))))

    # check_vma: the default (True) on a GPU; False only where True fails (an error, or wrong
    # gradients), and on the CPU, where Pallas interpret mode cannot run with it
    vma_tries = [False] if on_cpu else [True, False]
    first_loss, failures = {}, []
    for vma in vma_tries:
        try:
            steps = {k: make_dp_step(loss, meshes[k], args.lr, check_vma=vma) for k in meshes}
            t = time.perf_counter()
            # the reference: the 1-device step on each graph (its gradient output), averaged
            outs = [steps[1](*place(1, i)) for i in range(n)]
            entry["first_step_s"] = {"1": time.perf_counter() - t}
            first_loss[1] = float(outs[0][1])
            ref = jax.tree.map(lambda *g: sum(np.asarray(x, np.float64) for x in g) / n, *[o[2] for o in outs])
            check = None
            if n > 1:
                t = time.perf_counter()
                _, value, got = steps[n](*place(n, 0))
                entry["first_step_s"][str(n)] = time.perf_counter() - t
                first_loss[n] = float(value)
                check = _compare_line(_compare(jax.tree.map(np.asarray, got), ref, args.check_tol, n))
        except Exception as e:  # noqa: BLE001  (check_vma=True failing: retried without it, reported)
            if vma is vma_tries[-1]:
                raise
            failures.append(f"check_vma={vma}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            print(f"{failures[-1]}; retrying with check_vma=False", flush=True)
            continue
        entry["check_vma"] = vma
        if check is not None:
            entry["check"] = check
        if check is None or check["ok"] or vma is vma_tries[-1]:
            break
        failures.append(f"check_vma={vma}: gradient check FAILED ({check['max_rel']:.1e})")
        print(f"{failures[-1]}; retrying with check_vma=False", flush=True)
    if failures:
        entry["check_vma_failures"] = failures
    print(f"jax: check_vma={entry['check_vma']}, first steps (compile or cache load) "
          + ", ".join(f"{k} device(s) {v:.1f} s" for k, v in entry["first_step_s"].items()), flush=True)
    if args.warm_only:
        print("warm: done (--warm-only: nothing timed)", flush=True)
        return
    for k in dict.fromkeys([n, 1]):
        params, b = place(k, 0)
        for _ in range(args.warmup - 1):  # the first call (above) was untimed already
            params, value, _ = steps[k](params, b)
        jax.block_until_ready(params)
        wall = []
        for _ in range(args.reps):
            t = time.perf_counter()
            params, value, _ = steps[k](params, b)
            jax.block_until_ready((params, value))
            wall.append((time.perf_counter() - t) * 1e3)
        res = {"devices": k, "device_name": entry["device"], "graph": graphs[0]["desc"],
               "atoms_per_device": len(graphs[0]["pos"]), "edges_per_device": len(graphs[0]["src"]),
               "padded_nodes_edges_per_device": [n_pad, int(batch["src"].shape[1])],
               "step_ms": statistics.median(wall), "step_ms_all": wall,
               "loss_first_last": [first_loss[k], float(value)],
               "check_vma": entry["check_vma"]}
        entry["runs"][str(k)] = res
        _finish_entry(entry)
        _progress("jax", res)
        yield entry


# ----------------------------------------------------------------------------- output


def _versions(framework: str) -> dict:
    import importlib.metadata as md

    names = {"torch": ("torch", "helion", "triton", "e3nn"), "jax": ("jax", "jaxlib", "e3nn-jax")}[framework]
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _finish_entry(entry: dict) -> None:
    """Throughputs and speedups of the runs measured so far."""
    for res in entry["runs"].values():
        s = res["step_ms"] / 1e3
        res["steps_per_s"] = 1 / s
        res["graphs_per_s"] = res["devices"] / s
        res["edges_per_s"] = res["devices"] * res["edges_per_device"] / s
    base = entry["runs"].get("1")
    for res in entry["runs"].values():
        res["speedup"] = res["graphs_per_s"] / base["graphs_per_s"] if base else None
        res["efficiency"] = res["speedup"] / res["devices"] if base else None


def _progress(fw: str, res: dict) -> None:
    print(f"{fw}: {res['devices']} device(s): step {res['step_ms']:.2f} ms (median of {len(res['step_ms_all'])}), "
          f"{res['edges_per_s'] / 1e6:.3f} M edges/s; loss first/last {res['loss_first_last']}", flush=True)


def write_json(path: Path, fw: str, entry: dict, args) -> dict:
    """Merge ``entry`` into the JSON at ``path`` (other frameworks kept) and write it."""
    doc = {}
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            doc = {}
    doc.setdefault("frameworks", {})
    entry = dict(entry, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 host=platform.node(), quick=args.quick, package=str(args.package_name),
                 settings={"atoms": args.atoms, "cutoff": args.cutoff, "reps": args.reps, "warmup": args.warmup,
                           "lr": args.lr, "seed": args.seed, "dtype": "float32"})
    doc["frameworks"][fw] = entry
    doc.update(benchmark="bench_scaling", target=f"speedup >= {TARGET_SPEEDUP_2}x on 2 devices (weak scaling)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


def table(doc: dict) -> str:
    """The Markdown table of every framework in ``doc``."""
    lines = ["| framework | devices | step ms | steps/s | graphs/s | M edges/s | speedup | efficiency | check |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    notes = []
    for fw, e in doc.get("frameworks", {}).items():
        chk = e.get("check")
        chk_s = "n/a" if not chk else f"{'ok' if chk['ok'] else 'FAILED'} {chk['max_rel']:.1e}"
        for k, r in sorted(e["runs"].items(), key=lambda kv: int(kv[0])):
            sp = "" if r.get("speedup") is None else f"{r['speedup']:.2f}x"
            eff = "" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"
            lines.append(f"| {fw} | {k} | {r['step_ms']:.2f} | {r['steps_per_s']:.1f} | {r['graphs_per_s']:.1f} | "
                         f"{r['edges_per_s'] / 1e6:.2f} | {sp} | {eff} | {chk_s if k != '1' else ''} |")
            if k == "2" and r.get("speedup") is not None and not e.get("interpreted"):
                met = r["speedup"] >= TARGET_SPEEDUP_2
                notes.append(f"{fw}: {r['speedup']:.2f}x on 2 devices: target >= {TARGET_SPEEDUP_2}x "
                             f"{'met' if met else 'MISSED'}")
        extra = f", check_vma={e['check_vma']}" if "check_vma" in e else ""
        extra += "".join(f" (after {f})" for f in e.get("check_vma_failures", []))
        any_run = next(iter(e["runs"].values()), None)
        notes.append(f"{fw}: {e.get('device')}, {e.get('package')}, float32, {e.get('backend', 'shard_map + pmean')}"
                     f"{extra}{', INTERPRETED (CPU smoke run: not a measurement)' if e.get('interpreted') else ''}; "
                     f"{any_run['graph'] if any_run else ''}; {e.get('date')}")
    head = (f"Weak scaling, one training step (energy, forces with create_graph, force loss, backward, gradient "
            f"averaging, SGD) per device graph; step = median wall ms, slowest device; speedup = graphs/s(N) / "
            f"graphs/s(1); target >= {TARGET_SPEEDUP_2}x on 2 devices.")
    return "\n".join([head, ""] + lines + [""] + [f"- {x}" for x in notes])


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.print_table:
        if not args.json.is_file():
            raise SystemExit(f"error: {args.json}: no such file (nothing measured yet?)")
        print(table(json.loads(args.json.read_text(encoding="utf-8"))))
        return 0
    if args.quick:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       f" --xla_force_host_platform_device_count={args.devices}").strip()
    with tempfile.TemporaryDirectory(prefix="eqdsl_scaling_pkg_") as tmp:
        package = quick_package(Path(tmp)) if args.quick else args.package
        args.package_name = package.name
        status = 0
        doc = None
        for fw in args.framework:
            if fw == "torch":
                import torch

                n = args.devices or torch.cuda.device_count()
                runs = run_torch(args, package, n)
            else:
                import jax

                if args.quick:
                    jax.config.update("jax_disable_most_optimizations", True)  # interpret-mode compiles dominate
                n = args.devices or jax.device_count()
                runs = run_jax(args, package, n)
            if n < 1:
                raise SystemExit(f"error: {fw}: no devices (pass --quick on a CPU)")
            entry = None
            for entry in runs:
                if not args.warm_only:
                    doc = write_json(args.json, fw, entry, args)
            if entry is not None and entry.get("check") and not entry["check"]["ok"]:
                status = 1
        if doc is not None:
            print(f"json: {args.json}")
            print(table(doc))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
