"""Does FMA contraction speed up the Pallas kernels? The PTX that XLA's Triton pipeline returns
uses mul.rn / add.rn (ptxas never contracts those); with --fma the CUDA compilation handler's
PTX has the .rn dropped from mul/add/sub, so ptxas may fuse them (as Triton's own default does)."""
import re, sys, time
from pathlib import Path
from types import SimpleNamespace
import numpy as np
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT))
import jax
fma = "--fma" in sys.argv
stats = {"kernels": 0, "mul": 0, "add": 0, "fma_before": 0}
jax.devices()
if fma:
    import inspect
    from jax._src.pallas.triton import pallas_call_registration as pcr
    src = inspect.getsource(pcr)
    if not hasattr(pcr, "triton") or not hasattr(pcr.triton, "compile"):
        print("NO pcr.triton.compile; source:\n" + src[:6000], flush=True)
        raise SystemExit(0)
    orig_mod = pcr.triton
    class _Wrap:
        def __getattr__(self, k):
            return getattr(orig_mod, k)
        @staticmethod
        def compile(*a, **k):
            r = orig_mod.compile(*a, **k)
            asm = r.asm
            stats["kernels"] += 1
            stats["fma_before"] += len(re.findall(r"\bfma\.rn\.f(32|64)", asm))
            stats["mul"] += len(re.findall(r"\bmul\.rn\.f(32|64)", asm))
            stats["add"] += len(re.findall(r"\b(add|sub)\.rn\.f(32|64)", asm))
            asm = re.sub(r"\b(mul|add|sub)\.rn\.(f32|f64)", r"\1.\2", asm)
            return SimpleNamespace(asm=asm, smem_bytes=r.smem_bytes, hsaco_path=getattr(r, "hsaco_path", ""))
    pcr.triton = _Wrap()
    print("patched pcr.triton.compile", flush=True)
import bench_tp as bt
from gpu_jax_conv_blocks import graphs, wall_us
prob = sys.argv[1]
mod = bt.import_generated(str(ROOT / "generated"), prob, "jax_ops")
rng = np.random.default_rng(0)
out = {}
B = 20000
x1, x2, w, g = (jax.device_put(rng.standard_normal(s).astype(np.float32)) for s in ((B, mod.DIM_IN1), (B, mod.DIM_IN2), (B, mod.WEIGHT_NUMEL), (B, mod.DIM_OUT)))
tf = jax.jit(mod.tensor_product)
def tfb(a, b, c, gg):
    o, vjp = jax.vjp(mod.tensor_product, a, b, c)
    return o, vjp(gg)
tfb = jax.jit(tfb)
res_tp = [np.asarray(v) for v in jax.tree.leaves(tfb(x1, x2, w, g))]
t1 = wall_us(lambda: tf(x1, x2, w), 7, 10); t2 = wall_us(lambda: tfb(x1, x2, w, g), 7, 10)
print(f"{prob} fma={fma} TP 20000 fwd {t1:8.1f} fwd+bwd {t2:8.1f}", flush=True)
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
res_cv = [np.asarray(v) for v in jax.tree.leaves(fb(a, b, c, gn))]
t3 = wall_us(lambda: f(a, b, c), 7, 10); t4 = wall_us(lambda: fb(a, b, c, gn), 7, 10)
print(f"{prob} fma={fma} conv bulk fwd {t3:8.1f} fwd+bwd {t4:8.1f}  ptx stats {stats}", flush=True)
np.savez(f"/tmp/fma_{prob}_{int(fma)}.npz", *res_tp, *res_cv)
if fma:
    ref = np.load(f"/tmp/fma_{prob}_0.npz")
    errs = [float(np.linalg.norm(x - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30)) for k, x in zip(ref.files, res_tp + res_cv)]
    print(f"{prob} rel err vs no-fma: max {max(errs):.2e}", flush=True)
