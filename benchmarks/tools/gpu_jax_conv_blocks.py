#!/usr/bin/env python3
"""Edges per step of the Pallas conv's segment kernels, on the GPU: check, then time.

The JAX conv (``generated/<name>/jax_ops.conv``) runs its forward and its node-feature
gradient as segment kernels (``eqdsl.runtime.jax.launch.launch_segments``): one program per
node walks the node's dst-sorted edges ``block_edges`` at a time, carrying one running sum
per stored ``(block_edges, size)`` tile in registers, and writes the node's row once. More
edges per step mean more registers (mace_large's forward spilled at 2 edges and 4 warps,
ncu 2026-11-25); more warps spread them. The per-edge kernels (edge-attribute and weight
gradients, or the fused backward) keep the module's ``BLOCK_BATCH``.

For each problem, graph, segment block size (and ``--warps``, warps per program) this script
sets ``launch_segments``'s ``block_edges`` (and ``num_warps``; the others unchanged), checks
the output and the three gradients against
the module's default build (relative Frobenius error <= 1e-5, float32), then times the
jitted forward and forward+VJP (``block_until_ready`` wall clock, median of 7 groups).

    python3 benchmarks/tools/gpu_jax_conv_blocks.py [--problems mace_large,nequip_toluene]
        [--graphs latency,rand512x64,bulk] [--blocks 1,2,4,8] [--warps 4,8] [--quick]

``--quick``: CPU smoke test (interpret mode, tiny graph, nequip_water).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_conv  # noqa: E402
from benchmarks import bench_tp as bt  # noqa: E402


def graphs(names: list[str], quick: bool):
    out = []
    for name in names:
        if quick:
            out.append(bench_conv.random_graph(name + "-tiny", 8, 3, 1))
        elif name == "latency":
            out.append(bench_conv.latency_graph())
        elif name == "rand512x64":
            out.append(bench_conv.random_graph(name, 512, 64, 1))
        elif name == "rand4096x32":
            out.append(bench_conv.random_graph(name, 4096, 32, 2))
        elif name == "bulk":
            out.append(bench_conv.diamond_graph(name, "Si", 8, 5.0))
        else:
            raise SystemExit(f"unknown graph {name}")
    return out


def wall_us(fn, groups: int, per_group: int) -> float:
    import jax

    for _ in range(3):
        jax.block_until_ready(fn())
    times = []
    for _ in range(groups):
        t0 = time.perf_counter()
        for _ in range(per_group):
            out = fn()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) * 1e6 / per_group)
    return statistics.median(times)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="mace_large,nequip_toluene")
    ap.add_argument("--graphs", default="latency,rand512x64,bulk")
    ap.add_argument("--blocks", default="1,2,4,8")
    ap.add_argument("--warps", default=None,
                    help="comma-separated num_warps of the segment kernels to cross with --blocks (default: the module's)")
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import jax

    from eqdsl.runtime.jax import launch as rt

    problems = ["nequip_water"] if args.quick else args.problems.split(",")
    blocks = [int(b) for b in args.blocks.split(",")]
    warps = [int(w) for w in args.warps.split(",")] if args.warps else [None]
    groups, per_group = (2, 2) if args.quick else (7, 10)
    original = rt.launch_segments
    seg_block = {"value": None, "warps": None}

    def patched(*a, **k):
        if seg_block["value"] is not None:
            k["block_edges"] = seg_block["value"]
        if seg_block["warps"] is not None:
            k["num_warps"] = seg_block["warps"]
        return original(*a, **k)

    rt.launch_segments = patched
    rows = []
    for name in problems:
        mod = bt.import_generated(args.generated, name, "jax_ops")
        rng = np.random.default_rng(0)
        for g in graphs(args.graphs.split(","), args.quick):
            n, e = g.num_nodes, g.num_edges
            s, d = jax.device_put(g.src.astype(np.int32)), jax.device_put(g.dst.astype(np.int32))
            wshape = (mod.WEIGHT_NUMEL,) if mod.SHARED_WEIGHTS else (e, mod.WEIGHT_NUMEL)
            a, b, c = (jax.device_put(rng.standard_normal(sh).astype(np.float32))
                       for sh in ((n, mod.DIM_IN1), (e, mod.DIM_IN2), wshape))
            gout = jax.device_put(rng.standard_normal((n, mod.DIM_OUT)).astype(np.float32))
            base = None
            for blk, nw in [(None, None)] + [(b_, w_) for b_ in blocks for w_ in warps]:
                seg_block["value"], seg_block["warps"] = blk, nw
                jax.clear_caches()  # the module's inner jit would reuse the trace of another block size

                def f(a_, b_, c_):
                    return mod.conv(a_, b_, c_, s, d, n, check=False)

                def fb(a_, b_, c_, g_):
                    out, vjp = jax.vjp(f, a_, b_, c_)
                    return out, vjp(g_)

                # a fresh jit per block size: the patched block is read at trace time
                fwd, fwd_bwd = jax.jit(f), jax.jit(fb)
                t0 = time.perf_counter()
                res = jax.block_until_ready(fwd_bwd(a, b, c, gout))
                compile_s = time.perf_counter() - t0
                flat = [res[0], *res[1]]
                if base is None:
                    base = flat
                errs = [rel(x, y) for x, y in zip(flat, base)]
                ok = max(errs) <= 1e-5
                t_f = wall_us(lambda: fwd(a, b, c), groups, per_group) if ok else float("nan")
                t_fb = wall_us(lambda: fwd_bwd(a, b, c, gout), groups, per_group) if ok else float("nan")
                label = "default" if blk is None else str(blk) + ("" if nw is None else f"/w{nw}")
                rows.append((name, g.label, e, label, t_f, t_fb, max(errs), compile_s))
                print(f"{name:15s} {g.label:11s} {e:7d} seg_block={label:8s} fwd {t_f:9.1f} us  "
                      f"fwd+bwd {t_fb:9.1f} us  err {max(errs):.1e}  compile {compile_s:.0f} s", flush=True)
    print("\nproblem          graph        edges  seg_block   fwd us  fwd+bwd us")
    for name, gl, e, label, t_f, t_fb, _, _ in rows:
        print(f"{name:15s} {gl:11s} {e:7d}  {label:8s} {t_f:8.1f} {t_fb:10.1f}")


if __name__ == "__main__":
    main()
