#!/usr/bin/env python3
"""Per-call host overhead of the generated PyTorch entry points in eager mode (target: <= 25 us).

On a GPU (one device call)::

    python3 benchmarks/host_overhead.py --problems mace_large,nequip_water

For each problem, float32: ``tensor_product`` at a tiny batch (``--batch``, default 16)
and ``conv`` on a ~512-edge random graph (``--edges``, ``--nodes``), each

  * no grad: the forward alone;
  * grad: the forward with edge_attr/x2 and weights requiring grad (what a force model
    records), and forward + ``torch.autograd.grad`` of both (one backward);

through three paths: ``fast`` (the eager fast path: no custom-op dispatch,
``eqdsl.runtime.torch_runtime.eager_mode``), ``custom_op`` (fast path off: the
``torch.library`` ops, still with the direct Triton launch) and ``helion`` (both off:
custom ops and Helion's own launch, the code before either existed). Columns: ``host``:
``--calls`` calls back to back with no synchronization inside, host seconds per call
(``time.perf_counter``); ``pipelined``: the same loop until ``torch.cuda.synchronize``
returns, per call (device-bound when above host); ``sync``: median wall time of one
call followed by a synchronize. e3nn (``o3.TensorProduct`` from the package metadata)
and cuEquivariance (``ChannelWiseTensorProduct``, uvu problems) get the same columns when
importable (skipped with the reason otherwise; their results are not compared here:
benchmarks/bench_tp.py does that). Then a ``time.perf_counter`` breakdown of one fast
call into its parts, and whether every kernel launch was replayed (``HelionLaunch``
plans; ``raw``: Triton's C launch called directly). The fast and custom-op results are
compared (bitwise for tensor_product; conv scatters with atomics: allclose). First, this
host's floor: ``torch.empty_like`` and ``x + 1`` (one ATen launch) on a small tensor.

Without a GPU, ``--stub`` times the same Python on CPU tensors with Triton's launch
replaced by a no-op stand-in (Helion's host code is real: generated once on the CPU,
10-20 s per kernel, cached under ``$EQDSL_CACHE_DIR``); the fast path is told that CPU is
its device; the ``helion`` path is left out (it would run the kernels in Triton's
interpreter). Prints a table; JSON in ``$OUT/host_overhead.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=None, help="default: mace_large,nequip_water (GPU), nequip_water (--stub)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--edges", type=int, default=512)
    ap.add_argument("--nodes", type=int, default=None, help="default: 64 (GPU), 32 (--stub: CPU allocations stay small)")
    ap.add_argument("--calls", type=int, default=None, help="calls per timing loop (default 1000 GPU, 2000 --stub)")
    ap.add_argument("--reps", type=int, default=5, help="timing loops per row (the minimum is reported)")
    ap.add_argument("--stub", action="store_true", help="CPU: Triton's launch is a no-op stand-in")
    ap.add_argument("--no-compare", action="store_true", help="skip e3nn and cuEquivariance")
    ap.add_argument("--floor-only", action="store_true", help="only this host's floor (no problem is compiled)")
    return ap.parse_args(argv)


# ---------------------------------------------------------------- CPU stand-ins (--stub)


class _StubCompiled:
    """A compiled Triton kernel whose launch does nothing."""

    function = None
    packed_metadata = None

    def run(self, *args):
        return None


def _stub_launcher(triton_kernel, grid, *args, num_warps, num_stages, **kwargs):
    return _StubCompiled()


def install_stub(torch, modules, rt):
    from triton.knobs import HookChain

    class Runtime:
        def __init__(self):
            self.launch_enter_hook = HookChain()
            self.launch_exit_hook = HookChain(reversed=True)

    triton = (Runtime(), lambda device: 0, _stub_launcher)
    for mod in modules:
        for launch in vars(mod._k).values():
            launch.fast_device_type = "cpu"
            launch.current_device = lambda: 0
            launch._triton = triton
    rt.EAGER.device_type = "cpu"


# ---------------------------------------------------------------- timing


class Clock:
    def __init__(self, torch, calls, reps, gpu):
        self.torch, self.calls, self.reps, self.gpu = torch, calls, reps, gpu

    def sync(self):
        if self.gpu:
            self.torch.cuda.synchronize()

    def host_and_pipelined(self, fn) -> tuple[float, float]:
        """(host us per call, us per call until the device is done), minimum over reps."""
        for _ in range(20):
            fn()
        self.sync()
        hosts, pipes = [], []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            for _ in range(self.calls):
                fn()
            t1 = time.perf_counter()
            self.sync()
            t2 = time.perf_counter()
            hosts.append((t1 - t0) / self.calls * 1e6)
            pipes.append((t2 - t0) / self.calls * 1e6)
        return min(hosts), min(pipes)

    def synchronized(self, fn, n=200) -> float:
        """Median wall us of one call then a synchronize."""
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    def part(self, fn) -> float:
        """Host us per call of one part (minimum over reps)."""
        return self.host_and_pipelined(fn)[0]


class Paths:
    """Switch between the fast path, the custom ops, and Helion's own launch."""

    def __init__(self, rt, modules):
        self.rt, self.launches = rt, [l for m in modules for l in vars(m._k).values()]

    def set(self, path: str):
        self.rt.EAGER.enabled = path == "fast"
        for launch in self.launches:
            launch.enabled = path != "helion"


# ---------------------------------------------------------------- the cases


def tp_cases(torch, ops, batch, device):
    f32 = torch.float32
    x1 = torch.randn(batch, ops.DIM_IN1, device=device, dtype=f32)
    x2 = torch.randn(batch, ops.DIM_IN2, device=device, dtype=f32)
    w = torch.randn(*(() if ops.SHARED_WEIGHTS else (batch,)), ops.WEIGHT_NUMEL, device=device, dtype=f32)
    x2g, wg = x2.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(batch, ops.DIM_OUT, device=device, dtype=f32)
    cases = {
        "no grad": lambda: ops.tensor_product(x1, x2, w),
        "grad: fwd": lambda: ops.tensor_product(x1, x2g, wg),
        "grad: fwd+bwd": lambda: torch.autograd.grad(ops.tensor_product(x1, x2g, wg), (x2g, wg), g),
    }
    return cases, (x1, x2, w)


def conv_cases(torch, cv, edges, nodes, device):
    f32 = torch.float32
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (edges,), generator=gen).to(device)
    dst = torch.randint(0, nodes, (edges,), generator=gen).to(device)
    x = torch.randn(nodes, cv.DIM_IN1, device=device, dtype=f32)
    y = torch.randn(edges, cv.DIM_IN2, device=device, dtype=f32)
    w = torch.randn(*(() if cv.SHARED_WEIGHTS else (edges,)), cv.WEIGHT_NUMEL, device=device, dtype=f32)
    yg, wg = y.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(nodes, cv.DIM_OUT, device=device, dtype=f32)
    # check=False: the index range check reads its result on the host (a device sync)
    cases = {
        "no grad": lambda: cv.conv(x, y, w, src, dst, nodes, check=False),
        "grad: fwd": lambda: cv.conv(x, yg, wg, src, dst, nodes, check=False),
        "grad: fwd+bwd": lambda: torch.autograd.grad(cv.conv(x, yg, wg, src, dst, nodes, check=False), (yg, wg), g),
        "no grad, check=True": lambda: cv.conv(x, y, w, src, dst, nodes),
    }
    return cases, (x, y, w, src, dst, nodes)


def e3nn_cases(torch, pkg, batch, device):
    from e3nn import o3

    m = o3.TensorProduct(pkg.IRREPS_IN1, pkg.IRREPS_IN2, pkg.IRREPS_OUT, [tuple(i) for i in pkg.INSTRUCTIONS],
                         irrep_normalization=pkg.IRREP_NORMALIZATION, path_normalization=pkg.PATH_NORMALIZATION,
                         internal_weights=False, shared_weights=pkg.SHARED_WEIGHTS).to(device)
    return _module_cases(torch, m, pkg, batch, device)


def cueq_cases(torch, pkg, batch, device):
    import cuequivariance as cue
    import cuequivariance_torch as cuet

    if {i[3] for i in pkg.INSTRUCTIONS} != {"uvu"}:
        raise RuntimeError("not a uvu problem")
    layout = cue.ir_mul if pkg.LAYOUT == "ir_mul" else cue.mul_ir
    i1, i2 = cue.Irreps("O3", pkg.IRREPS_IN1), cue.Irreps("O3", pkg.IRREPS_IN2)
    filt = sorted({ir for _, ir in cue.Irreps("O3", pkg.IRREPS_OUT)}, key=str)
    m = cuet.ChannelWiseTensorProduct(i1, i2, filt, layout=layout, shared_weights=pkg.SHARED_WEIGHTS,
                                      internal_weights=False, device=device, dtype=torch.float32)
    return _module_cases(torch, m, pkg, batch, device)


def _module_cases(torch, m, pkg, batch, device):
    f32 = torch.float32
    x1 = torch.randn(batch, pkg.DIM_IN1, device=device, dtype=f32)
    x2 = torch.randn(batch, pkg.DIM_IN2, device=device, dtype=f32)
    shape = (1, m.weight_numel) if pkg.SHARED_WEIGHTS else (batch, m.weight_numel)
    w = torch.randn(*shape, device=device, dtype=f32)
    x2g, wg = x2.clone().requires_grad_(), w.clone().requires_grad_()
    out = m(x1, x2, w)
    g = torch.randn(out.shape, device=device, dtype=f32)
    return {
        "no grad": lambda: m(x1, x2, w),
        "grad: fwd": lambda: m(x1, x2g, wg),
        "grad: fwd+bwd": lambda: torch.autograd.grad(m(x1, x2g, wg), (x2g, wg), g),
    }


def tp_breakdown(torch, rt, ops, args, clock) -> dict:
    x1, x2, w = args
    out = x1.new_empty((x1.shape[0], ops.DIM_OUT))
    x2g = x2.clone().requires_grad_()
    with torch.no_grad():
        parts = {
            "eager_mode": lambda: rt.eager_mode((x1, x2, w), 3),
            "_check (uncached)": lambda: ops._check(x1, x2, w),
            "_checked (cached)": lambda: ops._checked(x1, x2, w),
            "new_empty": lambda: x1.new_empty((x1.shape[0], ops.DIM_OUT)),
            "_launch_fwd (HelionLaunch)": lambda: ops._launch_fwd(x1, x2, w, out),
            "_fwd_checked (alloc + launch)": lambda: ops._fwd_checked(x1, x2, w),
            "_fwd (op checks + alloc + launch)": lambda: ops._fwd(x1, x2, w),
            "fwd_op (custom op)": lambda: ops.fwd_op(x1, x2, w),
        }
        res = {k: clock.part(f) for k, f in parts.items()}
    res["Function.apply (grad needed)"] = clock.part(lambda: ops._fwd_eager.function.apply(x1, x2g, w))
    res["fwd_op (custom op, grad needed)"] = clock.part(lambda: ops.fwd_op(x1, x2g, w))
    return res


def conv_breakdown(torch, rt, cv, args, clock) -> dict:
    x, y, w, src, dst, n = args
    graph = cv.graph_tensors(src, dst, n)
    xi = cv._IN1.to_ir_mul(x) if hasattr(cv, "_IN1") else x
    with torch.no_grad():
        parts = {
            "eager_mode": lambda: rt.eager_mode((x, y, w, src, dst), 3),
            "_check (uncached)": lambda: cv._check(x, y, w, src, dst, n),
            "_checked (cached)": lambda: cv._checked(x, y, w, src, dst, n),
            "_check_range (sync)": lambda: cv._check_range(src, dst, n),
            "graph_tensors": lambda: cv.graph_tensors(src, dst, n),
            "_conv_fwd (alloc + launch)": lambda: cv._conv_fwd(xi, y, w, *graph, n),
            "conv_fwd_op (custom op)": lambda: cv.conv_fwd_op(xi, y, w, *graph, n),
        }
        if hasattr(cv, "_IN1"):
            parts["_IN1 permutation (direct)"] = lambda: cv._IN1.to_ir_mul(x, rt.DIRECT)
            parts["_IN1 permutation (custom op)"] = lambda: cv._IN1.to_ir_mul(x, rt.CUSTOM_OP)
        return {k: clock.part(f) for k, f in parts.items()}


def replay_state(mod) -> dict:
    """Per HelionLaunch: how many replay plans it holds and what they call
    (``builtin_function_or_method``: Triton's C launch directly; ``CudaLauncher``: its __call__)."""
    out = {}
    for name, launch in vars(mod._k).items():
        plans = list(launch._plans.values())
        kinds = sorted({type(p[0]).__name__ for p in plans})
        out[name] = f"{len(plans)} plans ({', '.join(kinds)})" if plans else "no plan: host function every call"
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stub:
        os.environ["TRITON_INTERPRET"] = "1"  # the ops' device check admits CPU tensors
        os.environ.setdefault("EQDSL_CACHE_DIR", str(Path.home() / ".cache" / "eqdsl-stub"))
    import torch

    gpu = not args.stub
    if gpu and not torch.cuda.is_available():
        print("no CUDA device: run with --stub on CPU")
        return 2
    if args.stub:
        torch.cuda.get_device_capability = lambda device=None: (0, 0)  # the disk cache's key
    device = "cuda" if gpu else "cpu"
    problems = (args.problems or ("mace_large,nequip_water" if gpu else "nequip_water")).split(",")
    nodes = args.nodes or (64 if gpu else 32)
    calls = args.calls or (1000 if gpu else 2000)
    clock = Clock(torch, calls, args.reps, gpu)
    from eqdsl.runtime import torch_runtime as rt

    print(f"device {torch.cuda.get_device_name() if gpu else 'CPU (launch stubbed)'}, torch {torch.__version__}, "
          f"float32, tensor_product batch {args.batch}, conv {args.edges} edges / {nodes} nodes, {calls} calls x {args.reps}")
    results = {"device": device, "stub": args.stub, "rows": [], "breakdown": {}, "replay": {}, "skipped": {}}
    rows = [("problem", "op", "case", "impl", "host us", "pipelined us", "sync us")]
    # this host's floor: what the cheapest eager torch calls cost (one allocation; one
    # allocation and one ATen kernel launch), the unit the targets are met in
    t = torch.zeros(args.batch, 1152, device=device)
    for case, fn in (("empty_like", lambda: torch.empty_like(t)), ("x + 1", lambda: t + 1)):
        host, pipe = clock.host_and_pipelined(fn)
        sync = clock.synchronized(fn) if gpu else float("nan")
        rows.append(("-", "floor", case, "torch", f"{host:.1f}", f"{pipe:.1f}", f"{sync:.1f}"))
        results["rows"].append(dict(zip(("problem", "op", "case", "impl", "host_us", "pipelined_us", "sync_us"),
                                        ("-", "floor", case, "torch", host, pipe, sync))))
        print("  ".join(rows[-1]), flush=True)
    if args.floor_only:
        problems = []
    for name in problems:
        pkg = importlib.import_module(f"generated.{name}")
        ops = importlib.import_module(f"generated.{name}.torch_ops")
        cv = importlib.import_module(f"generated.{name}.torch_conv")
        if args.stub:
            install_stub(torch, (ops, cv), rt)
        paths = Paths(rt, (ops, cv))
        for op, (cases, op_args) in (
            ("tensor_product", tp_cases(torch, ops, args.batch, device)),
            ("conv", conv_cases(torch, cv, args.edges, nodes, device)),
        ):
            # fast against custom ops, same inputs (not meaningful with a stubbed launch)
            if gpu:
                f = cases["no grad"]
                paths.set("custom_op")
                want = f()
                paths.set("fast")
                got = f()
                same = torch.equal(got, want) if op == "tensor_product" else torch.allclose(got, want, rtol=1e-5, atol=1e-5)
                print(f"{name} {op}: fast path result {'equals' if same else 'DIFFERS FROM'} the custom ops'")
                results.setdefault("same", {})[f"{name}.{op}"] = bool(same)
            # (--stub: Helion's own launch would run the kernel in Triton's interpreter)
            for path in ("fast", "custom_op") if args.stub else ("fast", "custom_op", "helion"):
                paths.set(path)
                for case, fn in cases.items():
                    if args.stub and "check=True" in case and path != "fast":
                        continue
                    host, pipe = clock.host_and_pipelined(fn)
                    sync = clock.synchronized(fn) if gpu else float("nan")
                    rows.append((name, op, case, f"eqdsl {path}", f"{host:.1f}", f"{pipe:.1f}", f"{sync:.1f}"))
                    results["rows"].append(dict(zip(("problem", "op", "case", "impl", "host_us", "pipelined_us", "sync_us"),
                                                    (name, op, case, f"eqdsl {path}", host, pipe, sync))))
                    print("  ".join(rows[-1]), flush=True)
            paths.set("fast")
            bd = (tp_breakdown if op == "tensor_product" else conv_breakdown)(torch, rt, ops if op == "tensor_product" else cv, op_args, clock)
            results["breakdown"][f"{name}.{op}"] = bd
        results["replay"][name] = {**replay_state(ops), **replay_state(cv)}
        if not args.no_compare:
            for impl, build in (("e3nn", e3nn_cases), ("cueq", cueq_cases)):
                try:
                    cases = build(torch, pkg, args.batch, device)
                except Exception as e:  # noqa: BLE001  (not installed, not supported: skip, say why)
                    results["skipped"][f"{name}.{impl}"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    print(f"{name} {impl}: skipped ({results['skipped'][f'{name}.{impl}']})")
                    continue
                for case, fn in cases.items():
                    host, pipe = clock.host_and_pipelined(fn)
                    sync = clock.synchronized(fn) if gpu else float("nan")
                    rows.append((name, "tensor_product", case, impl, f"{host:.1f}", f"{pipe:.1f}", f"{sync:.1f}"))
                    results["rows"].append(dict(zip(("problem", "op", "case", "impl", "host_us", "pipelined_us", "sync_us"),
                                                    (name, "tensor_product", case, impl, host, pipe, sync))))
                    print("  ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(wd) if i < 4 else c.rjust(wd) for i, (c, wd) in enumerate(zip(r, widths))))
    for key, bd in results["breakdown"].items():
        print(f"\nbreakdown of one fast call, {key} (host us per part, perf_counter):")
        for part, us in bd.items():
            print(f"  {part:40s} {us:7.2f}")
    for name, state in results["replay"].items():
        print(f"\nlaunch replay, {name}: " + "; ".join(f"{k}: {v}" for k, v in state.items()))
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "host_overhead.json"
        path.write_text(json.dumps(results, indent=1, default=str))
        print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
