"""Which JAX functions hit the persistent cache across processes: lower and compile seconds per function, cache log lines."""
import logging, os, sys, time
import numpy as np
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import jax
records = []
class H(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
h = H(); h.setLevel(logging.DEBUG)
for m in ("jax._src.compiler", "jax._src.compilation_cache", "jax._src.cache_key"):
    lg = logging.getLogger(m); lg.setLevel(logging.DEBUG); lg.addHandler(h)
import bench_tp as bt
tag = sys.argv[1]
for prob in sys.argv[2].split(","):
    mod = bt.import_generated("generated", prob, "jax_ops")
    rng = np.random.default_rng(0); B = 20000
    w_shape = (mod.WEIGHT_NUMEL,) if mod.SHARED_WEIGHTS else (B, mod.WEIGHT_NUMEL)
    x1, x2, w, g = (jax.device_put(rng.standard_normal(s).astype(np.float32)) for s in ((B, mod.DIM_IN1), (B, mod.DIM_IN2), w_shape, (B, mod.DIM_OUT)))
    impl = bt.build_eqdsl_jax(bt.Problem.__new__(bt.Problem), "float32", None, type("A", (), {"generated": "generated"})) if False else None
    f = jax.jit(mod.tensor_product)
    fb = bt.jax_fb(mod.tensor_product)
    for name, fn, args in (("fwd", f, (x1, x2, w)), ("fb", fb, (x1, x2, w, g))):
        records.clear()
        t0 = time.perf_counter(); low = fn.trace(*args).lower(); t1 = time.perf_counter()
        low.compile(); t2 = time.perf_counter()
        jax.block_until_ready(fn(*args)); t3 = time.perf_counter()
        keyl = [r for r in records if "get_cache_key hash of serialized" in r]
        hits = [r[:160] for r in records if "hit" in r.lower() or "miss" in r.lower() or "writ" in r.lower() or "not" in r.lower()]
        print(f"{tag} {prob} {name}: lower {t1-t0:.1f}s compile {t2-t1:.1f}s first call {t3-t2:.1f}s", flush=True)
        for r in hits[:6]: print("    ", r, flush=True)
        for r in keyl: print("     K", r[:140], flush=True)
