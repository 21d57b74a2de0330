"""Registers and spills of a package's JAX conv kernels, forward and VJP, compiled for sm_90 on a CPU.

    python benchmarks/results/s20/conv_regs.py mace_large float64 [WARPS]

Lowers ``jax.vjp`` of ``generated/<pkg>/jax_ops.conv`` for CUDA (no GPU: 64 nodes, 512 sorted
edges), writes each Pallas kernel's Triton IR (``../s18/ttir.py``) into a temporary folder and
compiles it with the local Triton 3.6 and ptxas (``../s18/sass.py``, WARPS default 4: the
kernels' ``num_warps`` in the lowering). s20 (2026-12-07): ``conv_regs.log``.
"""
import importlib
import pathlib
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
pkg, dt = sys.argv[1], sys.argv[2]
warps = sys.argv[3] if len(sys.argv) > 3 else "4"
ops = importlib.import_module(f"generated.{pkg}.jax_ops")
n, e = 64, 512
S = jax.ShapeDtypeStruct
args = (S((n, ops.DIM_IN1), dt), S((e, ops.DIM_IN2), dt), S((e, ops.WEIGHT_NUMEL), dt))
src = jnp.arange(e, dtype=jnp.int32) % n
dst = jnp.sort(src)


def fwd_vjp(x, y, w):
    out, vjp = jax.vjp(lambda x, y, w: ops.conv(x, y, w, src, dst, n, check=False, interpret=False), x, y, w)
    return vjp(out)


text = jax.jit(fwd_vjp).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
with tempfile.TemporaryDirectory() as tmp:
    mlir = pathlib.Path(tmp) / "conv.mlir"
    mlir.write_text(text)
    names = subprocess.run([sys.executable, str(HERE.parent / "s18" / "ttir.py"), str(mlir), f"{tmp}/k"],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for line in filter(None, names):
        k, name = line.split(" ", 1)
        res = subprocess.run([sys.executable, str(HERE.parent / "s18" / "sass.py"), f"{tmp}/k_{k}.ttir", warps],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        print(f"{pkg} {dt} {name}: {res[0].strip()}; {res[1].strip()}", flush=True)
