"""Dump the Triton IR that Pallas lowers for a generated package's JAX conv forward (CUDA lowering on a CPU)."""
import sys, re, pathlib, numpy as np
import jax; jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import importlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import percomp  # noqa: F401
pkg, dt, se = sys.argv[1], sys.argv[2], int(sys.argv[3])
ops = importlib.import_module(f"twins.{pkg}.jax_ops" if pkg.endswith("_irmul") else f"generated.{pkg}.jax_ops")
n, e = 16, 64
S = jax.ShapeDtypeStruct
args = (S((n, ops.DIM_IN1), dt), S((e, ops.DIM_IN2), dt), S((e, ops.WEIGHT_NUMEL), dt), S((e,), jnp.int32), S((e,), jnp.int32))
f = lambda x, y, w, s, d: ops.conv(x, y, w, s, d, n, check=False, interpret=False, segment_edges=se)
txt = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
out = pathlib.Path(sys.argv[4]); out.write_text(txt)
print(len(txt), txt.count("__gpu$xla.gpu.triton"), txt.count("triton_kernel_call"))
