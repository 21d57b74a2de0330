#!/usr/bin/env python3
"""The fused backward (``bwd_op``) on the GPU: checked against the three backward ops, then timed.

For each problem (``--problems``, default the two target problems) at ``--batch`` rows,
float32, on CUDA:

1. checks ``bwd_op(x1, x2, w, g)`` against ``bwd_x1_op``, ``bwd_x2_op`` and ``bwd_w_op``
   (relative Frobenius error at most 1e-5: the same sums in another order) and the
   autograd gradients of ``tensor_product`` (which call ``bwd_op``) against them;
2. times (CUDA events, median of ``--reps`` calls after warm-up) ``fwd``, each backward op,
   ``bwd_op``, and forward+backward through autograd (``tensor_product(...).backward``,
   which calls ``bwd_op``), next to fwd + the three ops it replaces;
3. prints one line per problem: µs and the fused op's share of the three.

Compiling happens before the GPU lock (``--lock``, the one ``eqdsl tune`` uses), so several
of these can run in parallel with tuning jobs.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from eqdsl.tune import LOCK, cuda_median_us

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="mace_large,nequip_toluene")
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--lock", default=str(LOCK))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows, failed = [], False
    for name in args.problems.split(","):
        ops = importlib.import_module(f"generated.{name}.torch_ops")
        gen = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, generator=gen, device=dev)

        b = args.batch
        x1, x2, w, g = rand(b, ops.DIM_IN1), rand(b, ops.DIM_IN2), rand(b, ops.WEIGHT_NUMEL), rand(b, ops.DIM_OUT)
        sep = (ops.bwd_x1_op(g, x2, w), ops.bwd_x2_op(x1, g, w), ops.bwd_w_op(x1, x2, g))
        fused = ops.bwd_op(x1, x2, w, g)
        x1r, x2r, wr = (t.clone().requires_grad_() for t in (x1, x2, w))
        ops.tensor_product(x1r, x2r, wr).backward(g)
        auto = (x1r.grad, x2r.grad, wr.grad)
        errs = {}
        for label, got in (("fused", fused), ("autograd", auto)):
            errs[label] = max(float((a - r).norm() / r.norm().clamp_min(1e-30)) for a, r in zip(got, sep))
        ok = all(e <= 1e-5 for e in errs.values())
        failed |= not ok

        def fb():
            x1r.grad = x2r.grad = wr.grad = None
            ops.tensor_product(x1r, x2r, wr).backward(g)

        calls = {
            "fwd": lambda: ops.fwd_op(x1, x2, w),
            "bwd_x1": lambda: ops.bwd_x1_op(g, x2, w),
            "bwd_x2": lambda: ops.bwd_x2_op(x1, g, w),
            "bwd_w": lambda: ops.bwd_w_op(x1, x2, g),
            "bwd": lambda: ops.bwd_op(x1, x2, w, g),
            "fb": fb,
        }
        for c in calls.values():  # compile outside the lock
            c()
        torch.cuda.synchronize()
        with open(args.lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                us = {k: cuda_median_us(c, 3, args.reps) for k, c in calls.items()}
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        three = us["bwd_x1"] + us["bwd_x2"] + us["bwd_w"]
        row = {"problem": name, "ok": ok, "errors": errs, "us": us, "three": three}
        rows.append(row)
        print(
            f"{name:16s} {'ok' if ok else 'MISMATCH'} err {max(errs.values()):.1e} | fwd {us['fwd']:7.1f} | "
            f"bwd_x1 {us['bwd_x1']:6.1f} bwd_x2 {us['bwd_x2']:6.1f} bwd_w {us['bwd_w']:6.1f} = {three:7.1f} | "
            f"fused {us['bwd']:7.1f} ({us['bwd'] / three:.2f}x) | fwd+bwd autograd {us['fb']:7.1f} "
            f"(unfused fwd+3 ops {us['fwd'] + three:7.1f})",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
