"""JAX conv fwd+bwd on bulk Si: warps of the fused backward's per-edge kernels (and its segment sum)."""
import sys
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import bench_tp as bt
from gpu_jax_conv_blocks import graphs, wall_us, rel
import jax
from eqdsl.runtime import jax_runtime as rt
prob = sys.argv[1]
warps = [int(w) for w in sys.argv[2].split(",")]
orig = rt.conv_backward_fused
state = {"w": None}
def patched(*a, **k):
    if state["w"] is not None:
        k["num_warps"] = state["w"]
    return orig(*a, **k)
rt.conv_backward_fused = patched
mod = bt.import_generated(str(ROOT / "generated"), prob, "jax_ops")
g = graphs(["bulk"], False)[0]
n, e = g.num_nodes, g.num_edges
rng = np.random.default_rng(0)
s, d = jax.device_put(g.src.astype(np.int32)), jax.device_put(g.dst.astype(np.int32))
a, b, c = (jax.device_put(rng.standard_normal(sh).astype(np.float32)) for sh in ((n, mod.DIM_IN1), (e, mod.DIM_IN2), (e, mod.WEIGHT_NUMEL)))
gout = jax.device_put(rng.standard_normal((n, mod.DIM_OUT)).astype(np.float32))
base = None
for w in [None] + warps:
    state["w"] = w
    jax.clear_caches()
    def fb(a_, b_, c_, g_):
        out, vjp = jax.vjp(lambda x, y, z: mod.conv(x, y, z, s, d, n, check=False), a_, b_, c_)
        return out, vjp(g_)
    fwd_bwd = jax.jit(fb)
    res = jax.block_until_ready(fwd_bwd(a, b, c, gout))
    flat = [res[0], *res[1]]
    base = base or flat
    err = max(rel(x, y) for x, y in zip(flat, base))
    t_fb = wall_us(lambda: fwd_bwd(a, b, c, gout), 7, 10)
    print(f"{prob:15s} fused-bwd warps={str(w or 'default'):8s} fwd+bwd {t_fb:8.1f} err {err:.1e}", flush=True)
