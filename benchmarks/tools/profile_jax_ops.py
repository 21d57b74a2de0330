#!/usr/bin/env python3
"""Per-kernel-op timings of the generated Pallas (JAX) kernels: where a forward+backward goes.

For each problem (``generated/<name>/pallas_kernels.py``), dtype and ``(block_batch,
num_warps)`` of the grid, at one batch size: each kernel function jitted on its own
(``forward``, ``backward_x1``, ``backward_x2``, ``backward_w`` and, where the product has
one, ``backward_fused``; the ops ``jax_ops.tensor_product``'s VJP chooses between),
its median wall-clock time (``benchmarks.bench_tp.Timer``, the tables' JAX timing: groups
of calls ended by ``block_until_ready``, inputs rotating over sets larger than the L2),
and the bytes it must move (each operand read once, each result written once) over that
time. The profile_ops.py of the torch ops, for JAX. ``num_warps`` is the module constant
``NUM_WARPS``, read when a call is traced (set here, JAX's caches cleared per config).

    python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv --dtypes float32,float64 \\
        --block-batch 8,16 --num-warps 4

With ``--ncu`` every op of every config runs twice (compile, then once more) and nothing is
timed: for ``ncu --kernel-name regex:_tp_`` (registers, spills, DRAM bytes per kernel).
Runs on the CPU too (``--quick``: 64 rows, interpret mode; a smoke test).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OPS = {  # kernel function -> (its operands, by name; its results' widths)
    "forward": (("x1", "x2", "w"), ("out",)),
    "backward_x1": (("g", "x2", "w"), ("x1",)),
    "backward_x2": (("x1", "g", "w"), ("x2",)),
    "backward_w": (("x1", "x2", "g"), ("w",)),
    "backward_fused": (("x1", "x2", "w", "g"), ("x1", "x2", "w")),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="e3tools_conv,diffdock_l2")
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--block-batch", default=None, help="comma-separated; default: the module's block for the dtype")
    ap.add_argument("--num-warps", default=None, help="comma-separated; default: the module's NUM_WARPS")
    ap.add_argument("--target-s", type=float, default=0.2, help="timing seconds per measurement")
    ap.add_argument("--ncu", action="store_true", help="run each op twice, time nothing (for ncu)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: 64 rows, interpret mode")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.bench_tp import Timer

    interpret = jax.default_backend() != "gpu"
    if args.quick:
        args.batch, args.target_s = 64, 0.02
    timer = Timer(None, args.target_s * 1e3, args.quick)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, batch {args.batch}", flush=True)
    table = []
    for name in [n for n in args.problems.split(",") if n]:
        kern = importlib.import_module(f"generated.{name}.pallas_kernels")
        widths = {"x1": kern.IDIM_IN1, "x2": kern.IDIM_IN2, "w": kern.IWEIGHT_NUMEL, "g": kern.IDIM_OUT,
                  "out": kern.IDIM_OUT}
        ops = [op for op in OPS if op != "backward_fused" or getattr(kern, "BWD_FUSED_KERNELS", None)]
        default_nw = kern.NUM_WARPS
        for dtype in args.dtypes.split(","):
            item = np.dtype(dtype).itemsize
            bbs = ([int(b) for b in args.block_batch.split(",")] if args.block_batch
                   else [kern.BLOCK_BATCH_BY_DTYPE.get(dtype, kern.BLOCK_BATCH)])
            nws = [int(n) for n in args.num_warps.split(",")] if args.num_warps else [default_nw]
            rows = -(-args.batch // max(bbs)) * max(bbs)
            nsets = 1 if (args.quick or args.ncu) else max(2, min(8, int(4 * 50e6 / (item * rows * sum(
                widths[k] for k in ("x1", "x2", "w", "g")))) + 1))
            rng = np.random.default_rng(0)
            sets = [{k: jnp.asarray(rng.normal(size=(rows, widths[k])), dtype) for k in ("x1", "x2", "w", "g")}
                    for _ in range(nsets)]
            for bb in bbs:
                for nw in nws:
                    kern.NUM_WARPS = nw
                    jax.clear_caches()
                    for op in ops:
                        operands, results = OPS[op]
                        f = jax.jit(lambda *a, _op=op, _bb=bb: getattr(kern, _op)(*a, block_batch=_bb,
                                                                                  interpret=interpret))
                        if args.ncu:
                            for _ in range(2):
                                jax.block_until_ready(f(*(sets[0][k] for k in operands)))
                            continue
                        us = timer.jax_time(lambda i, _f=f, _o=operands: _f(*(sets[i][k] for k in _o)), nsets)[0]
                        moved = item * rows * (sum(widths[k] for k in operands) + sum(widths[k] for k in results))
                        table.append((name, dtype, bb, nw, op, us, moved / us / 1e3))
                        print(f"  {name} {dtype} bb={bb} nw={nw} {op:15s} {us:9.1f} us {moved / us / 1e3:7.0f} GB/s",
                              flush=True)
        kern.NUM_WARPS = default_nw
        jax.clear_caches()
    if table:
        print("\n| problem | dtype | block_batch | num_warps | op | µs | GB/s |\n| --- | --- | ---: | ---: | --- | ---: | ---: |")
        for name, dtype, bb, nw, op, us, gbs in table:
            print(f"| {name} | {dtype} | {bb} | {nw} | {op} | {us:.1f} | {gbs:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
