"""Compile the generated torch kernels of many problems in parallel, before a benchmark.

Compiling is single-threaded (Helion's code generation, then Triton and ptxas): 30 to
150 s per problem and direction on the device machine's host, so a benchmark of every
problem would spend most of a device call compiling one kernel at a time. This script
runs one process per (problem, dtype, op) on a pool of ``--workers`` processes; each
calls its op once on a small CUDA batch, which leaves Helion's generated module in
``$EQDSL_CACHE_DIR`` (``eqdsl.runtime.helion_launch``) and the compiled binary in
``$TRITON_CACHE_DIR``. The benchmarks then only load both. Sizes are multiples of 16
like the benchmarks' (Triton specializes integers on divisibility by 16).

    python3 benchmarks/precompile.py --workers 14 [--problems a,b] [--dtypes float32] [--no-conv]
                                     [--generated DIR]

Prints one line per job (seconds, or the error) and a total; exits 0 even if a job failed
(the benchmark reports that problem as n/a with the reason).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOAT64_PROBLEMS = ("mace_large", "nequip_toluene")
TP_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")
CONV_OPS = ("conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w")


def run_job(problem: str, dtype: str, op: str, generated: Path = ROOT / "generated") -> None:
    """Call one op of ``<generated>/<problem>`` once on CUDA (compiles it)."""
    import torch

    sys.path.insert(0, str(generated.resolve().parent))
    package = f"{generated.resolve().name}.{problem}"
    if op.startswith("conv_"):
        ops = importlib.import_module(f"{package}.torch_conv")
    else:
        ops = importlib.import_module(f"{package}.torch_ops")
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    # enough rows that shared-weight gradients have several partial-sum rows (a size of 1
    # is a Triton specialization of its own: tetris_poly_1's bwd_w recompiled for 97 s)
    rows = 4096
    x1 = torch.randn(rows, ops.DIM_IN1, dtype=dt, device=dev)
    x2 = torch.randn(rows, ops.DIM_IN2, dtype=dt, device=dev)
    g = torch.randn(rows, ops.DIM_OUT, dtype=dt, device=dev)
    shared = getattr(ops, "SHARED_WEIGHTS", False)
    w = torch.randn(*(() if shared else (rows,)), ops.WEIGHT_NUMEL, dtype=dt, device=dev)
    if op.startswith("conv_"):
        nodes = 256
        xn = torch.randn(nodes, ops.DIM_IN1, dtype=dt, device=dev)
        gn = torch.randn(nodes, ops.DIM_OUT, dtype=dt, device=dev)
        # graphs below SEGMENT_MIN_EDGES launch a segment op's atomic kernels: compile both
        sizes = [rows] + ([max(rows, ops.SEGMENT_MIN_EDGES)] if getattr(ops, "SEGMENT_MIN_EDGES", 0) > rows else [])
        for edges in sizes:
            src = torch.randint(0, nodes, (edges,), device=dev)
            dst = torch.sort(torch.randint(0, nodes, (edges,), device=dev)).values
            ye = torch.randn(edges, ops.DIM_IN2, dtype=dt, device=dev)
            we = w if shared else torch.randn(edges, ops.WEIGHT_NUMEL, dtype=dt, device=dev)
            args = {
                "conv_fwd": (xn, ye, we),
                "conv_bwd_x": (gn, ye, we),
                "conv_bwd_y": (xn, gn, we),
                "conv_bwd_w": (xn, ye, gn),
                "conv_bwd": (xn, ye, we, gn),
            }[op]
            # the graph tensors the spec's ops take (sort orders and row pointers of segment scatters)
            getattr(ops, op + "_op")(*args, *ops.graph_tensors(src, dst, nodes), nodes)
    else:
        args = {"fwd": (x1, x2, w), "bwd_x1": (g, x2, w), "bwd_x2": (x1, g, w), "bwd_w": (x1, x2, g), "bwd": (x1, x2, w, g)}[op]
        getattr(ops, op + "_op")(*args)
    torch.cuda.synchronize()


def jobs(problems: list[str], dtypes: list[str] | None, conv: bool, generated: Path = ROOT / "generated") -> list[tuple[str, str, str]]:
    out = []
    for p in problems:
        gen = generated / p
        if not (gen / "torch_ops.py").is_file():
            continue
        fused = "bwd_op = " in (gen / "torch_ops.py").read_text()  # a channelwise product's fused backward
        conv_ops = list(CONV_OPS) if conv and (gen / "torch_conv.py").is_file() else []
        if conv_ops and "conv_bwd_op = " in (gen / "torch_conv.py").read_text():
            conv_ops.append("conv_bwd")  # the atomic convolution's fused backward
        ops = list(TP_OPS) + (["bwd"] if fused else []) + conv_ops
        for dt in dtypes or (["float32", "float64"] if p in FLOAT64_PROBLEMS else ["float32"]):
            out += [(p, dt, op) for op in ops]
    # longest first: float64 and the big problems' backward kernels
    return sorted(out, key=lambda j: (j[1] != "float64", "bwd" not in j[2], j[0]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--problems", help="comma-separated (default: every generated/ module)")
    p.add_argument("--dtypes", help="comma-separated (default: float32, and float64 for " + ", ".join(FLOAT64_PROBLEMS) + ")")
    p.add_argument("--no-conv", action="store_true", help="only the plain tensor product's kernels")
    p.add_argument("--conv-only", action="store_true", help="only the fused convolution's kernels")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per job")
    p.add_argument("--generated", type=Path, default=ROOT / "generated", help="generated directory (default: generated)")
    p.add_argument("--job", nargs=3, metavar=("PROBLEM", "DTYPE", "OP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        run_job(*args.job, generated=args.generated)
        return 0
    problems = args.problems.split(",") if args.problems else sorted(d.name for d in args.generated.iterdir() if d.is_dir())
    todo = jobs(problems, args.dtypes.split(",") if args.dtypes else None, not args.no_conv, args.generated)
    if args.conv_only:
        todo = [j for j in todo if j[2].startswith("conv_")]
    t0 = time.perf_counter()

    def one(job):
        t = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, __file__, "--generated", str(args.generated), "--job", *job],
                               capture_output=True, text=True, timeout=args.timeout)
            ok = r.returncode == 0
            why = "" if ok else (r.stderr.strip().splitlines() or ["?"])[-1][:200]
        except subprocess.TimeoutExpired:
            ok, why = False, f"timeout {args.timeout:.0f} s"
        return job, ok, why, time.perf_counter() - t

    failed = 0
    with cf.ThreadPoolExecutor(args.workers) as pool:
        for job, ok, why, dt in pool.map(one, todo):
            failed += not ok
            print(f"[{time.perf_counter() - t0:6.1f}s] {'/'.join(job):40s} {dt:6.1f}s {'ok' if ok else 'FAILED: ' + why}", flush=True)
    print(f"precompile: {len(todo)} jobs, {failed} failed, {time.perf_counter() - t0:.0f} s on {args.workers} workers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
