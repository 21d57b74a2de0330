#!/usr/bin/env python3
"""Registers and spills of a generated Helion kernel for the H100 (sm_90a), without a GPU.

Helion writes the kernel's Triton source on the CPU (``bind`` + ``to_triton_code``), Triton
compiles it for an explicit CUDA target, and the ptxas that ships with Triton reports
registers per thread and spill bytes (``ptxas -v``). These are the numbers ncu's
``launch__registers_per_thread`` and local-memory counts come from, so a register or
spill regression can be found here before spending GPU time::

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/tools/ptxas_stats.py nequip_toluene tp_bwd_x2_0
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/tools/ptxas_stats.py nequip_toluene tp_bwd_x2_0 --maxnreg 256

Sizes and strides are those of 64 contiguous rows (the batch size is a runtime argument;
strides equal to 1 are specialized as Triton does at launch), float32. The plain tensor
product's kernels (``generated/<spec>/helion_kernels.py``) and, for a ``conv_*`` kernel
name, the convolution's (``helion_conv_kernels.py``: 64 edges over 16 nodes, int64
indices; ``conv_radial_*`` kernels also get ``radial_features`` and ``radial_weight``).
``--generated DIR`` reads another generated folder (a variant under study).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[2]


def triton_source(spec: str, kernel: str, generated: Path = ROOT / "generated") -> tuple[str, dict[str, torch.Tensor]]:
    """The Triton source Helion generates for ``kernel`` of ``<generated>/<spec>``, and its arguments."""
    sys.path.insert(0, str(Path(generated).resolve()))
    ops = importlib.import_module(f"{spec}.torch_ops")
    n = 64
    w = torch.randn(*(() if ops.SHARED_WEIGHTS else (n,)), ops.WEIGHT_NUMEL)
    if kernel.startswith("conv_"):
        k = getattr(importlib.import_module(f"{spec}.helion_conv_kernels"), kernel)
        nodes = 16
        idx = torch.arange(n) % nodes
        pool = {
            "src": idx, "dst": idx.sort().values, "order": torch.arange(n), "ptr": torch.arange(nodes + 1) * (n // nodes),
            "x": torch.randn(nodes, ops.DIM_IN1), "y": torch.randn(n, ops.DIM_IN2), "weights": w,
            "g": torch.randn(nodes, ops.DIM_OUT), "out": torch.empty(nodes, ops.DIM_OUT),
            "out_flat": torch.empty(nodes * ops.DIM_OUT), "gx": torch.empty(nodes, ops.DIM_IN1),
            "gy": torch.empty(n, ops.DIM_IN2), "gw": torch.empty(n, ops.WEIGHT_NUMEL),
            "gyp": torch.empty(n, 2 * ops.DIM_IN2),  # the fused backward's dF/dy partial sums (the width: a guess)
        }
        h = getattr(importlib.import_module(spec), "RADIAL_FEATURES", None)
        if h:  # conv_radial's kernels
            pool |= {"radial_features": torch.randn(n, h), "radial_weight": torch.randn(h, ops.WEIGHT_NUMEL)}
    else:
        k = getattr(importlib.import_module(f"{spec}.helion_kernels"), kernel)
        pool = {
            "x1": torch.randn(n, ops.DIM_IN1), "x2": torch.randn(n, ops.DIM_IN2), "g": torch.randn(n, ops.DIM_OUT),
            "weights": w, "out": torch.empty(n, ops.DIM_OUT), "gx1": torch.empty(n, ops.DIM_IN1),
            "gx2": torch.empty(n, ops.DIM_IN2),
            "gx2p": torch.empty(n, 2 * ops.DIM_IN2),  # the fused backward's dF/dx2 partial sums (as triton_lowering)
            "gw": torch.empty(n, ops.WEIGHT_NUMEL),  # per-row partials with shared weights too
        }
    args = {p: pool[p] for p in inspect.signature(k.fn).parameters}
    return k.bind(tuple(args.values())).to_triton_code(k.configs[0]), args


def ptxas_report(source: str, args: dict[str, torch.Tensor], options: dict, dump: str | None = None) -> list[str]:
    """Compile ``source`` for sm_90a in a fresh process (Triton's interpreter, which Helion's
    CPU binding needs, patches ``triton.language`` process-wide) and return ptxas' lines."""
    meta = {n: {"shape": list(t.shape), "stride": list(t.stride()), "ptr": "*i64" if t.dtype == torch.int64 else "*fp32"}
            for n, t in args.items()}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.py").write_text(source)
        (Path(tmp) / "meta.json").write_text(json.dumps({"args": meta, "options": options, "dump": dump}))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        r = subprocess.run([sys.executable, __file__, "--compile", tmp], capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(r.stderr[-2000:])
        return r.stdout.splitlines()


def _compile(tmp: str) -> None:
    meta = json.loads((Path(tmp) / "meta.json").read_text())
    spec = importlib.util.spec_from_file_location("kernel", Path(tmp) / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = next(v for k, v in vars(mod).items() if k.startswith("_helion_") and isinstance(v, triton.runtime.jit.JITFunction))
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        m = re.fullmatch(r"(.+)_(stride|size)_(\d+)", name)
        if m:
            t = meta["args"][m.group(1)]
            val = t["stride" if m.group(2) == "stride" else "shape"][int(m.group(3))]
            if val == 1:
                sig[name], constexprs[(i,)] = "constexpr", 1
            else:
                sig[name] = "i32"
                if val % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif fn.params[i].is_constexpr:  # a host-computed block shape, e.g. _SHAPE_DIM = 8 * _BLOCK_SIZE_0
            expr = re.search(rf"^\s*{name} = (.+)$", (Path(tmp) / "kernel.py").read_text(), re.M).group(1)
            value = eval(expr, vars(mod))  # generated source, its own constants
            sig[name], constexprs[(i,)] = "constexpr", getattr(value, "value", value)
        elif name in meta["args"]:
            sig[name], attrs[(i,)] = meta["args"][name]["ptr"], [["tt.divisibility", 16]]
        else:  # a scalar argument (the batch size of the shared-weight kernels)
            sig[name] = "i32"
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options=meta["options"])
    ptx = Path(tmp) / "kernel.ptx"
    ptx.write_text(compiled.asm["ptx"])
    if meta.get("dump"):
        for stage in ("ttir", "ttgir", "llir", "ptx"):
            (Path(meta["dump"]) / f"kernel.{stage}").write_text(compiled.asm[stage])
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", os.devnull], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        if "registers" in line or "spill" in line:
            print(line.strip())


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--compile"]:
        _compile(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("kernel", help="e.g. tp_bwd_x2_0")
    ap.add_argument("--maxnreg", type=int, default=None, help="override the kernel's maxnreg")
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--dump", help="also write the Triton IR stages and PTX (kernel.ttgir, ...) to this folder")
    ap.add_argument("--generated", default=str(ROOT / "generated"), help="generated packages folder (default generated)")
    args = ap.parse_args(argv)
    source, targs = triton_source(args.spec, args.kernel, Path(args.generated))
    options = {"num_warps": args.num_warps, "num_stages": 1}
    if args.maxnreg:
        options["maxnreg"] = args.maxnreg
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
        (Path(args.dump) / "kernel.py").write_text(source)
    for line in ptxas_report(source, targs, options, str(Path(args.dump).resolve()) if args.dump else None):
        print(f"{args.spec} {args.kernel} maxnreg={args.maxnreg}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
