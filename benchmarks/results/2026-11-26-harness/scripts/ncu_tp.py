"""Two calls each of a problem's jitted JAX tensor product, forward and forward+backward, 20,000 rows (for ncu)."""
import os, sys
import numpy as np
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import jax
import bench_tp as bt
prob = sys.argv[1]
mod = bt.import_generated(sys.argv[2] if len(sys.argv) > 2 else "generated", prob, "jax_ops")
rng = np.random.default_rng(0); B = 20000
w_shape = (mod.WEIGHT_NUMEL,) if mod.SHARED_WEIGHTS else (B, mod.WEIGHT_NUMEL)
x1, x2, w, g = (jax.device_put(rng.standard_normal(s).astype(np.float32)) for s in ((B, mod.DIM_IN1), (B, mod.DIM_IN2), w_shape, (B, mod.DIM_OUT)))
f = jax.jit(mod.tensor_product); fb = bt.jax_fb(mod.tensor_product)
for _ in range(2):
    jax.block_until_ready(f(x1, x2, w)); jax.block_until_ready(fb(x1, x2, w, g))
print("done", prob)
