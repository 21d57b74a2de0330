#!/usr/bin/env python3
"""Channel tiles as a grid axis (``Tuning.grid_c``) on the GPU: check, then time, the conv.

For mace_large and nequip_toluene, two builds of the same spec in one process:

  grid_c   generated/<name>/ as committed (``grid_c`` default on: ``hl.tile([channels, edges])``)
  loop     the spec with ``[tensor_product.tuning] grid_c = 0`` (the 1-D grid over edge tiles and
           a channel loop in each program, the kernels measured in BENCHMARKS.md), generated
           into ``--variant-dir`` under the name ``<name>_loop`` (torch.library op names are
           process-global)

on two graphs (edges sorted by dst, stable; random src / dst):

  g512     32 nodes x 16 random in-edges = 512 edges (the small-graph latency case; BENCHMARKS.md
           used 32 Si atoms at a 4 A cutoff, also 512 edges)
  g32k     512 nodes x 64 random in-edges = 32,768 edges (bench_conv.py's rand512x64)

1. Compile: one subprocess per (build, problem, dtype, op) on ``--workers`` processes, each
   calling its op once (fills ``$EQDSL_CACHE_DIR`` and ``$TRITON_CACHE_DIR``, as precompile.py).
2. Check every build against ``eqdsl.reference`` (numpy, float64): float64 kernels (relative
   Frobenius error <= 1e-9) and float32 kernels (<= 1e-4), the output and the gradients with
   respect to node features, edge attributes and weights. g512: everything. g32k: the
   numpy oracle takes minutes on all edges, so exact slices of it: the output rows of 8
   nodes (from all their in-edges), the node-feature gradient rows of 8 nodes (from all
   their out-edges), the edge-attribute and weight gradients of 1,024 edges. A build that
   disagrees is BAD and is not timed.
3. Time in float32 with CUDA events around each call (median of ``--reps`` after 10 warm-up
   calls; ``check=False``, as bench_conv.py): fwd = ``conv(...)``; fwd+bwd = ``conv`` then
   ``torch.autograd.grad`` of the three inputs. On the small graph a call is short enough
   that host time between its kernels can show in the events (as in BENCHMARKS.md's 289 us). With ``--tp`` also the plain tensor product
   (``torch_ops.tensor_product``) at 512 and 20,000 rows, whose kernels ``grid_c`` changes too.

Prints a table: per problem, graph and direction the median us of each build and loop / grid_c
(above 1: the grid axis is faster). JSON to ``$OUT/gpu_conv2d.json`` when ``OUT`` is set.

    python3 benchmarks/tools/gpu_conv2d.py [--workers 14] [--problems mace_large,nequip_toluene] [--tp]
                                     [--compile-only]

On the device machine, in benchmarks/run_device.sh's environment (it installs the carried
wheels when called with no step)::

    bash benchmarks/run_device.sh
    export PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
    python3 benchmarks/tools/gpu_conv2d.py --tp --compile-only   # 48 compile jobs; split if near 10 min
    python3 benchmarks/tools/gpu_conv2d.py --tp                  # checks and times from the caches

(the caches in /tmp last while the machine stays warm: make the calls back to back).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GRAPHS = {"g512": (32, 16), "g32k": (512, 64)}  # nodes, in-degree
TP_ROWS = (512, 20000)
TOL = {"float64": 1e-9, "float32": 1e-4}
DEVICE = "cuda"  # the checks and timed calls (a CPU smoke test under TRITON_INTERPRET=1 may set "cpu")
CONV_OPS = ("conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w")
TP_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")


# ------------------------------------------------------------------ builds


def loop_spec_text(problem: str) -> str:
    """The example spec of ``problem`` renamed ``<problem>_loop``, with ``grid_c = 0``."""
    from eqdsl.spec import load_spec
    from eqdsl.tune import with_tuning

    path = ROOT / "examples" / "specs" / f"{problem}.toml"
    (spec,) = load_spec(path)
    text = re.sub(rf'^name = "{problem}"', f'name = "{problem}_loop"', path.read_text(), count=1, flags=re.M)
    return with_tuning(text, tuple(sorted({**dict(spec.tuning), "grid_c": 0}.items())))


def generate_loop_builds(problems: list[str], variant_dir: Path) -> None:
    from eqdsl.codegen.generate import generate

    variant_dir.mkdir(parents=True, exist_ok=True)
    for p in problems:
        spec = variant_dir / f"{p}_loop.toml"
        spec.write_text(loop_spec_text(p))
        generate(spec, variant_dir / "gen_loop")


def import_build(build: str, problem: str, module: str, variant_dir: Path):
    if build == "grid_c":
        return importlib.import_module(f"generated.{problem}.{module}")
    if str(variant_dir) not in sys.path:
        sys.path.insert(0, str(variant_dir))
    return importlib.import_module(f"gen_loop.{problem}_loop.{module}")


# ------------------------------------------------------------------ graphs and inputs


def make_graph(label: str, seed: int = 0):
    nodes, deg = GRAPHS[label]
    rng = np.random.default_rng(seed)
    dst = np.repeat(np.arange(nodes), deg)
    src = rng.integers(0, nodes, nodes * deg)
    order = np.argsort(dst, kind="stable")  # sorted by dst already; kept for clarity
    return nodes, src[order].astype(np.int64), dst[order].astype(np.int64)


def make_inputs(ir, nodes: int, edges: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((nodes, ir.dim_in1))
    y = rng.standard_normal((edges, ir.dim_in2))
    w = rng.standard_normal((ir.weight_numel,) if ir.shared_weights else (edges, ir.weight_numel))
    g = rng.standard_normal((nodes, ir.dim_out))
    return x, y, w, g


# ------------------------------------------------------------------ compile jobs


def run_job(build: str, problem: str, dtype: str, op: str, variant_dir: str) -> None:
    """Call one op of one build once on CUDA at the benchmark's sizes' specialization."""
    import torch

    vd = Path(variant_dir)
    dt, dev = getattr(torch, dtype), torch.device("cuda")
    if op.startswith("conv_"):
        conv = import_build(build, problem, "torch_conv", vd)
        nodes, src, dst = make_graph("g512")
        e = len(src)
        s, d = torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev)
        xn = torch.randn(nodes, conv.DIM_IN1, dtype=dt, device=dev)
        gn = torch.randn(nodes, conv.DIM_OUT, dtype=dt, device=dev)
        y = torch.randn(e, conv.DIM_IN2, dtype=dt, device=dev)
        w = torch.randn(*(() if conv.SHARED_WEIGHTS else (e,)), conv.WEIGHT_NUMEL, dtype=dt, device=dev)
        args = {"conv_fwd": (xn, y, w), "conv_bwd_x": (gn, y, w), "conv_bwd_y": (xn, gn, w), "conv_bwd_w": (xn, y, gn)}[op]
        getattr(conv, op + "_op")(*args, *conv.graph_tensors(s, d, nodes), nodes)
    else:
        ops = import_build(build, problem, "torch_ops", vd)
        rows = TP_ROWS[0]
        x1 = torch.randn(rows, ops.DIM_IN1, dtype=dt, device=dev)
        x2 = torch.randn(rows, ops.DIM_IN2, dtype=dt, device=dev)
        g = torch.randn(rows, ops.DIM_OUT, dtype=dt, device=dev)
        w = torch.randn(*(() if ops.SHARED_WEIGHTS else (rows,)), ops.WEIGHT_NUMEL, dtype=dt, device=dev)
        args = {"fwd": (x1, x2, w), "bwd_x1": (g, x2, w), "bwd_x2": (x1, g, w), "bwd_w": (x1, x2, g)}[op]
        getattr(ops, op + "_op")(*args)
    torch.cuda.synchronize()


def compile_all(problems, tp: bool, workers: int, variant_dir: Path, timeout: float) -> dict:
    jobs = [(b, p, dt, op) for b in ("grid_c", "loop") for p in problems for dt in ("float64", "float32")
            for op in CONV_OPS + (TP_OPS if tp and dt == "float32" else ())]
    jobs.sort(key=lambda j: (j[2] != "float64", "bwd" not in j[3]))  # longest first
    t0 = time.perf_counter()
    failed = {}

    def one(job):
        t = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, __file__, "--job", *job, str(variant_dir)],
                               capture_output=True, text=True, timeout=timeout)
            why = "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:200]
        except subprocess.TimeoutExpired:
            why = f"timeout {timeout:.0f} s"
        return job, why, time.perf_counter() - t

    with cf.ThreadPoolExecutor(workers) as pool:
        for job, why, dt in pool.map(one, jobs):
            if why:
                failed[job] = why
            print(f"[{time.perf_counter() - t0:6.1f}s] compile {'/'.join(job):44s} {dt:6.1f}s {why or 'ok'}", flush=True)
    return failed


# ------------------------------------------------------------------ checks


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def conv_oracle(ir, label: str, x, y, w, g, src, dst, nodes):
    """(rows checked, reference values) of out, gx, gy, gw: everything (g512) or exact slices (g32k)."""
    from eqdsl.reference import conv_reference, conv_vjp_reference

    every = np.arange(nodes), np.arange(len(src))
    if label == "g512":
        out = conv_reference(ir, x, y, w, src, dst, nodes)
        gx, gy, gw = conv_vjp_reference(ir, x, y, w, src, dst, nodes, g)
        return {"out": (every[0], out), "gx": (every[0], gx), "gy": (every[1], gy), "gw": (every[1], gw)}
    assert ir.reduce == "sum", "slices of the oracle assume reduce = sum (mean needs every in-edge's degree)"
    rng = np.random.default_rng(5)
    nsel = np.sort(rng.choice(nodes, 8, replace=False))
    esel = np.sort(rng.choice(len(src), 1024, replace=False))
    wsel = (lambda e: w) if ir.shared_weights else (lambda e: w[e])
    e_in = np.flatnonzero(np.isin(dst, nsel))  # every in-edge of the chosen nodes
    out = conv_reference(ir, x, y[e_in], wsel(e_in), src[e_in], dst[e_in], nodes)[nsel]
    e_out = np.flatnonzero(np.isin(src, nsel))  # every out-edge of the chosen nodes
    gx = conv_vjp_reference(ir, x, y[e_out], wsel(e_out), src[e_out], dst[e_out], nodes, g)[0][nsel]
    _, gy, gw = conv_vjp_reference(ir, x, y[esel], wsel(esel), src[esel], dst[esel], nodes, g)
    if ir.shared_weights:
        gw = None  # a sum over every edge: not sliceable
    return {"out": (nsel, out), "gx": (nsel, gx), "gy": (esel, gy), "gw": (esel, gw)}


def check_conv(conv, oracle, dtype: str, x, y, w, g, src, dst, nodes) -> dict[str, float]:
    import torch

    dt, dev = getattr(torch, dtype), DEVICE
    xs, ys, ws = (torch.tensor(a, dtype=dt, device=dev, requires_grad=True) for a in (x, y, w))
    out = conv.conv(xs, ys, ws, torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev), nodes)
    grads = torch.autograd.grad(out, (xs, ys, ws), torch.tensor(g, dtype=dt, device=dev))
    got = dict(zip(("out", "gx", "gy", "gw"), (out.detach(), *grads)))
    errs = {}
    for k, (rows, want) in oracle.items():
        if want is not None:
            errs[k] = rel(got[k].double().cpu().numpy()[rows], want)
    return errs


# ------------------------------------------------------------------ timing


def time_cuda(fn, reps: int) -> float:
    """Median us of ``fn`` over ``reps`` calls, CUDA events around each, after 10 warm-up calls."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def conv_calls(conv, x, y, w, g, src, dst, nodes):
    import torch

    dev = DEVICE
    xs, ys, ws = (torch.tensor(a, dtype=torch.float32, device=dev, requires_grad=True) for a in (x, y, w))
    s, d = torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev)
    gt = torch.tensor(g, dtype=torch.float32, device=dev)

    def fwd():
        with torch.no_grad():
            conv.conv(xs, ys, ws, s, d, nodes, check=False)

    def fwd_bwd():
        out = conv.conv(xs, ys, ws, s, d, nodes, check=False)
        torch.autograd.grad(out, (xs, ys, ws), gt)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def tp_rows(ops, ir, rows: int):
    import torch

    from eqdsl.reference import tensor_product_reference

    rng = np.random.default_rng(rows)
    x1, x2 = rng.standard_normal((rows, ir.dim_in1)), rng.standard_normal((rows, ir.dim_in2))
    w = rng.standard_normal((ir.weight_numel,) if ir.shared_weights else (rows, ir.weight_numel))
    go = rng.standard_normal((rows, ir.dim_out))
    t = [torch.tensor(a, dtype=torch.float32, device=DEVICE, requires_grad=True) for a in (x1, x2, w)]
    gt = torch.tensor(go, dtype=torch.float32, device=DEVICE)
    n = min(rows, 512)  # the float32 check: the first rows against the float64 oracle
    want = tensor_product_reference(ir, x1[:n], x2[:n], w if ir.shared_weights else w[:n])
    err = rel(ops.tensor_product(*t).detach().double().cpu().numpy()[:n], want)

    def fwd():
        with torch.no_grad():
            ops.tensor_product(*t)

    def fwd_bwd():
        torch.autograd.grad(ops.tensor_product(*t), t, gt)

    return err, {"fwd": fwd, "fwd+bwd": fwd_bwd}


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", default="mace_large,nequip_toluene")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--tp", action="store_true", help="also the plain tensor product at 512 and 20,000 rows")
    p.add_argument("--variant-dir", default="/tmp/eqdsl_conv2d", help="where the grid_c = 0 builds are generated")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per compile job")
    p.add_argument("--compile-only", action="store_true",
                   help="stop after the compile jobs (a first device call; a second one then loads the caches)")
    p.add_argument("--job", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        run_job(*args.job)
        return 0
    import torch

    from eqdsl.lower import lower
    from eqdsl.spec import load_spec

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    problems = args.problems.split(",")
    vdir = Path(args.variant_dir)
    generate_loop_builds(problems, vdir)
    failed = compile_all(problems, args.tp, args.workers, vdir, args.timeout)
    if args.compile_only:
        return 0
    results, rows = [], []
    for prob in problems:
        ir = lower(load_spec(ROOT / "examples" / "specs" / f"{prob}.toml")[0])
        convs = {b: import_build(b, prob, "torch_conv", vdir) for b in ("grid_c", "loop")}
        for label in GRAPHS:
            nodes, src, dst = make_graph(label)
            x, y, w, g = make_inputs(ir, nodes, len(src))
            t = time.perf_counter()
            oracle = conv_oracle(ir, label, x, y, w, g, src, dst, nodes)
            print(f"{prob} {label}: oracle {time.perf_counter() - t:.1f} s", flush=True)
            times = {}
            for b, conv in convs.items():
                bad = [j for j in failed if j[0] == b and j[1] == prob]
                if bad:
                    print(f"  {b}: compile failed ({failed[bad[0]]}); not timed", flush=True)
                    continue
                errs = {dt: check_conv(conv, oracle, dt, x, y, w, g, src, dst, nodes) for dt in ("float64", "float32")}
                ok = all(e <= TOL[dt] for dt, es in errs.items() for e in es.values())
                print(f"  {b}: {'ok' if ok else 'BAD'} " + "; ".join(
                    f"{dt} " + ", ".join(f"{k} {e:.1e}" for k, e in es.items()) for dt, es in errs.items()), flush=True)
                rec = {"problem": prob, "graph": label, "nodes": nodes, "edges": len(src), "build": b,
                       "errors": errs, "ok": ok}
                if ok:
                    for direction, fn in conv_calls(conv, x, y, w, g, src, dst, nodes).items():
                        rec[direction] = times[(b, direction)] = time_cuda(fn, args.reps)
                results.append(rec)
            for direction in ("fwd", "fwd+bwd"):
                gc_, lp = times.get(("grid_c", direction)), times.get(("loop", direction))
                rows.append((prob, f"{label} ({len(src)} edges)", direction, gc_, lp))
        if args.tp:
            tps = {b: import_build(b, prob, "torch_ops", vdir) for b in ("grid_c", "loop")}
            for n in TP_ROWS:
                times = {}
                for b, ops in tps.items():
                    err, calls = tp_rows(ops, ir, n)
                    ok = err <= TOL["float32"]
                    print(f"  tp {prob} {n} rows {b}: float32 rel err {err:.1e} {'ok' if ok else 'BAD'}", flush=True)
                    if ok:
                        for direction, fn in calls.items():
                            times[(b, direction)] = time_cuda(fn, args.reps)
                    results.append({"problem": prob, "tp_rows": n, "build": b, "error": err, "ok": ok,
                                    **{d: times.get((b, d)) for d in ("fwd", "fwd+bwd")}})
                for direction in ("fwd", "fwd+bwd"):
                    rows.append((prob, f"TP {n} rows", direction, times.get(("grid_c", direction)),
                                 times.get(("loop", direction))))
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}, float32, median of {args.reps} calls (CUDA events, us)")
    print(f"{'problem':16s} {'case':22s} {'direction':9s} {'grid_c':>9s} {'loop':>9s} {'loop/grid_c':>11s}")
    fmt = lambda v: f"{v:9.1f}" if v is not None else f"{'n/a':>9s}"  # noqa: E731
    for prob, case, direction, gc_, lp in rows:
        ratio = f"{lp / gc_:11.2f}" if gc_ and lp else f"{'':11s}"
        print(f"{prob:16s} {case:22s} {direction:9s} {fmt(gc_)} {fmt(lp)} {ratio}")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "gpu_conv2d.json"
        path.write_text(json.dumps({"device": dev, "reps": args.reps, "results": results,
                                    "compile_failed": {"/".join(k): v for k, v in failed.items()}}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
