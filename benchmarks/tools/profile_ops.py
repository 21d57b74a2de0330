#!/usr/bin/env python3
"""Per-kernel-op timings of the generated torch ops: where a forward+backward spends its time.

For each problem (``generated/<name>/torch_ops.py``), float32, one batch size: the first
call of each kernel op (``fwd_op``, ``bwd_x1_op``, ``bwd_x2_op``, ``bwd_w_op``; compile
time included), its median time over per-call CUDA events, the host time per call and the
device time per call of 50 calls queued back to back, with the bytes the op must move
(each operand read once, the result written once) over that time and the fraction of
the copy bandwidth measured in the same run. Run on a GPU (one device call)::

    python3 benchmarks/tools/profile_ops.py --problems mace_large,nequip_toluene --batch 20000

With ``--ncu`` each op runs once more under ``torch.cuda.profiler`` markers, for
``ncu --profile-from-start off``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def median_us(fn, reps: int = 50) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def host_and_queued_us(fn, reps: int = 50) -> tuple[float, float]:
    """Host seconds per call (Python, dispatch, launch; no synchronization inside the loop) and
    the device time per call of ``reps`` calls queued back to back (one event pair).

    When the host time exceeds the kernel time the GPU waits for each launch, and a per-call
    event pair measures the host, not the kernel.
    """
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / reps * 1e6
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / reps * 1e3


class _NoLaunch:
    """Stands in for a generated kernel module: every kernel is a no-op."""

    def __getattr__(self, name):
        return lambda *args: None


def copy_gbps() -> float:
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    us = median_us(lambda: b.copy_(a), 20)
    return 2 * a.numel() * 4 / us / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="mace_large,nequip_toluene")
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    bw = copy_gbps()
    print(f"device {torch.cuda.get_device_name()}, copy bandwidth {bw:.0f} GB/s, batch {args.batch}, float32")
    rows = [("problem", "op", "first call s", "us", "host us", "queued us", "MB moved", "GB/s", "% of copy")]
    for name in args.problems.split(","):
        ops = importlib.import_module(f"generated.{name}.torch_ops")
        n, f = args.batch, torch.float32
        x1 = torch.randn(n, ops.DIM_IN1, device="cuda", dtype=f)
        x2 = torch.randn(n, ops.DIM_IN2, device="cuda", dtype=f)
        w = torch.randn(*(() if ops.SHARED_WEIGHTS else (n,)), ops.WEIGHT_NUMEL, device="cuda", dtype=f)
        g = torch.randn(n, ops.DIM_OUT, device="cuda", dtype=f)
        sizes = {"x1": x1.numel(), "x2": x2.numel(), "w": w.numel(), "g": g.numel()}
        cases = {
            "fwd_op": (lambda: ops.fwd_op(x1, x2, w), ("x1", "x2", "w", "g")),
            "bwd_x1_op": (lambda: ops.bwd_x1_op(g, x2, w), ("g", "x2", "w", "x1")),
            "bwd_x2_op": (lambda: ops.bwd_x2_op(x1, g, w), ("x1", "g", "w", "x2")),
            "bwd_w_op": (lambda: ops.bwd_w_op(x1, x2, g), ("x1", "x2", "g", "w")),
        }
        if hasattr(ops, "bwd_op"):  # the fused backward: reads x1, x2, W, g once, writes the three gradients
            cases["bwd_op"] = (lambda: ops.bwd_op(x1, x2, w, g), ("x1", "x2", "w", "g", "x1", "x2", "w"))
        for op, (fn, operands) in cases.items():
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            us = median_us(fn)
            host, queued = host_and_queued_us(fn)
            mb = sum(sizes[o] for o in operands) * 4 / 1e6
            rows.append((name, op, f"{first:.1f}", f"{us:.1f}", f"{host:.1f}", f"{queued:.1f}", f"{mb:.0f}", f"{mb / us * 1e3:.0f}",
                         f"{100 * mb / us * 1e3 / bw:.0f}"))
            print("  ".join(rows[-1]), flush=True)
            if op == "fwd_op":  # the same call with the kernel launch stubbed out: checks, dispatch (views)
                real, ops._k = ops._k, _NoLaunch()
                try:
                    host_views, _ = host_and_queued_us(fn)
                finally:
                    ops._k = real
                print(f"{name} fwd_op host us without the kernel launch (checks, dispatch, views if any): {host_views:.1f}")
            if args.ncu:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(wd) for c, wd in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
