#!/usr/bin/env python3
"""Where the JAX conv's time goes, kernel by kernel, and how the edge order changes it (GPU).

The JAX conv (``generated/<name>/jax_ops.conv``) runs four kernel ops (``CONV_OPS``):
``fwd`` and ``bwd_x1`` are segment kernels (one program per node over its sorted edges),
``bwd_x2`` and ``bwd_w`` per-edge kernels that gather ``x`` by ``src`` and the output
cotangent ``G`` by ``dst`` in the order the edges come in. ``G`` is the widest operand
(mace_large: 9,088 columns against 1,152 of ``x``), so whether consecutive edges share a
``dst`` decides how often its rows come from cache. For each problem and graph this
script times, jitted, with the graph's index arrays (``rt_graph.conv_graph``) built once
outside the timed call:

* each kernel op alone, on the edges as the graph lists them, sorted by ``dst`` and
  sorted by ``src`` (the same edges: the conv's result does not depend on their order);
* ``rt_graph.conv_graph`` itself (two stable argsorts and two searchsorted, inside every
  ``conv`` call);
* the whole ``conv`` forward and forward + VJP, for each order.

Timing: ``block_until_ready`` wall clock, median of 7 groups of 10 calls.

    python3 benchmarks/tools/gpu_jax_conv_parts.py [--problems mace_large,nequip_toluene] [--graphs bulk,rand512x64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_tp as bt  # noqa: E402
from gpu_jax_conv_blocks import graphs, wall_us  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="mace_large,nequip_toluene")
    ap.add_argument("--graphs", default="bulk,rand512x64")
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--quick", action="store_true", help="CPU smoke test (interpret mode, tiny graph, nequip_water)")
    args = ap.parse_args()
    import jax

    from eqdsl.runtime.jax import graph as rt_graph, padding as rt_padding

    problems = ["nequip_water"] if args.quick else args.problems.split(",")
    groups, per_group = (2, 2) if args.quick else (7, 10)
    interpret = args.quick
    rows_out = []
    for name in problems:
        mod = bt.import_generated(args.generated, name, "jax_ops")
        k = mod._kernels
        block = (k.BLOCK_BATCH, getattr(k, "SEGMENT_EDGES", k.BLOCK_BATCH))
        rng = np.random.default_rng(0)
        for g in graphs(args.graphs.split(","), args.quick):
            n, e = g.num_nodes, g.num_edges
            rows = max(rt_padding.round_up(e, block[0]), block[0])
            x = jax.device_put(rng.standard_normal((n, mod.DIM_IN1)).astype(np.float32))
            y = jax.device_put(rng.standard_normal((rows, k.IDIM_IN2)).astype(np.float32))
            wshape = (1, k.IWEIGHT_NUMEL) if mod.SHARED_WEIGHTS else (rows, k.IWEIGHT_NUMEL)
            w = jax.device_put(rng.standard_normal(wshape).astype(np.float32))
            gout = jax.device_put(rng.standard_normal((n, k.IDIM_OUT)).astype(np.float32))
            orders = {"as listed": np.arange(e), "dst-sorted": np.argsort(g.dst, kind="stable"),
                      "src-sorted": np.argsort(g.src, kind="stable")}
            # jitted once per problem and graph: the orders differ in values only
            make = jax.jit(lambda s_, d_: rt_graph.conv_graph(s_, d_, n, rows, np.float32))
            ops = mod.CONV_OPS
            parts = {
                "fwd": jax.jit(lambda a, b, c, gr: ops.fwd(a, b, c, gr, block, interpret)),
                "bwd_x1": jax.jit(lambda h, b, c, gr: ops.bwd_x1(h, b, c, gr, block, interpret)),
                "bwd_x2": jax.jit(lambda a, h, c, gr: ops.bwd_x2(a, h, c, gr, block, interpret)),
                "bwd_w": jax.jit(lambda a, b, h, gr: ops.bwd_w(a, b, h, gr, block, interpret)),
            }

            @jax.jit
            def fwd_bwd(s_, d_):
                _, pull = jax.vjp(lambda a, b, c: mod.conv(a, b, c, s_, d_, n, check=False), x, yy, ww)
                return pull(gout[:, : mod.DIM_OUT])

            yy, ww = y[:e], (w[0] if mod.SHARED_WEIGHTS else w[:e, : mod.WEIGHT_NUMEL])
            for oname, perm in orders.items():
                s = jax.device_put(g.src[perm].astype(np.int32))
                d = jax.device_put(g.dst[perm].astype(np.int32))
                cg = make(s, d)
                argsets = {"fwd": (x, y, w), "bwd_x1": (gout, y, w), "bwd_x2": (x, gout, w), "bwd_w": (x, y, gout)}
                times = {p: wall_us(lambda p=p: parts[p](*argsets[p], cg), groups, per_group) for p in parts}
                times["conv_graph"] = wall_us(lambda: make(s, d), groups, per_group)
                times["conv fwd"] = wall_us(lambda: mod.conv(x, yy, ww, s, d, n, check=False), groups, per_group)
                times["conv fwd+bwd"] = wall_us(lambda: fwd_bwd(s, d), groups, per_group)
                line = f"{name:15s} {g.label:12s} {e:7d} {oname:11s} " + " ".join(f"{p} {t:8.1f}" for p, t in times.items())
                print(line, flush=True)
                rows_out.append(line)
    print("\nus per call (wall, block_until_ready):")
    for line in rows_out:
        print(line)


if __name__ == "__main__":
    main()
