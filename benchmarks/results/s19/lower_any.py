"""The StableHLO text (Triton IR inside) of a package's JAX tensor product, lowered for CUDA on a CPU.

    python lower_any.py PKG DTYPE fwd|bwd OUT.mlir

PKG: a package of the repository's ``generated/`` (``nequip_toluene``) or a module path on
``PYTHONPATH`` (``gen.ntg``); ``fwd``: ``tensor_product``, ``bwd``: its VJP too. Then
``../s18/ttir.py OUT.mlir PREFIX`` writes each kernel's Triton IR and ``../s18/sass.py`` compiles it.
"""
import importlib
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
pkg, dt, which, out = sys.argv[1:5]
ops = importlib.import_module(pkg + ".jax_ops" if "." in pkg else f"generated.{pkg}.jax_ops")
b = 256
S = jax.ShapeDtypeStruct
args = (S((b, ops.DIM_IN1), dt), S((b, ops.DIM_IN2), dt), S((b, ops.WEIGHT_NUMEL), dt))


def fwd(x, y, w):
    return ops.tensor_product(x, y, w, interpret=False)


def fwd_bwd(x, y, w):
    out, vjp = jax.vjp(fwd, x, y, w)
    return vjp(out)


f = fwd if which == "fwd" else fwd_bwd
pathlib.Path(out).write_text(jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text())
