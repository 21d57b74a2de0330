#!/usr/bin/env python3
"""Is the Triton code lowered on a CPU what Helion writes on the GPU?

``eqdsl generate`` lowers every Helion kernel to Triton on the CPU, under Triton's
interpreter (``eqdsl.codegen.triton_lowering``). This binds each kernel of the given
packages with CUDA tensors instead, lowers it the same way and compares the module
body with the committed ``triton_kernels/<kernel>_<dtype>.py`` (headers aside)::

    python3 benchmarks/tools/check_lowering.py mace_large nequip_water mace_mp_products [--dtypes float32]

Prints one line per kernel (same / DIFFERENT, with the first differing line) and exits
1 if any differs.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eqdsl.codegen import triton_lowering  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="+")
    ap.add_argument("--dtypes", default="float32,float64")
    args = ap.parse_args()
    bad = 0
    for name in args.packages:
        meta = importlib.import_module(f"generated.{name}")
        if getattr(meta, "KIND", None) == "symmetric_contraction":  # its kernels take no widths
            ops = triton_lowering.Operands(0, 0, 0, 0, False, tuple(meta.DTYPES))
        else:
            ops = triton_lowering.Operands(meta.DIM_IN1, meta.DIM_IN2, meta.DIM_OUT, meta.WEIGHT_NUMEL,
                                           meta.SHARED_WEIGHTS, tuple(meta.DTYPES))
        for source in triton_lowering.SOURCES:
            path = ROOT / "generated" / name / source
            if not path.is_file():
                continue
            module = importlib.import_module(f"generated.{name}.{path.stem}")
            text = path.read_text()
            for kernel_name in triton_lowering.kernel_names(text):
                for dtype in args.dtypes.split(","):
                    if dtype not in ops.dtypes:
                        continue
                    helion_name = triton_lowering.helion_kernel(text, kernel_name, dtype)  # a dtype's own tuning
                    kernel = getattr(module, helion_name)
                    params = list(inspect.signature(kernel.fn).parameters)
                    cpu = triton_lowering._example_args(params, ops, getattr(torch, dtype))
                    cuda = tuple(a.cuda() for a in cpu)
                    code = kernel.bind(cuda).to_triton_code(kernel.configs[0], output_origin_lines=False)
                    options = getattr(module, "TRITON_OPTIONS", {}).get(helion_name, {})
                    on_gpu = triton_lowering._restructure(code, helion_name, options, kernel_name).splitlines()
                    shipped = (ROOT / "generated" / name / triton_lowering.DIR /
                               f"{triton_lowering.module_name(kernel_name, dtype)}.py").read_text().splitlines()[3:]
                    if on_gpu == shipped:
                        print(f"{name} {kernel_name} {dtype}: same ({len(shipped)} lines)")
                        continue
                    bad += 1
                    first = next((i for i, (a, b) in enumerate(zip(on_gpu, shipped)) if a != b), min(len(on_gpu), len(shipped)))
                    print(f"{name} {kernel_name} {dtype}: DIFFERENT at line {first}: gpu "
                          f"{on_gpu[first:first + 1]!r} vs shipped {shipped[first:first + 1]!r}")
    print(f"{bad} kernel(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
