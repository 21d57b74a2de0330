"""s16 A/B: JAX conv with the conv kernel sets split (pallas_conv_max_terms) and run as one launch over a
(node, kernel) grid (launch.SEGMENT_PARTS) or in series. Compiles in parallel worker processes (persistent
JAX cache), then times in one process. Usage: conv_ab.py compile <i> <n> | time."""
import os, sys, time, json, itertools, pathlib, importlib, re
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", "/tmp/jaxcache")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import jax.numpy as jnp
from eqdsl.codegen.generate import generate_files, write_package
from eqdsl.runtime.jax import launch
import bench_conv as bc

PKG = pathlib.Path(os.environ.get("AB_PKG", "/tmp/abpkgs")); PKG.mkdir(exist_ok=True)
VARIANTS = {  # name -> (spec, conv_max_terms or None, conv_fused_max_terms or None)
    "nt_one": ("nequip_toluene", None, None),
    "nt_140": ("nequip_toluene", 140, None),
    "nt_70": ("nequip_toluene", 70, None),
    "nt_48": ("nequip_toluene", 48, None),
    "nt_32": ("nequip_toluene", 32, None),
    "nt_24": ("nequip_toluene", 24, None),
    "nt_96": ("nequip_toluene", 96, None),
    "nt_200": ("nequip_toluene", 200, None),
    "ml_72": ("mace_large", 72, "keep"),
    "ml_36": ("mace_large", 36, "keep"),
}
GRAPHS = os.environ.get("AB_GRAPHS", "rand512x64,bulk").split(",")
DTYPES = os.environ.get("AB_DTYPES", "float32,float64").split(",")


def spec_text(base, mt, fmt):
    t = (ROOT / "examples/specs" / f"{base}.toml").read_text()
    t = re.sub(r"^pallas_conv_max_terms = .*\n", "", t, flags=re.M)
    if fmt != "keep":
        t = re.sub(r"^pallas_conv_fused_max_terms = .*\n", "", t, flags=re.M)
    if mt is not None:
        t = t.replace("[tensor_product.tuning]\n", f"[tensor_product.tuning]\npallas_conv_max_terms = {mt}\n", 1)
    return t


def package(v):
    base, mt, fmt = VARIANTS[v]
    name = f"ab_{v}"
    out = PKG / f"pkg_{name}"
    if not (out / "jax_ops.py").exists() and not (out / base / "jax_ops.py").exists():
        t = spec_text(base, mt, fmt).replace(f'name = "{base}"', f'name = "{base}"', 1)
        spec = PKG / f"{name}.toml"; spec.write_text(t)
        write_package(out, generate_files(spec, out, triton=False))
    if str(PKG) not in sys.path:
        sys.path.insert(0, str(PKG))
    importlib.invalidate_caches()
    return importlib.import_module(f"pkg_{name}.{base}.jax_ops")


def graph(label):
    if label == "bulk":
        return bc.diamond_graph("bulk", "Si", 8, 5.0)
    n, d = {"rand512x64": (512, 64), "rand4096x32": (4096, 32), "tiny": (32, 16)}[label]
    return bc.random_graph(label, n, d, 0)


CASES = [  # (variant, parts, num_warps, graph, dtype), most wanted first
    ("nt_48", False, 4, "bulk", "float64"), ("nt_48", True, 4, "bulk", "float64"),
    ("nt_140", False, 4, "bulk", "float32"), ("nt_140", True, 4, "bulk", "float32"),
    ("nt_48", False, 4, "rand512x64", "float64"), ("nt_48", True, 4, "rand512x64", "float64"),
    ("nt_140", False, 4, "rand512x64", "float32"), ("nt_140", True, 4, "rand512x64", "float32"),
    ("ml_72", False, 4, "bulk", "float32"), ("ml_72", True, 4, "bulk", "float32"),
    ("ml_72", False, 4, "bulk", "float64"), ("ml_72", True, 4, "bulk", "float64"),
    ("nt_140", False, 4, "tiny", "float32"), ("nt_140", True, 4, "tiny", "float32"),
]


def cases():
    yield from CASES


def fns(ops, parts, n, warps=4):
    jax.clear_caches()  # the ops' own jitted functions cache their traces: re-trace with this flag
    launch.SEGMENT_PARTS = parts
    ops._kernels.NUM_WARPS = warps
    def fwd(x, y, w, s, d):
        return ops.conv(x, y, w, s, d, n, check=False)
    def fb(x, y, w, g, s, d):
        out, vjp = jax.vjp(lambda a, b, c: ops.conv(a, b, c, s, d, n, check=False), x, y, w)
        return out, vjp(g)
    return jax.jit(fwd), jax.jit(fb)


def inputs(ops, gr, dt, seed=0):
    keys = iter(jax.random.split(jax.random.key(seed), 4))
    dim1, dim2, wn, do = ops.DIM_IN1, ops.DIM_IN2, ops.WEIGHT_NUMEL, ops.DIM_OUT
    e = len(gr.src)
    f = lambda *s: jax.random.normal(next(keys), s, dt)
    return (f(gr.num_nodes, dim1), f(e, dim2), f(e, wn), f(gr.num_nodes, do),
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


def main():
    mode = sys.argv[1]
    allc = list(cases())
    if mode == "gen":
        for v in VARIANTS:
            package(v)
        print("generated", len(VARIANTS)); return
    if mode == "compile":
        i, n = int(sys.argv[2]), int(sys.argv[3])
        graphs = {}
        for k, (v, parts, g, dt) in enumerate(allc):
            if k % n != i:
                continue
            t = time.perf_counter()
            try:
                ops = package(v)
                gr = graphs.setdefault(g, graph(g))
                x, y, w, G, s, d = inputs(ops, gr, dt)
                jf, jfb = fns(ops, parts, gr.num_nodes)
                jf.lower(x, y, w, s, d).compile(); jfb.lower(x, y, w, G, s, d).compile()
                print(f"compiled {v} parts={parts} {g} {dt} {time.perf_counter() - t:.1f}s", flush=True)
            except Exception as e:  # noqa
                print(f"FAIL compile {v} parts={parts} {g} {dt}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return
    rows, refs, graphs = [], {}, {}
    budget = float(os.environ.get("AB_BUDGET", "400")); t0 = time.perf_counter()
    for v, parts, warps, g, dt in allc:
        if time.perf_counter() - t0 > budget:
            print("budget reached"); break
        try:
            ops = package(v)
            gr = graphs.setdefault(g, graph(g))
            args = inputs(ops, gr, dt)
            x, y, w, G, s, d = args
            jf, jfb = fns(ops, parts, gr.num_nodes, warps)
            tc = time.perf_counter(); out, grads = jfb(x, y, w, G, s, d); jax.block_until_ready(out); tc = time.perf_counter() - tc
            key = (VARIANTS[v][0], g, dt)
            res = [np.asarray(out)] + [np.asarray(a) for a in grads]
            if key not in refs:
                refs[key] = res
            err = max(float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)) for a, b in zip(res, refs[key]))
            tf = timeit(jf, (x, y, w, s, d)); tfb = timeit(jfb, (x, y, w, G, s, d))
            row = dict(v=v, parts=parts, warps=warps, graph=g, dtype=dt, fwd=tf, fb=tfb, err=err, first_call_s=tc)
        except Exception as e:  # noqa
            row = dict(v=v, parts=parts, warps=warps, graph=g, dtype=dt, error=f"{type(e).__name__}: {str(e)[:300]}")
        rows.append(row); print(json.dumps(row), flush=True)
    out = os.environ.get("OUT", "/tmp")
    json.dump(rows, open(f"{out}/conv_ab.json", "w"), indent=1)
    print("| variant | parts | graph | dtype | fwd µs | fwd+bwd µs | err vs first |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['v']} | {r['parts']} w{r.get('warps')} | {r['graph']} | {r['dtype']} | {r['error'][:60]} | | |")
        else:
            print(f"| {r['v']} | {r['parts']} w{r.get('warps')} | {r['graph']} | {r['dtype']} | {r['fwd']:.0f} | {r['fb']:.0f} | {r['err']:.1e} |")


if __name__ == "__main__":
    main()
