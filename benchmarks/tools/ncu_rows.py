#!/usr/bin/env python3
"""Why a benchmark row is slow: Nsight Compute metrics of each implementation of a row.

    python3 benchmarks/tools/ncu_rows.py --cases mace_large:float64:fwd+bwd:eqdsl_torch,cueq_irmul [--conv GRAPH]
        [--ncu ncu] [--batch 20000]

For every case ``problem:dtype:direction:impl[,impl...]`` and each implementation, a child
process builds the implementation exactly as ``bench_tp.py`` (or, with ``--conv GRAPH``,
``bench_conv.py`` on that graph) does, calls the direction three times (compiles, warms), then
once between ``cudaProfilerStart``/``Stop`` under ``ncu --profile-from-start off``. Per
implementation it prints the kernels launched in that call and, summed or worst over them:
GPU time, DRAM bytes read + written (set against the bytes the pass must move: the
benchmarks' floor), registers per thread, achieved occupancy, local-memory (spill) loads and
stores, and grid size. Inputs are random; only shapes and dtypes matter here. GPU only.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
METRICS = ("gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,"
           "sm__warps_active.avg.pct_of_peak_sustained_active,smsp__sass_inst_executed_op_local_ld.sum,"
           "smsp__sass_inst_executed_op_local_st.sum,launch__grid_size,launch__block_size")


def child(case: str, impl_name: str, conv: str | None, batch: int) -> None:
    """Build, warm, then run the case once inside the profiled range."""
    sys.path.insert(0, str(BENCH.parent))  # the repository root: the suite is the package benchmarks
    from benchmarks import bench_conv as bc
    import torch

    bt = bc.bt  # the bench_tp module bench_conv itself uses (one copy of its classes)

    problem, dtype, direction = case.split(":")
    args = bt.parse_args(["--problems", problem])
    if conv:
        cargs = bc.parse_args(["--problems", problem, "--graphs", conv])
        graphs = {g.label: g for g in bc.build_graphs(cargs, True)}
        graph = graphs[conv]
        prob = bt.load_problems(args, print)[0]
        impl = bc.Builders(cargs, torch.device("cuda")).build(impl_name, prob, dtype, graph)[0]
        n_rows, n_in = graph.num_edges, graph.num_nodes
    else:
        prob = bt.load_problems(args, print)[0]
        device = torch.device("cuda")
        if impl_name.startswith("cueq"):
            impl = next(i for i, _ in bt.build_cueq_candidates(prob, dtype, device, args, irmul=impl_name == "cueq_irmul")
                        if i is not None)
        else:
            impl = bt.BUILDERS[impl_name](prob, dtype, device, args)
        n_rows = n_in = batch
    ir = prob.ir
    if dtype == "float64" and impl.framework == "jax":
        bt.enable_x64()
    tdt = getattr(torch, dtype)
    x1 = torch.randn(n_in, ir.dim_in1, dtype=tdt, device="cuda")
    x2 = torch.randn(n_rows, ir.dim_in2, dtype=tdt, device="cuda")
    w = torch.randn(*(() if prob.shared else (n_rows,)), ir.weight_numel, dtype=tdt, device="cuda")
    g = torch.randn(n_in if conv else n_rows, ir.dim_out, dtype=tdt, device="cuda")
    fb = direction == "fwd+bwd"
    if impl.framework == "jax":
        jax = bt.import_jax()
        a = [bt.to_jax(t) for t in (x1, x2, w, g)]

        def call():
            out = impl.fb(*a) if fb else impl.fwd(*a[:3])
            jax.block_until_ready(out)
    else:
        leaves = [t.requires_grad_(fb) for t in (x1, x2, w)]

        def call():
            if fb:
                impl.fb(*leaves, g)
            else:
                with torch.no_grad():
                    impl.fwd(*leaves)
            torch.cuda.synchronize()
    for _ in range(3):
        call()
    torch.cuda.profiler.start()
    call()
    torch.cuda.profiler.stop()
    print(f"NCU_NOTE {impl.note}", flush=True)


def summarize(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))[1:]  # the first row holds the units

    def num(r, k):
        try:
            return float(str(r.get(k, "nan")).replace(",", ""))
        except ValueError:
            return float("nan")

    kernels = [{"name": r.get("Kernel Name", "?")[:60], "us": num(r, "gpu__time_duration.sum") / 1e3,
                "MB": (num(r, "dram__bytes_read.sum") + num(r, "dram__bytes_write.sum")) / 1e6,
                "regs": num(r, "launch__registers_per_thread"),
                "occ": num(r, "sm__warps_active.avg.pct_of_peak_sustained_active"),
                "local": num(r, "smsp__sass_inst_executed_op_local_ld.sum") + num(r, "smsp__sass_inst_executed_op_local_st.sum"),
                "grid": num(r, "launch__grid_size"), "block": num(r, "launch__block_size")} for r in rows]
    return {"kernels": kernels, "us": sum(k["us"] for k in kernels), "MB": sum(k["MB"] for k in kernels)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", help="problem:dtype:direction:impl[,impl...] (required)")
    ap.add_argument("--conv", default=None, help="a bench_conv.py graph (rand512x64, bulk, rand4096x32)")
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.conv, args.batch)
        return 0
    if not args.cases:
        ap.error("--cases is required")
    results = []
    for spec in args.cases:
        *head, impls = spec.split(":")
        case = ":".join(head)
        for impl in impls.split(","):
            cmd = [args.ncu, "--profile-from-start", "off", "--metrics", METRICS, "--csv", "--page", "raw",
                   sys.executable, str(Path(__file__).resolve()), "--child", case, impl, "--batch", str(args.batch)]
            cmd += ["--conv", args.conv] if args.conv else []
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
            res = {"case": case, "impl": impl, "conv": args.conv, "rc": p.returncode}
            if p.returncode:
                res["error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
            else:
                res.update(summarize(p.stdout))
                res["note"] = next((ln[9:] for ln in p.stdout.splitlines() if ln.startswith("NCU_NOTE ")), "")
            results.append(res)
            head_line = f"{case} {impl}" + (f" on {args.conv}" if args.conv else "")
            if "error" in res:
                print(f"{head_line}: FAILED {res['error']}", flush=True)
                continue
            print(f"{head_line}: {res['us']:.0f} us in {len(res['kernels'])} kernels, DRAM {res['MB']:.0f} MB ({res['note']})")
            for k in res["kernels"]:
                print(f"    {k['us']:8.1f} us  {k['MB']:7.1f} MB  regs {k['regs']:.0f}  occupancy {k['occ']:.0f}%  "
                      f"local {k['local']:.0f}  grid {k['grid']:.0f}x{k['block']:.0f}  {k['name']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
