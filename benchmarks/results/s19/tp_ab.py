"""A/B on a GPU: the JAX tensor product with ``pallas_gather_slices`` 0 (the committed package) and 1.

    python benchmarks/results/s19/tp_ab.py            # from the repository root; OUT=dir for tp_ab.json

Per problem (``AB_PROBLEMS``, comma-separated example specs; default the mul_ir problems of
the issue-24 table) and dtype of its spec: generates the key-1 twin of ``examples/specs/<p>.toml``
(Pallas and Helion sources only: the JAX side needs no Triton code) into ``$AB_GEN``
(default /tmp/s19gen), checks that both compute the same (forward and VJP, relative error),
then times each jitted ``tensor_product`` forward and forward + VJP (compiled ahead of time, side by side
in ``AB_THREADS`` threads, default 12) (wall clock to
``block_until_ready``, median of 3 groups) at ``AB_BATCH`` rows (default 20,000, as
bench_tp). Prints one JSON line a case and a table last. On the CPU (interpret mode) it runs too, at
``AB_BATCH=8``: what the local check of this script did.
"""
import concurrent.futures
import importlib
import json
import os
import pathlib
import sys
import time

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from eqdsl.codegen.generate import generate_files, write_package  # noqa: E402
from eqdsl.spec import load_spec  # noqa: E402

PROBLEMS = os.environ.get("AB_PROBLEMS", "mace_large,nequip_toluene,nequip_benzene,mace_medium,nequip_aspirin,"
                          "nequip_water,sevennet_l3i5,nequix_main").split(",")
BATCH = int(os.environ.get("AB_BATCH", "20000"))
GEN = pathlib.Path(os.environ.get("AB_GEN", "/tmp/s19gen"))
KEY = "pallas_gather_slices = 1\n"


def twin(problem: str) -> str:
    """The key-1 package of ``problem``, generated once; its module path."""
    name = f"{problem}_g"
    if not (GEN / name).exists():
        text = (ROOT / "examples" / "specs" / f"{problem}.toml").read_text()
        text = text.replace(f'name = "{problem}"', f'name = "{name}"', 1)
        text = text.replace("[tensor_product.tuning]\n", "[tensor_product.tuning]\n" + KEY, 1) \
            if "[tensor_product.tuning]\n" in text else text + "\n[tensor_product.tuning]\n" + KEY
        GEN.mkdir(parents=True, exist_ok=True)
        (GEN / f"{name}.toml").write_text(text)
        write_package(GEN, generate_files(GEN / f"{name}.toml", GEN, triton=False))
        importlib.invalidate_caches()  # GEN may not have existed when sys.path was first searched
    return name


def timeit(f, args, target=0.2):
    jax.block_until_ready(f(*args))
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    reps = max(3, int(target / max(time.perf_counter() - t, 1e-5)))
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            r = f(*args)
        jax.block_until_ready(r)
        ts.append((time.perf_counter() - t) / reps)
    return float(np.median(ts)) * 1e6


def functions(ops):
    def fwd(x1, x2, w):
        return ops.tensor_product(x1, x2, w)

    def fwd_bwd(x1, x2, w, g):
        out, vjp = jax.vjp(fwd, x1, x2, w)
        return out, vjp(g)

    return jax.jit(fwd), jax.jit(fwd_bwd)


def cases():
    """(problem, dtype, key, ops, args) for every mul_ir problem, dtype of its spec and key."""
    out = []
    for problem in PROBLEMS:
        spec = load_spec(ROOT / "examples" / "specs" / f"{problem}.toml")[0]
        if spec.layout != "mul_ir":
            continue  # no mul_ir tiles: the key changes nothing
        variants = {0: importlib.import_module(f"generated.{problem}.jax_ops"),
                    1: importlib.import_module(f"{twin(problem)}.jax_ops")}
        for dtype in spec.dtypes:
            dt = jnp.dtype(dtype)
            keys = iter(jax.random.split(jax.random.key(0), 4))
            ops0 = variants[0]
            w_shape = (ops0.WEIGHT_NUMEL,) if spec.shared_weights else (BATCH, ops0.WEIGHT_NUMEL)
            args = [jax.random.normal(next(keys), s, dt)
                    for s in ((BATCH, ops0.DIM_IN1), (BATCH, ops0.DIM_IN2), w_shape, (BATCH, ops0.DIM_OUT))]
            out += [(problem, dtype, key, ops, args) for key, ops in variants.items()]
    return out


def compile_case(case):
    """Lower and compile the forward and forward + VJP of one case ahead of time (no call)."""
    _, _, _, ops, args = case
    t = time.perf_counter()
    f, fb = functions(ops)
    compiled = f.lower(*args[:3]).compile(), fb.lower(*args).compile()
    return compiled, time.perf_counter() - t


def main():
    sys.path.insert(0, str(GEN))
    all_cases = cases()
    # XLA compiles outside the GIL: the cases compile side by side, then are timed one at a time
    with concurrent.futures.ThreadPoolExecutor(int(os.environ.get("AB_THREADS", "12"))) as pool:
        futures = [pool.submit(compile_case, c) for c in all_cases]
    rows, reference = [], {}
    for (problem, dtype, key, _, args), fut in zip(all_cases, futures):
        row = {"problem": problem, "dtype": dtype, "gather_slices": key}
        try:
            (f, fb), row["compile_s"] = fut.result()
            row["compile_s"] = round(row["compile_s"], 1)
            out, grads = jax.block_until_ready(fb(*args))
            result = [np.asarray(out)] + [np.asarray(a) for a in grads]
            base = reference.setdefault((problem, dtype), result)
            row["err"] = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))
                             for a, b in zip(result, base))
            row["fwd_us"], row["fwd_bwd_us"] = timeit(f, args[:3]), timeit(fb, args)
        except Exception as e:  # noqa: BLE001 - one failed case must not end the call
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    pathlib.Path(os.environ.get("OUT", "/tmp"), "tp_ab.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{jax.devices()[0].device_kind}, batch {BATCH}, us fwd / fwd+bwd, gather_slices 0 -> 1")
    by = {(r["problem"], r["dtype"], r["gather_slices"]): r for r in rows}
    for (p, dt, k), r in by.items():
        if k == 1 and (p, dt, 0) in by:
            a = by[(p, dt, 0)]
            fmt = lambda x, n: f"{x[n]:9.0f}" if n in x else "    error"  # noqa: E731
            print(f"{p:16s} {dt:8s} {fmt(a, 'fwd_us')} / {fmt(a, 'fwd_bwd_us')} -> "
                  f"{fmt(r, 'fwd_us')} / {fmt(r, 'fwd_bwd_us')}  err {r.get('err', float('nan')):.1e}")


if __name__ == "__main__":
    main()
