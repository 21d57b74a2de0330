"""JAX conv fwd+bwd on bulk Si: per-edge block (block_edges) sweep, per generated dir."""
import sys, time, statistics
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import bench_tp as bt
from gpu_jax_conv_blocks import graphs, wall_us, rel
import jax
prob, gen = sys.argv[1], sys.argv[2]
blocks = [int(b) for b in sys.argv[3].split(",")]
mod = bt.import_generated(gen, prob, "jax_ops")
for g in graphs((sys.argv[4] if len(sys.argv) > 4 else "bulk").split(","), False):
  n, e = g.num_nodes, g.num_edges
  rng = np.random.default_rng(0)
  s, d = jax.device_put(g.src.astype(np.int32)), jax.device_put(g.dst.astype(np.int32))
  a, b, c = (jax.device_put(rng.standard_normal(sh).astype(np.float32)) for sh in ((n, mod.DIM_IN1), (e, mod.DIM_IN2), (e, mod.WEIGHT_NUMEL)))
  gout = jax.device_put(rng.standard_normal((n, mod.DIM_OUT)).astype(np.float32))
  base = None
  for be in blocks:
      def f(a_, b_, c_, be=be):
          return mod.conv(a_, b_, c_, s, d, n, check=False, block_edges=be)
      def fb(a_, b_, c_, g_):
          out, vjp = jax.vjp(f, a_, b_, c_)
          return out, vjp(g_)
      fwd, fwd_bwd = jax.jit(f), jax.jit(fb)
      res = jax.block_until_ready(fwd_bwd(a, b, c, gout))
      flat = [res[0], *res[1]]
      base = base or flat
      err = max(rel(x, y) for x, y in zip(flat, base))
      t_f = wall_us(lambda: fwd(a, b, c), 7, 10)
      t_fb = wall_us(lambda: fwd_bwd(a, b, c, gout), 7, 10)
      print(f"{prob:15s} {g.label:11s} {gen:22s} block_edges={be:3d} fwd {t_f:8.1f} fwd+bwd {t_fb:8.1f} err {err:.1e}", flush=True)
