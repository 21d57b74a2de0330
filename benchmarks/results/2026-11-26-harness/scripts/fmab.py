"""JAX TP (20,000 rows) and, where generated, conv (bulk Si) of a generated package: fwd and fwd+bwd times; saves outputs, compares with tag base."""
import sys
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import jax
import bench_tp as bt
from gpu_jax_conv_blocks import graphs, wall_us
prob, gen, tag = sys.argv[1], sys.argv[2], sys.argv[3]
mod = bt.import_generated(gen, prob, "jax_ops")
rng = np.random.default_rng(0)
B = 20000
x1, x2, w, g = (jax.device_put(rng.standard_normal(s).astype(np.float32)) for s in ((B, mod.DIM_IN1), (B, mod.DIM_IN2), (B, mod.WEIGHT_NUMEL), (B, mod.DIM_OUT)))
tf = jax.jit(mod.tensor_product)
def tfb(a, b, c, gg):
    o, vjp = jax.vjp(mod.tensor_product, a, b, c)
    return o, vjp(gg)
tfb = jax.jit(tfb)
res = [np.asarray(v) for v in jax.tree.leaves(tfb(x1, x2, w, g))]
t1 = wall_us(lambda: tf(x1, x2, w), 7, 10); t2 = wall_us(lambda: tfb(x1, x2, w, g), 7, 10)
line = f"{prob:15s} {tag:5s} TP20000 fwd {t1:8.1f} fwd+bwd {t2:8.1f}"
import os
if hasattr(mod, "conv") and os.environ.get("FMAB_CONV"):
    gr = graphs(["bulk"], False)[0]
    n, e = gr.num_nodes, gr.num_edges
    s, d = jax.device_put(gr.src.astype(np.int32)), jax.device_put(gr.dst.astype(np.int32))
    a, b, c = (jax.device_put(rng.standard_normal(sh).astype(np.float32)) for sh in ((n, mod.DIM_IN1), (e, mod.DIM_IN2), (e, mod.WEIGHT_NUMEL)))
    gn = jax.device_put(rng.standard_normal((n, mod.DIM_OUT)).astype(np.float32))
    f = jax.jit(lambda a_, b_, c_: mod.conv(a_, b_, c_, s, d, n, check=False))
    def fb(a_, b_, c_, g_):
        o, vjp = jax.vjp(lambda x, y, z: mod.conv(x, y, z, s, d, n, check=False), a_, b_, c_)
        return o, vjp(g_)
    fb = jax.jit(fb)
    res += [np.asarray(v) for v in jax.tree.leaves(fb(a, b, c, gn))]
    t3 = wall_us(lambda: f(a, b, c), 7, 10); t4 = wall_us(lambda: fb(a, b, c, gn), 7, 10)
    line += f" | conv bulk fwd {t3:8.1f} fwd+bwd {t4:8.1f}"
print(line, flush=True)
np.savez(f"/tmp/fmab_{prob}_{tag}.npz", *res)
if tag != "base":
    ref = np.load(f"/tmp/fmab_{prob}_base.npz")
    errs = [float(np.linalg.norm(x.astype(np.float64) - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30)) for k, x in zip(ref.files, res)]
    print(f"{prob:15s} {tag:5s} rel err vs base: max {max(errs):.2e}", flush=True)
