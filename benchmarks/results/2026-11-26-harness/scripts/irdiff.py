"""Lowered text of nequip_toluene's jitted fwd+bwd, alone (A) and after mace_large's (B)."""
import os, sys
import numpy as np
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import jax
import bench_tp as bt
tag = sys.argv[1]
for prob in sys.argv[2].split(","):
    mod = bt.import_generated("generated", prob, "jax_ops")
    B = 20000
    S = jax.ShapeDtypeStruct
    w_shape = (mod.WEIGHT_NUMEL,) if mod.SHARED_WEIGHTS else (B, mod.WEIGHT_NUMEL)
    args = [S(s, np.float32) for s in ((B, mod.DIM_IN1), (B, mod.DIM_IN2), w_shape, (B, mod.DIM_OUT))]
    f = jax.jit(mod.tensor_product); fb = bt.jax_fb(mod.tensor_product)
    f.trace(*args[:3]).lower()
    low = fb.trace(*args).lower()
out = os.path.join(os.environ.get("OUT", "/tmp"), f"ir_{tag}.txt")
open(out, "w").write(low.as_text(debug_info=True))
print(tag, "written", len(low.as_text()))
