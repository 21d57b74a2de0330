"""s18 A/B: JAX conv segment kernels: Triton num_stages (launch.NUM_STAGES), warps, edges per tile;
committed packages (generated/)."""
import os, sys, time, json, pathlib, importlib, functools
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from eqdsl.runtime.jax import launch
import bench_conv as bc

_orig_segments = launch.launch_segments
PKGS = {"nt": "generated.nequip_toluene", "ml": "generated.mace_large",
        "nti": "twins.nequip_toluene_irmul", "mli": "twins.mace_large_irmul",
        "nto": "old.nequip_toluene", "mlo": "old.mace_large"}  # old: HEAD's packages (mul_ir conv kernels)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
GRAPHS = {}


def package(v):
    return importlib.import_module(f"{PKGS[v]}.jax_ops")


def graph(label):
    if label not in GRAPHS:
        if label == "bulk":
            GRAPHS[label] = bc.diamond_graph("bulk", "Si", 8, 5.0)
        else:
            n, d = {"rand512x64": (512, 64), "rand4096x32": (4096, 32), "tiny": (32, 16)}[label]
            GRAPHS[label] = bc.random_graph(label, n, d, 0)
    return GRAPHS[label]


def C(v, g, dt, unroll=1, warps=4, se=None, ss=False, st=1):
    return dict(v=v, graph=g, dtype=dt, unroll=unroll, warps=warps, se=se, ss=ss, st=st)


CASES = [C(*c) if isinstance(c, (list, tuple)) else c for c in json.loads(os.environ.get("AB_CASES", "null")) or []] or [
    C("nt", "bulk", "float64", se=1), C("nt", "bulk", "float64", se=2), C("nt", "bulk", "float64", se=2, warps=2),
    C("nt", "bulk", "float64", se=4), C("nt", "bulk", "float64", se=2, ss=True),
    C("ml", "bulk", "float64", se=2), C("ml", "bulk", "float64", se=4), C("ml", "bulk", "float64", se=2, warps=2),
    C("ml", "bulk", "float64", se=1, warps=2),
    C("nt", "rand512x64", "float64", se=1), C("nt", "rand512x64", "float64", se=2),
    C("nt", "rand512x64", "float64", se=4),
    C("nt", "bulk", "float32", se=2), C("nt", "bulk", "float32", se=4), C("nt", "bulk", "float32", se=2, warps=2),
    C("ml", "bulk", "float32", se=2), C("ml", "bulk", "float32", se=4),
    C("nt", "rand512x64", "float32", se=2), C("nt", "rand512x64", "float32", se=4),
    C("nt", "tiny", "float32", se=2), C("nt", "tiny", "float32", se=4),
    C("nt", "bulk", "float64", se=4, ss=True),
]


def fns(ops, c, n):
    jax.clear_caches()  # the ops' own jitted functions cache their traces: re-trace with these switches
    launch.launch_segments = functools.partial(_orig_segments, step_sums=True) if c["ss"] else _orig_segments
    ops._kernels.NUM_WARPS = c["warps"]
    launch.NUM_STAGES = c.get("st", 1)
    kw = {} if c["se"] is None else {"segment_edges": c["se"]}

    def fwd(x, y, w, s, d):
        return ops.conv(x, y, w, s, d, n, check=False, **kw)

    def fb(x, y, w, g, s, d):
        out, vjp = jax.vjp(lambda a, b, cc: ops.conv(a, b, cc, s, d, n, check=False, **kw), x, y, w)
        return out, vjp(g)
    return jax.jit(fwd), jax.jit(fb)


def inputs(ops, gr, dt, seed=0):
    keys = iter(jax.random.split(jax.random.key(seed), 4))
    e = len(gr.src)
    f = lambda *s: jax.random.normal(next(keys), s, dt)
    return (f(gr.num_nodes, ops.DIM_IN1), f(e, ops.DIM_IN2), f(e, ops.WEIGHT_NUMEL), f(gr.num_nodes, ops.DIM_OUT),
            jnp.asarray(gr.src.astype(np.int32)), jnp.asarray(gr.dst.astype(np.int32)))


def timeit(f, args, target=0.15):
    jax.block_until_ready(f(*args))
    t = time.perf_counter(); jax.block_until_ready(f(*args)); one = time.perf_counter() - t
    reps = max(3, int(target / max(one, 1e-5)))
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            r = f(*args)
        jax.block_until_ready(r)
        ts.append((time.perf_counter() - t) / reps)
    return float(np.median(ts)) * 1e6


def label(c):
    return f"st{c.get('st', 1)} w{c['warps']} se{c['se'] or '-'}{' ss' if c['ss'] else ''}"


def main():
    rows, refs = [], {}
    budget = float(os.environ.get("AB_BUDGET", "400")); t0 = time.perf_counter()
    for c in CASES:
        if time.perf_counter() - t0 > budget:
            print("budget reached"); break
        row = dict(c)
        try:
            ops = package(c["v"])
            gr = graph(c["graph"])
            dt = jnp.float64 if c["dtype"] == "float64" else jnp.float32
            x, y, w, G, s, d = inputs(ops, gr, dt)
            jf, jfb = fns(ops, c, gr.num_nodes)
            tc = time.perf_counter(); out, grads = jfb(x, y, w, G, s, d); jax.block_until_ready(out)
            tc = time.perf_counter() - tc
            key = (c["v"].rstrip("o"), c["graph"], c["dtype"])  # old and new packages: the same function
            res = [np.asarray(out)] + [np.asarray(a) for a in grads]
            refs.setdefault(key, res)
            err = max(float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)) for a, b in zip(res, refs[key]))
            row.update(fwd=timeit(jf, (x, y, w, s, d)), fb=timeit(jfb, (x, y, w, G, s, d)), err=err, first_call_s=tc)
        except Exception as e:  # noqa
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row); print(json.dumps(row), flush=True)
    out = os.environ.get("OUT", "/tmp")
    json.dump(rows, open(f"{out}/conv_ab.json", "w"), indent=1)
    print("| pkg | graph | dtype | config | fwd µs | fwd+bwd µs | err vs first |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['v']} | {r['graph']} | {r['dtype']} | {label(r)} | {r['error'][:70]} | | |")
        else:
            print(f"| {r['v']} | {r['graph']} | {r['dtype']} | {label(r)} | {r['fwd']:.0f} | {r['fb']:.0f} | {r['err']:.1e} |")


if __name__ == "__main__":
    main()
