#!/usr/bin/env python3
"""Run the conv's kernels of one problem a fixed number of times, for Nsight Compute (GPU).

    ncu -k regex:conv_ --metrics ... python3 benchmarks/tools/profile_conv.py mace_large torch
    ncu -k regex:conv_tp --metrics ... python3 benchmarks/tools/profile_conv.py mace_large jax

On a random graph of ``--edges`` edges (default 114,688, bulk Si's count) and
``edges // 64`` nodes, in ``--dtype`` (default float32): ``torch`` calls ``conv_fwd`` twice, then the backward the
spec's autograd runs (``conv_bwd`` where fused) twice; ``jax`` calls the jitted forward +
VJP twice (forward, then the backward kernels). Prints nothing but the kernels' names as
launched; ``benchmarks/tools/ncu_conv.sh`` runs both under ncu and summarizes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("framework", choices=("torch", "jax"))
    ap.add_argument("--edges", type=int, default=114688)
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args()
    from benchmarks import bench_tp as bt

    e = args.edges
    n = max(1, e // 64)
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, e)
    dst = np.sort(rng.integers(0, n, e))
    if args.framework == "torch":
        import torch

        conv = bt.import_generated(args.generated, args.problem, "torch_conv")
        dev, dt = torch.device("cuda"), getattr(torch, args.dtype)
        x = torch.randn(n, conv.DIM_IN1, device=dev, dtype=dt)
        y = torch.randn(e, conv.DIM_IN2, device=dev, dtype=dt)
        w = torch.randn(e, conv.WEIGHT_NUMEL, device=dev, dtype=dt)
        g = torch.randn(n, conv.DIM_OUT, device=dev, dtype=dt)
        s, d = torch.as_tensor(src, device=dev), torch.as_tensor(dst, device=dev)
        graph = conv.graph_tensors(s, d, n)
        for _ in range(2):
            conv.conv_fwd_op(x, y, w, *graph, n)
        torch.cuda.synchronize()
        if hasattr(conv, "conv_bwd_op"):
            for _ in range(2):
                conv.conv_bwd_op(x, y, w, g, *graph, n)
        else:
            for op, a in (("conv_bwd_x", (g, y, w)), ("conv_bwd_y", (x, g, w)), ("conv_bwd_w", (x, y, g))):
                for _ in range(2):
                    getattr(conv, op + "_op")(*a, *graph, n)
        torch.cuda.synchronize()
    else:
        import jax

        jax.config.update("jax_enable_x64", args.dtype == "float64")
        mod = bt.import_generated(args.generated, args.problem, "jax_ops")
        x = jax.device_put(rng.standard_normal((n, mod.DIM_IN1)).astype(args.dtype))
        y = jax.device_put(rng.standard_normal((e, mod.DIM_IN2)).astype(args.dtype))
        w = jax.device_put(rng.standard_normal((e, mod.WEIGHT_NUMEL)).astype(args.dtype))
        g = jax.device_put(rng.standard_normal((n, mod.DIM_OUT)).astype(args.dtype))
        s, d = jax.device_put(src.astype(np.int32)), jax.device_put(dst.astype(np.int32))

        @jax.jit
        def fwd_bwd(a, b, c, h):
            out, pull = jax.vjp(lambda a_, b_, c_: mod.conv(a_, b_, c_, s, d, n, check=False), a, b, c)
            return out, pull(h)

        for _ in range(2):
            jax.block_until_ready(fwd_bwd(x, y, w, g))


if __name__ == "__main__":
    main()
