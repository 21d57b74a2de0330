#!/usr/bin/env python3
"""Host microseconds of each layer of one eager torch call, from the floor up (GPU only).

``profile_small.py`` shows that on small inputs an eager ``tensor_product`` / ``conv`` call
is host-bound; cProfile cannot say where the backward's time goes (torch's autograd
engine runs CUDA backward functions on its own device thread). This script times each
layer alone, for one problem at ``--batch`` rows and on bench_conv's small-graph latency
graph (32 atoms, 512 edges), float32:

    floor            x + 1; torch.empty; index_select of a (rows, dim) tensor
    engine           autograd.grad through a trivial torch.autograd.Function (engine floor),
                     with autograd's device threads on and off (set_multithreading_enabled)
    launch           one Triton launch of the forward kernel (``_launch_fwd``: the shipped
                     host function + ``JITFunction.run``), outputs preallocated
    op               the forward operator (``torch.ops.<ns>.fwd``), no grad
    entry            ``tensor_product`` / ``conv``, no grad; then with inputs requiring grad
    fwd+bwd          entry + ``autograd.grad`` of all three inputs (as bench_conv's latency),
                     threads on and off
    bwd op           the fused backward operator alone

Each number: ``--calls`` calls back to back, a synchronize every 50 calls (so that the
launch queue never fills and throttles the host to the device), host time / calls, the
median of ``--reps`` loops. ::

    python3 benchmarks/tools/host_breakdown.py --problem mace_large
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import bench_conv as bc  # noqa: E402
from benchmarks import bench_tp as bt  # noqa: E402


def host_us(fn, calls: int, reps: int) -> float:
    """Median over ``reps`` of host microseconds per call of ``calls`` calls (sync every 50)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        total = 0.0
        done = 0
        while done < calls:
            n = min(50, calls - done)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total += time.perf_counter() - t0
            torch.cuda.synchronize()
            done += n
        out.append(total * 1e6 / calls)
    return statistics.median(out)


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _threads(enabled: bool):
    return torch.autograd.set_multithreading_enabled(enabled)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="mace_large")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    args = ap.parse_args()
    rows: list[tuple[str, float]] = []

    def row(label, fn):
        us = host_us(fn, args.calls, args.reps)
        rows.append((label, us))
        print(f"{us:9.1f} us  {label}", flush=True)

    dev = "cuda"
    small = torch.randn(16, 16, device=dev)
    row("floor: x + 1", lambda: small + 1)
    row("floor: torch.empty((16, 1152))", lambda: torch.empty((16, 1152), device=dev))
    wide = torch.randn(32, 1152, device=dev)
    perm = torch.randperm(1152, device=dev)
    row("floor: index_select (32, 1152)", lambda: torch.index_select(wide, 1, perm))
    leaf = torch.randn(16, 16, device=dev, requires_grad=True)
    for on in (True, False):
        with _threads(on):
            row(f"engine: grad through one autograd.Function (threads {'on' if on else 'off'})",
                lambda: torch.autograd.grad(_Scale.apply(leaf), leaf, small))

    tp = bt.import_generated(args.generated, args.problem, "torch_ops")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=gen)

    w_shape = (tp.WEIGHT_NUMEL,) if tp.SHARED_WEIGHTS else (args.batch, tp.WEIGHT_NUMEL)
    x1, x2, w = rnd(args.batch, tp.DIM_IN1), rnd(args.batch, tp.DIM_IN2), rnd(*w_shape)
    out = torch.empty(args.batch, tp.DIM_OUT, device=dev)
    ns = getattr(torch.ops, f"eqdsl_{args.problem}")
    row("tp launch: _launch_fwd (host function + JITFunction.run)", lambda: tp._launch_fwd(x1, x2, w, out))
    row("tp op: torch.ops.<ns>.fwd, no grad", lambda: ns.fwd(x1, x2, w))
    with torch.no_grad():
        row("tp entry: tensor_product, no grad", lambda: tp.tensor_product(x1, x2, w))
    g1, g2, gw = (t.clone().requires_grad_() for t in (x1, x2, w))
    row("tp entry: tensor_product, inputs need grad", lambda: tp.tensor_product(g1, g2, gw))
    cot = torch.ones(args.batch, tp.DIM_OUT, device=dev)
    for on in (True, False):
        with _threads(on):
            row(f"tp fwd+bwd: tensor_product + autograd.grad (threads {'on' if on else 'off'})",
                lambda: torch.autograd.grad(tp.tensor_product(g1, g2, gw), (g1, g2, gw), cot))
    if hasattr(ns, "bwd"):
        row("tp bwd op: torch.ops.<ns>.bwd (fused backward), no grad", lambda: ns.bwd(x1, x2, w, cot))

    if getattr(tp, "conv", None) is not None:
        graph = bc.latency_graph()
        src = torch.as_tensor(graph.src, device=dev)
        dst = torch.as_tensor(graph.dst, device=dev)
        n, e = graph.num_nodes, graph.num_edges
        cw_shape = (tp.WEIGHT_NUMEL,) if tp.SHARED_WEIGHTS else (e, tp.WEIGHT_NUMEL)
        cx, cy, cw = rnd(n, tp.DIM_IN1), rnd(e, tp.DIM_IN2), rnd(*cw_shape)
        conv = tp.conv
        with torch.no_grad():
            row(f"conv entry: conv, no grad ({e} edges)", lambda: conv(cx, cy, cw, src, dst, n, check=False))
        h1, h2, hw = (t.clone().requires_grad_() for t in (cx, cy, cw))
        ccot = torch.ones(n, tp.DIM_OUT, device=dev)
        for on in (True, False):
            with _threads(on):
                row(f"conv fwd+bwd: conv + autograd.grad (threads {'on' if on else 'off'})",
                    lambda: torch.autograd.grad(conv(h1, h2, hw, src, dst, n, check=False), (h1, h2, hw), ccot))
    print(f"\n{torch.cuda.get_device_name()}, {args.problem}, batch {args.batch}, torch {torch.__version__}: "
          f"host us per call (median of {args.reps} x {args.calls} calls, sync every 50)")
    for label, us in rows:
        print(f"| {label} | {us:.1f} |")


if __name__ == "__main__":
    main()
