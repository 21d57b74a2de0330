"""Issue 24 sweep: Pallas block rows / warps / segment edges per dtype (JAX TP and conv), H100."""
import functools, importlib, json, statistics, sys, time
import numpy as np
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, ".")
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
DEADLINE = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 420)
rows = []

def jtime(call, target=0.25):
    jax.block_until_ready(call()); jax.block_until_ready(call())
    t0 = time.perf_counter(); jax.block_until_ready(call()); est = max(time.perf_counter() - t0, 1e-6)
    group = max(1, min(50, int(0.002 / est) + 1)); n = max(10, min(200, int(target / (est * group))))
    s = []
    for _ in range(n):
        t0 = time.perf_counter(); r = None
        for _ in range(group): r = call()
        jax.block_until_ready(r); s.append((time.perf_counter() - t0) * 1e6 / group)
    return statistics.median(s)

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

def tp_case(prob, dtype, configs, batch=20000):
    ops = importlib.import_module(f"generated.{prob}.jax_ops"); pk = importlib.import_module(f"generated.{prob}.pallas_kernels")
    k = jax.random.split(jax.random.PRNGKey(0), 4); dt = jnp.dtype(dtype)
    x1 = jax.random.normal(k[0], (batch, ops.DIM_IN1), dt); x2 = jax.random.normal(k[1], (batch, ops.DIM_IN2), dt)
    w = jax.random.normal(k[2], (batch, ops.WEIGHT_NUMEL), dt); g = jax.random.normal(k[3], (batch, ops.DIM_OUT), dt)
    ref = None
    for bb, nw in configs:
        if time.time() > DEADLINE: print("deadline"); return
        pk.NUM_WARPS = nw or 4
        f = jax.jit(functools.partial(ops.tensor_product, block_batch=bb))
        def fbf(a, b, c, gg):
            out, vjp = jax.vjp(lambda a, b, c: ops.tensor_product(a, b, c, block_batch=bb), a, b, c); return out, vjp(gg)
        fb = jax.jit(fbf)
        try:
            t0 = time.time(); res = fb(x1, x2, w, g); jax.block_until_ready(res); ct = time.time() - t0
            err = 0.0 if ref is None else max(rel(a, b) for a, b in zip(jax.tree.leaves(res), jax.tree.leaves(ref)))
            ref = ref or res
            tf = jtime(lambda: f(x1, x2, w)); tfb = jtime(lambda: fb(x1, x2, w, g))
        except Exception as e:
            print(prob, dtype, bb, nw, "FAIL", str(e).splitlines()[0][:200]); continue
        r = dict(kind="tp", prob=prob, dtype=dtype, block_batch=bb, num_warps=nw or 4, fwd=tf, fb=tfb, err=err, compile_s=ct)
        rows.append(r); print(json.dumps(r), flush=True)
    pk.NUM_WARPS = 4

def conv_case(prob, dtype, configs, nodes=4096, deg=32):
    ops = importlib.import_module(f"generated.{prob}.jax_ops"); pk = importlib.import_module(f"generated.{prob}.pallas_kernels")
    rng = np.random.default_rng(0); E = nodes * deg
    dst = np.repeat(np.arange(nodes), deg); src = rng.integers(0, nodes, E)
    k = jax.random.split(jax.random.PRNGKey(1), 4); dt = jnp.dtype(dtype)
    x = jax.random.normal(k[0], (nodes, ops.DIM_IN1), dt); y = jax.random.normal(k[1], (E, ops.DIM_IN2), dt)
    w = jax.random.normal(k[2], (E, ops.WEIGHT_NUMEL), dt); g = jax.random.normal(k[3], (nodes, ops.DIM_OUT), dt)
    src, dst = jnp.asarray(src, jnp.int32), jnp.asarray(dst, jnp.int32)
    ref = None
    for be, se, nw in configs:
        if time.time() > DEADLINE: print("deadline"); return
        pk.NUM_WARPS = nw or 4
        call = lambda a, b, c: ops.conv(a, b, c, src, dst, nodes, check=False, block_edges=be, segment_edges=se)
        f = jax.jit(call)
        def fbf(a, b, c, gg):
            out, vjp = jax.vjp(call, a, b, c); return out, vjp(gg)
        fb = jax.jit(fbf)
        try:
            t0 = time.time(); res = fb(x, y, w, g); jax.block_until_ready(res); ct = time.time() - t0
            err = 0.0 if ref is None else max(rel(a, b) for a, b in zip(jax.tree.leaves(res), jax.tree.leaves(ref)))
            ref = ref or res
            tf = jtime(lambda: f(x, y, w)); tfb = jtime(lambda: fb(x, y, w, g))
        except Exception as e:
            print(prob, dtype, be, se, nw, "FAIL", str(e).splitlines()[0][:200]); continue
        r = dict(kind="conv", prob=prob, dtype=dtype, block_edges=be, segment_edges=se, num_warps=nw or 4, fwd=tf, fb=tfb,
                 err=err, compile_s=ct)
        rows.append(r); print(json.dumps(r), flush=True)
    pk.NUM_WARPS = 4

print(jax.devices(), flush=True)
tp_case("mace_large", "float64", [(None, None), (2, None), (1, None), (None, 8), (2, 8)])
tp_case("nequip_toluene", "float64", [(None, None), (2, None), (1, None), (None, 8)])
conv_case("mace_large", "float64", [(None, None, None), (None, 1, None), (2, None, None), (2, 1, None), (None, None, 8)])
conv_case("nequip_toluene", "float64", [(None, None, None), (None, 1, None), (2, None, None), (None, None, 8)])
tp_case("mace_large", "float32", [(None, None), (8, None), (2, None), (None, 8)])
conv_case("mace_large", "float32", [(None, None, None), (None, None, 8), (2, None, None)])
json.dump(rows, open(f"{OUT}/jax_sweep.json", "w"), indent=1)
for r in rows:
    print(f"{r['kind']:4} {r['prob']:15} {r['dtype']:7} {str(r.get('block_batch', r.get('block_edges'))):4} "
          f"{str(r.get('segment_edges', '-')):4} nw{r['num_warps']} fwd {r['fwd']:8.0f} fb {r['fb']:8.0f} err {r['err']:.1e} c{r['compile_s']:.0f}s")
