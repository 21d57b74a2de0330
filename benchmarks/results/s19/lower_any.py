"""Dump the stablehlo (with Triton IR) of a generated package's JAX tensor_product forward (CUDA lowering on a CPU)."""
import sys, pathlib
import jax; jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import importlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import percomp  # noqa: F401
import clamp  # noqa: F401
pkg, dt, which = sys.argv[1], sys.argv[2], sys.argv[3]
ops = importlib.import_module(pkg + ".jax_ops" if "." in pkg else (f"twins.{pkg}.jax_ops" if pkg.endswith("_irmul") else f"generated.{pkg}.jax_ops"))
b = 256
S = jax.ShapeDtypeStruct
args = (S((b, ops.DIM_IN1), dt), S((b, ops.DIM_IN2), dt), S((b, ops.WEIGHT_NUMEL), dt))
if which == "fwd":
    f = lambda x, y, w: ops.tensor_product(x, y, w, interpret=False)
else:
    def f(x, y, w):
        out, vjp = jax.vjp(lambda a, c, d: ops.tensor_product(a, c, d, interpret=False), x, y, w)
        return vjp(out)
txt = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
pathlib.Path(sys.argv[4]).write_text(txt)
