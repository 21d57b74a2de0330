#!/usr/bin/env python3
"""Where the time of one small call goes: device kernels against host time (torch: GPU only).

For each problem, the eager torch ``tensor_product`` at ``--batch`` rows and the ``conv``
on bench_conv's small-graph latency graph (32 Si atoms, 512 edges), forward and
forward+backward, each run ``--calls`` times under ``torch.profiler``: per kernel, the
launches per call and the mean device microseconds per call; then the summed kernel time
per call against the host time per call of the same loop without the profiler. When
the host time is well above the kernel sum, Python and launches decide the latency;
when they are close, the kernels do. ``--jax`` adds the jitted JAX ops (``jax_ops``) on the
same inputs: host microseconds per call of ``--calls`` calls dispatched back to back, and
per call until ``block_until_ready`` returns (pipelined); JAX dispatch is asynchronous,
so host well below pipelined means the device decides; its kernels are listed as the
torch ones are (``torch.profiler``'s CUPTI records every kernel of the process).
``--jax-only`` first prints the host time of the cheapest jitted calls (``x + 1``, a
one-kernel Pallas copy): the dispatch floor of any jitted op on this host. ::

    python3 benchmarks/tools/profile_small.py --problems mace_large,nequip_water --jax
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import bench_conv as bc  # noqa: E402
from benchmarks import bench_tp as bt  # noqa: E402


def _inputs(mod, rows_in1, rows_edge, shared):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows_in1, mod.DIM_IN1, device="cuda", generator=gen)
    y = torch.randn(rows_edge, mod.DIM_IN2, device="cuda", generator=gen)
    w = torch.randn(*((mod.WEIGHT_NUMEL,) if shared else (rows_edge, mod.WEIGHT_NUMEL)), device="cuda", generator=gen)
    return x, y, w


def _profile(fn, calls: int):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    pipelined = (time.perf_counter() - t0) * 1e6 / calls
    return host, pipelined, _device_kernels(fn, calls, lambda out: torch.cuda.synchronize())


def _device_kernels(fn, calls: int, sync) -> dict:
    """``{kernel name: (launches per call, device us per call)}`` of ``calls`` calls of ``fn``
    under ``torch.profiler`` (CUPTI records every kernel of the process, JAX's too)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        out = None
        for _ in range(calls):
            out = fn()
        sync(out)
    kern = defaultdict(lambda: [0, 0.0])
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kern[e.key[:70]]
            k[0] += e.count
            k[1] += e.self_device_time_total
    return {n: (c / calls, t / calls) for n, (c, t) in kern.items()}


def _print_kernels(kern: dict, top: int = 12) -> None:
    for k, (cnt, t) in sorted(kern.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t:9.1f} us  x{cnt:4.1f}  {k}")


def _cprofile(fn, calls: int, top: int) -> None:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-6000:])


def _jax_rows(name: str, generated: str, batch: int, graph, calls: int) -> None:
    """Host and pipelined microseconds per call of the jitted forward and forward+VJP of
    ``tensor_product`` (``batch`` rows) and ``conv`` (``graph``), float32."""
    import jax
    import numpy as np

    mod = bt.import_generated(generated, name, "jax_ops")
    rng = np.random.default_rng(0)

    def arrays(rows_in1, rows_edge):
        w = (mod.WEIGHT_NUMEL,) if mod.SHARED_WEIGHTS else (rows_edge, mod.WEIGHT_NUMEL)
        return [jax.device_put(rng.standard_normal(shape).astype(np.float32))
                for shape in ((rows_in1, mod.DIM_IN1), (rows_edge, mod.DIM_IN2), w)]

    cases = [("tensor_product", mod.tensor_product, arrays(batch, batch), batch)]
    if hasattr(mod, "conv"):
        s, d, n = jax.device_put(graph.src.astype(np.int32)), jax.device_put(graph.dst.astype(np.int32)), graph.num_nodes
        cases.append(("conv", lambda a, b, c: mod.conv(a, b, c, s, d, n, check=False), arrays(n, graph.num_edges), n))
    for op, f, (a, b, c), rows in cases:
        g = jax.device_put(rng.standard_normal((rows, mod.DIM_OUT)).astype(np.float32))
        fwd = jax.jit(f)
        def fb(a, b, c, g, f=f):
            out, vjp = jax.vjp(f, a, b, c)
            return out, vjp(g)  # the output too: XLA would drop an unused forward kernel

        fwd_bwd = jax.jit(fb)
        for direction, fn in (("fwd", lambda: fwd(a, b, c)), ("fwd+bwd", lambda: fwd_bwd(a, b, c, g))):
            for _ in range(5):
                jax.block_until_ready(fn())
            t0 = time.perf_counter()
            for _ in range(calls):
                out = fn()
            host = (time.perf_counter() - t0) * 1e6 / calls
            jax.block_until_ready(out)
            pipelined = (time.perf_counter() - t0) * 1e6 / calls
            kern = _device_kernels(fn, calls, jax.block_until_ready) if torch.cuda.is_available() else {}
            total = sum(t for _, t in kern.values())
            print(f"{name} {op} {direction} (jax.jit): host {host:.1f} us/call, pipelined {pipelined:.1f}, "
                  f"kernels {total:.1f} us/call in {sum(c for c, _ in kern.values()):.0f} launches", flush=True)
            _print_kernels(kern)


def _jax_floor(calls: int) -> None:
    """Host microseconds per call of the cheapest jitted calls on this host: ``x + 1`` (one
    XLA kernel) and a one-program Pallas copy (one Triton kernel): what any jitted op costs
    to dispatch here, whatever its kernels."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from eqdsl.runtime.jax import launch as rt

    x = jnp.zeros((16, 128), jnp.float32)

    def copy_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    interpret = rt.use_interpret(None)
    copy = pl.pallas_call(copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)
    for label, fn in (("jit(x + 1)", jax.jit(lambda a: a + 1)), ("jit(pallas copy)", jax.jit(copy))):
        for _ in range(5):
            jax.block_until_ready(fn(x))
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(x)
        host = (time.perf_counter() - t0) * 1e6 / calls
        jax.block_until_ready(out)
        pipelined = (time.perf_counter() - t0) * 1e6 / calls
        print(f"floor {label}: host {host:.1f} us/call, pipelined {pipelined:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="mace_large,nequip_water")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--cprofile", type=int, default=0, help="also print the N costliest Python functions (tottime) of each case")
    ap.add_argument("--jax", action="store_true", help="also the jitted JAX ops: host and pipelined us per call")
    ap.add_argument("--jax-only", action="store_true", help="only the JAX rows (no torch kernels; any JAX backend, interpret mode on the CPU)")
    args = ap.parse_args()
    if args.jax or args.jax_only:
        import os

        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU
    if args.jax_only:
        _jax_floor(args.calls)
        for name in args.problems.split(","):
            _jax_rows(name, args.generated, args.batch, bc.latency_graph(), args.calls)
        return
    graph = bc.latency_graph()
    src = torch.as_tensor(graph.src, device="cuda")
    dst = torch.as_tensor(graph.dst, device="cuda")
    n = graph.num_nodes
    print(f"{torch.cuda.get_device_name()}; tensor_product batch {args.batch}; conv {graph.desc}, "
          f"{graph.num_edges} edges; {args.calls} calls", flush=True)
    for name in args.problems.split(","):
        mod = bt.import_generated(args.generated, name, "torch_ops")
        shared = bool(getattr(mod, "SHARED_WEIGHTS", False))
        cases = []
        x, y, w = _inputs(mod, args.batch, args.batch, shared)
        cases.append(("tensor_product", x, y, w, lambda a, b, c: mod.tensor_product(a, b, c)))
        if hasattr(mod, "conv"):
            cx, cy, cw = _inputs(mod, n, graph.num_edges, shared)
            cases.append(("conv", cx, cy, cw, lambda a, b, c: mod.conv(a, b, c, src, dst, n, check=False)))
        for op, a, b, c, f in cases:
            ag, bg, cg = (t.clone().requires_grad_() for t in (a, b, c))

            def fwd_bwd(f=f, ag=ag, bg=bg, cg=cg):
                out = f(ag, bg, cg)
                return torch.autograd.grad(out, (ag, bg, cg), torch.ones_like(out))

            for direction, fn in (("fwd", lambda f=f, a=a, b=b, c=c: f(a, b, c)), ("fwd+bwd", fwd_bwd)):
                host, pipe, kern = _profile(fn, args.calls)
                total = sum(t for _, t in kern.values())
                print(f"\n{name} {op} {direction}: host {host:.1f} us/call, pipelined {pipe:.1f}, "
                      f"kernels {total:.1f} us/call in {sum(c for c, _ in kern.values()):.0f} launches", flush=True)
                _print_kernels(kern)
                if args.cprofile:
                    _cprofile(fn, args.calls, args.cprofile)
        if args.jax:
            _jax_rows(name, args.generated, args.batch, graph, args.calls)


if __name__ == "__main__":
    main()
