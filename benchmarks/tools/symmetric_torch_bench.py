"""GPU benchmark of the generated symmetric contraction (issue 27) against mace-torch's.

Problem: MACE-MP's product basis, ``128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o``,
correlation 3, 10 elements, 3,072 nodes (6 x 512-atom cells), random inputs and weights.

For each dtype (``--dtypes``, default float32; float64 too with ``--dtypes float32,float64``) and eqdsl layout (``mul_ir``: e3nn's and MACE's rows;
``ir_mul``: cuEquivariance's):

1. generates the package (``eqdsl.symmetric.codegen.generate_symmetric``) into a temporary
   directory and imports its torch ops (Helion compiles each kernel on first use: the first
   call's seconds are printed);
2. checks, failing loudly (exit 1): the forward on all nodes against a float64 torch contraction
   of the dense U tensors (mace's ``U_matrix_real``, computed on the GPU in node chunks, never
   the IR's symmetrized terms), and ``d<out, G>/dx``, ``d<out, G>/dW`` on the first 256 nodes
   against autograd through the same dense contraction; relative max-norm error at most
   ``1e-5`` (float32, the tests' tolerance ``tests/tolerances.py``) or ``1e-10`` (float64);
3. times, median of CUDA-event pairs around each call (``--reps`` after ``--warmup``):
   ``fwd`` (the op), ``fwd+bwd`` (forward, then ``out.backward(G)`` to ``x`` and ``W``),
   with ``--forces`` also ``forces`` (``E = <out, G>``, ``F = dE/dx`` with ``create_graph``, ``|F|^2`` backward to
   ``x`` and ``W``: the second-order pass of a force-trained step).

Then the same timings for mace-torch's ``SymmetricContraction`` (e3nn implementation; input
``(nodes, 128, 16)``, one-hot elements) if ``mace`` imports, and for cuEquivariance's
``cuequivariance_torch.SymmetricContraction`` (``original_mace=True``, ``ir_mul`` in) if it
imports (a failure to build or run a baseline is printed, not fatal). Last, the memory floor:
bytes of ``x``, ``W`` and ``out`` (each read or written once) and that floor's time at 3.35 TB/s
(H100 SXM HBM3).

Run from the repository root on the GPU machine: ``python benchmarks/tools/symmetric_torch_bench.py``
(``--nodes``, ``--elements``, ``--dtypes``, ``--layouts``, ``--reps``, ``--block-b``,
``--block-c``, ``--num-warps`` to try tiles). Prints one line per measurement and, at the end, a
JSON summary line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eqdsl.symmetric.codegen import generate_symmetric  # noqa: E402
from eqdsl.symmetric.lower import lower  # noqa: E402
from eqdsl.symmetric.reference import to_channels  # noqa: E402
from eqdsl.symmetric.spec import parse_symmetric_specs  # noqa: E402
from eqdsl.symmetric.u_tensors import u_tensor_dense  # noqa: E402

DEV = torch.device("cuda")  # --smoke-cpu: the CPU, Triton's interpreter


def irreps(mul: int) -> tuple[str, str]:
    return f"{mul}x0e+{mul}x1o+{mul}x2e+{mul}x3o", f"{mul}x0e+{mul}x1o"
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
HBM_BYTES_PER_S = 3.35e12


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", flush=True)
    sys.exit(1)


def cuda_median_ms(fn, warmup: int, reps: int) -> float:
    if DEV.type == "cpu":  # --smoke-cpu: wall time, one call (checks the script, times nothing useful)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def column_index(dims, mul, layout):
    """``(sum(dims), mul)`` array: the column of (component, channel) in ``layout`` rows."""
    return torch.as_tensor(to_channels(np.arange(sum(dims) * mul)[None], dims, mul, layout)[0])


def dense_contraction(spec, x, w, elem, chunk: int = 32):
    """float64 contraction of the dense U tensors (mace's einsum order), ``layout`` rows in and out;
    differentiable (torch ops only). Node chunks bound the ``(n, c, m, i, j, l)`` intermediate."""
    mul = spec.mul
    dims_in = tuple(mi.ir.dim for mi in spec.irreps_in)
    dims_out = tuple(mi.ir.dim for mi in spec.irreps_out)
    cin = column_index(dims_in, mul, spec.layout).to(x.device)
    cout = column_index(dims_out, mul, spec.layout).to(x.device).reshape(-1)
    us = [[torch.tensor(np.array(u_tensor_dense(spec.coupling_irreps, mi.ir, nu, spec.cg_convention))).to(x.device)
           for nu in range(1, spec.correlation[o] + 1)] for o, mi in enumerate(spec.irreps_out)]
    pieces = []
    for s in range(0, x.shape[0], chunk):
        xc = x[s:s + chunk].double()[:, cin]  # (n, i, c)
        wn = w.double()[elem[s:s + chunk]]
        outs, col = [], 0
        for o in range(len(dims_out)):
            acc = 0
            for nu in range(spec.correlation[o], 0, -1):
                u = us[o][nu - 1]
                k = u.shape[-1]
                wk = wn[:, col:col + k * mul].reshape(-1, k, mul)
                col += k * mul
                t = torch.einsum("nkc,m...k->ncm...", wk, u)
                for _ in range(nu):
                    t = torch.einsum("ncm...i,nic->ncm...", t, xc)
                acc = acc + t.transpose(1, 2)
            outs.append(acc)
        yc = torch.cat(outs, dim=1).reshape(xc.shape[0], -1)
        pieces.append(yc[:, torch.argsort(cout)])
    return torch.cat(pieces)


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def rel(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def bench_eqdsl(args, layout, dtype, root, results):
    name = f"mp_{layout}_{str(dtype).removeprefix('torch.')}"
    (spec,) = parse_symmetric_specs(
        f'[[symmetric_contraction]]\nname = "{name}"\nirreps_in = "{irreps(args.mul)[0]}"\n'
        f'irreps_out = "{irreps(args.mul)[1]}"\n'
        f'correlation = 3\nnum_elements = {args.elements}\nlayout = "{layout}"\n')
    t = time.time()
    ir = lower(spec)
    blocks = {k: v for k, v in (("block_b", args.block_b), ("block_c", args.block_c),
                                 ("num_warps", args.num_warps), ("num_stages", args.num_stages)) if v}
    if args.triton:  # the package as eqdsl generate writes it: Triton code lowered on this host, no Helion at run time
        if blocks:
            fail("--triton takes the default tiles (no --block-b/--block-c/--num-warps/--num-stages)")
        from eqdsl.codegen.generate import symmetric_package_files
        from eqdsl.codegen.package import write_package
        from eqdsl.symmetric.codegen import _header
        write_package(root / "pkgs", symmetric_package_files(ir, _header(ir, None)))
    else:
        generate_symmetric(ir, root / "pkgs", **blocks)
    importlib.invalidate_caches()
    mod = importlib.import_module(f"pkgs.{name}.torch_symmetric")
    print(f"[{name}] lowered and generated in {time.time() - t:.1f} s: {len(ir.terms)} terms, "
          f"weight_numel {ir.weight_numel}", flush=True)
    dev = DEV
    g = torch.Generator(device=dev).manual_seed(0)
    n = args.nodes
    x = torch.randn(n, ir.dim_in * ir.mul, device=dev, dtype=dtype, generator=g)
    w = torch.randn(ir.num_elements, ir.weight_numel, device=dev, dtype=dtype, generator=g) * 0.3
    elem = torch.randint(0, ir.num_elements, (n,), device=dev, generator=g)
    cot = torch.randn(n, sum(ir.out_dims) * ir.mul, device=dev, dtype=dtype, generator=g)

    for op in ("fwd", "bwd_x", "bwd_w"):  # compile each kernel, and say how long it took
        t = time.time()
        if op == "fwd":
            out = mod.symmetric_contraction(x, w, elem)
        elif op == "bwd_x":
            mod.OPS["bwd_x"](x, w, cot, elem)
        else:
            mod.OPS["bwd_w"](x, cot, elem)
        sync()
        print(f"[{name}] first {op} call ({'Triton' if args.triton else 'Helion'} compile) {time.time() - t:.1f} s",
              flush=True)

    want = dense_contraction(spec, x, w, elem)
    err = rel(out, want)
    print(f"[{name}] forward vs dense U contraction (float64): rel err {err:.2e}", flush=True)
    if not err < TOL[dtype] or not torch.isfinite(out).all():
        fail(f"{name}: forward rel err {err:.3e} > {TOL[dtype]:.0e}")
    m = min(n, 256)
    xs, ws = x[:m].clone().requires_grad_(True), w.clone().requires_grad_(True)
    gx, gw = torch.autograd.grad((mod.symmetric_contraction(xs, ws, elem[:m]) * cot[:m]).sum(), (xs, ws))
    xd, wd = x[:m].double().requires_grad_(True), w.double().requires_grad_(True)
    rx, rw = torch.autograd.grad((dense_contraction(spec, xd, wd, elem[:m]) * cot[:m].double()).sum(), (xd, wd))
    for what, a, b in (("dx", gx, rx), ("dW", gw, rw)):
        err = rel(a, b)
        print(f"[{name}] {what} vs dense U contraction (first {m} nodes): rel err {err:.2e}", flush=True)
        if not err < TOL[dtype]:
            fail(f"{name}: {what} rel err {err:.3e} > {TOL[dtype]:.0e}")

    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def fwd():
        mod.symmetric_contraction(x, w, elem, check=False)

    def fwd_bwd():
        mod.symmetric_contraction(xr, wr, elem, check=False).backward(cot)

    def forces():
        e = (mod.symmetric_contraction(xr, wr, elem, check=False) * cot).sum()
        (f,) = torch.autograd.grad(e, xr, create_graph=True)
        (f * f).sum().backward()

    row = {}
    for label, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)) + ((("forces", forces),) if args.forces else ()):
        if label == "forces":  # compiles fwd_d1, bwd_w_d1, bwd_x_d1 first
            t = time.time()
            fn()
            sync()
            print(f"[{name}] first forces step (compiles its kernels) {time.time() - t:.1f} s", flush=True)
        row[label] = cuda_median_ms(fn, args.warmup, args.reps)
        print(f"[{name}] eqdsl {label}: {row[label] * 1e3:.1f} us", flush=True)
    if args.per_op:  # each op alone (the ops a force-trained step calls), to see where the time goes
        v = torch.randn_like(x)
        calls = {"op fwd": lambda: mod.OPS["fwd"](x, w, elem), "op bwd_x": lambda: mod.OPS["bwd_x"](x, w, cot, elem),
                 "op bwd_w": lambda: mod.OPS["bwd_w"](x, cot, elem),
                 "op fwd_d1": lambda: mod.OPS["fwd_d1"](x, v, w, elem),
                 "op bwd_x_d1": lambda: mod.OPS["bwd_x_d1"](x, v, w, cot, elem),
                 "op bwd_w_d1": lambda: mod.OPS["bwd_w_d1"](x, v, cot, elem)}
        for label, fn in calls.items():
            row[label] = cuda_median_ms(fn, args.warmup, args.reps)
            print(f"[{name}] eqdsl {label}: {row[label] * 1e3:.1f} us", flush=True)
    floor = (x.numel() + w.numel() + out.numel()) * x.element_size()
    row["floor_bytes"] = floor
    row["floor_us"] = floor / HBM_BYTES_PER_S * 1e6
    print(f"[{name}] memory floor: x {x.numel() * x.element_size()} + W {w.numel() * w.element_size()} + "
          f"out {out.numel() * x.element_size()} = {floor} bytes, {row['floor_us']:.1f} us at 3.35 TB/s", flush=True)
    results[f"eqdsl_{name}"] = row


def bench_mace(args, dtype, results):
    try:
        from e3nn import o3
        from mace.modules.symmetric_contraction import SymmetricContraction
    except Exception as e:  # noqa: BLE001 - a missing baseline is reported, not fatal
        print(f"mace-torch: not importable ({type(e).__name__}: {e})", flush=True)
        return
    torch.set_default_dtype(dtype)
    try:
        dev = DEV
        module = SymmetricContraction(o3.Irreps(irreps(args.mul)[0]), o3.Irreps(irreps(args.mul)[1]), correlation=3,
                                      num_elements=args.elements).to(dev)
        x = torch.randn(args.nodes, args.mul, 16, device=dev, dtype=dtype, requires_grad=True)
        elem = torch.randint(0, args.elements, (args.nodes,), device=dev)
        y = torch.nn.functional.one_hot(elem, args.elements).to(dtype)
        cot = torch.randn(args.nodes, 4 * args.mul, device=dev, dtype=dtype)
        row = {}

        def fwd():
            with torch.no_grad():
                module(x, y)

        def fwd_bwd():
            module(x, y).backward(cot)

        def forces():
            e = (module(x, y) * cot).sum()
            (f,) = torch.autograd.grad(e, x, create_graph=True)
            (f * f).sum().backward()

        for label, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)) + ((("forces", forces),) if args.forces else ()):
            row[label] = cuda_median_ms(fn, args.warmup, args.reps)
            print(f"[mace e3nn {dtype}] {label}: {row[label] * 1e3:.1f} us", flush=True)
        results[f"mace_e3nn_{str(dtype).removeprefix('torch.')}"] = row
    except Exception as e:  # noqa: BLE001
        print(f"mace-torch SymmetricContraction failed: {type(e).__name__}: {e}", flush=True)
    finally:
        torch.set_default_dtype(torch.float32)


def bench_cueq(args, dtype, results):
    try:
        import cuequivariance as cue
        import cuequivariance_torch as cuet
    except Exception as e:  # noqa: BLE001
        print(f"cuequivariance: not importable ({type(e).__name__}: {e})", flush=True)
        return
    try:
        dev = DEV
        module = cuet.SymmetricContraction(
            cue.Irreps("O3", irreps(args.mul)[0]), cue.Irreps("O3", irreps(args.mul)[1]), layout_in=cue.ir_mul, layout_out=cue.mul_ir,
            contraction_degree=3, num_elements=args.elements, original_mace=True, dtype=dtype,
            math_dtype=dtype).to(dev)
        x = torch.randn(args.nodes, 16 * args.mul, device=dev, dtype=dtype, requires_grad=True)
        idx = torch.randint(0, args.elements, (args.nodes,), device=dev, dtype=torch.int32)
        cot = torch.randn(args.nodes, 4 * args.mul, device=dev, dtype=dtype)
        row = {}

        def fwd():
            with torch.no_grad():
                module(x, idx)

        def fwd_bwd():
            module(x, idx).backward(cot)

        def forces():
            e = (module(x, idx) * cot).sum()
            (f,) = torch.autograd.grad(e, x, create_graph=True)
            (f * f).sum().backward()

        for label, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)) + ((("forces", forces),) if args.forces else ()):
            try:
                row[label] = cuda_median_ms(fn, args.warmup, args.reps)
                print(f"[cueq {dtype}] {label}: {row[label] * 1e3:.1f} us", flush=True)
            except Exception as e:  # noqa: BLE001 - e.g. no double backward
                print(f"[cueq {dtype}] {label} failed: {type(e).__name__}: {e}", flush=True)
        results[f"cueq_{str(dtype).removeprefix('torch.')}"] = row
    except Exception as e:  # noqa: BLE001
        print(f"cuequivariance SymmetricContraction failed: {type(e).__name__}: {e}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3072)
    p.add_argument("--elements", type=int, default=10)
    p.add_argument("--dtypes", default="float32", help="e.g. float32,float64 (each dtype compiles every kernel again)")
    p.add_argument("--layouts", default="mul_ir,ir_mul")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block-b", type=int, default=None)
    p.add_argument("--block-c", type=int, default=None)
    p.add_argument("--num-warps", type=int, default=None)
    p.add_argument("--num-stages", type=int, default=None)
    p.add_argument("--triton", action="store_true",
                   help="generate with the shipped Triton code (as eqdsl generate; lowered here first) instead of "
                        "binding the Helion kernels at first call")
    p.add_argument("--forces", action="store_true", help="also time the forces row (compiles 3 more kernels)")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--per-op", action="store_true", help="also time each op a force-trained step calls, alone")
    p.add_argument("--mul", type=int, default=128)
    p.add_argument("--smoke-cpu", action="store_true",
                   help="dry run of the script on the CPU (TRITON_INTERPRET=1, e.g. --mul 4 --nodes 8): checks only")
    args = p.parse_args()
    global DEV
    if args.smoke_cpu:
        if os.environ.get("TRITON_INTERPRET") != "1":
            fail("--smoke-cpu needs TRITON_INTERPRET=1 in the environment")
        DEV = torch.device("cpu")
        print(f"smoke run on the CPU (Triton's interpreter), torch {torch.__version__}", flush=True)
    else:
        if not torch.cuda.is_available():
            fail("no CUDA device (this benchmark runs on a GPU)")
        if os.environ.get("TRITON_INTERPRET") == "1":
            fail("TRITON_INTERPRET=1 is set: unset it to time compiled kernels")
        print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="eqdsl-sc-bench-") as tmp:
        root = Path(tmp)
        sys.path.insert(0, str(root))
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            for layout in args.layouts.split(","):
                bench_eqdsl(args, layout, dtype, root, results)
            if not args.no_baselines:
                bench_mace(args, dtype, results)
                bench_cueq(args, dtype, results)
    print("RESULT " + json.dumps(results, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
