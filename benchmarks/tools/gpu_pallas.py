#!/usr/bin/env python3
"""Pallas (JAX) tensor products on the GPU: correctness first, then a block-size grid.

For each problem (default: mace_large, nequip_toluene, nequip_water, mace_medium) at
--batch rows (20,000), float32:

1. checks ``generated/<name>/jax_ops.tensor_product`` and its three gradients (``jax.vjp``)
   against the float64 numpy oracle (``eqdsl.reference``; relative Frobenius error at most
   1e-4, in IEEE precision), at the default config, and once more at every grid point;
2. times the jitted forward and forward+backward (``jax.vjp`` + the VJP) for every
   ``block_batch`` x ``num_warps`` of the grid (``--block-batch``, ``--num-warps``);
3. times e3nn-jax (``e3nn_jax.legacy.FunctionalTensorProduct`` vmapped, as bench_tp.py),
   if it imports, on the same inputs;
4. prints a table (µs, median; GB/s against the bytes a pass must move) and the best
   config per problem, as the ``[tensor_product.tuning]`` keys this would pin
   (``pallas_block_batch``, ``pallas_num_warps``).

num_warps is read from ``pallas_kernels.NUM_WARPS`` when a call is traced, so the grid
sets that module constant and clears JAX's caches between configs. Timing: wall clock over
groups of calls ended by ``block_until_ready`` (the bench_tp.py method), inputs rotating
over sets larger than the L2 cache.

Usage on the device machine (from the repository root, with the carried wheels on
PYTHONPATH as in run_device.sh; e3nn-jax is optional):

    python3 benchmarks/tools/gpu_pallas.py                       # all four problems, full grid
    python3 benchmarks/tools/gpu_pallas.py --problems mace_large --block-batch 4,8 --num-warps 4
    python3 benchmarks/tools/gpu_pallas.py --json $OUT/gpu_pallas.json

Runs on the CPU too (--quick: batch 64, interpret mode, one config: a smoke test).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DEFAULT_PROBLEMS = "mace_large,nequip_toluene,nequip_water,mace_medium"
TOL = 1e-4


def one_line(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".splitlines() or [""])[0][:200]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS)
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--block-batch", default="2,4,8,16,32")
    ap.add_argument("--num-warps", default="2,4,8")
    ap.add_argument("--target-s", type=float, default=0.3, help="timing seconds per measurement")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: batch 64, interpret, one config")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from eqdsl.reference import tensor_product_reference, tensor_product_vjp_reference
    from eqdsl.spec import load_spec
    from eqdsl.lower import lower

    on_gpu = jax.default_backend() == "gpu"
    interpret = not on_gpu
    if args.quick:
        args.batch, args.block_batch, args.num_warps, args.target_s = 64, "4", "4", 0.05
    grid = [(bb, nw) for bb in map(int, args.block_batch.split(",")) for nw in map(int, args.num_warps.split(","))]
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}", flush=True)
    jax.config.update("jax_default_matmul_precision", "highest")

    def rel_err(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))

    from benchmarks.bench_tp import Timer  # the same JAX timing as the benchmark tables

    timer = Timer(None, args.target_s * 1e3, args.quick)

    def timeit(call, nsets: int) -> float:
        """Median µs per call (wall clock over groups of calls ended by block_until_ready)."""
        return timer.jax_time(call, nsets)[0]

    specs = {s.name: s for f in sorted((ROOT / "examples" / "specs").glob("*.toml")) for s in load_spec(f)}
    rows, best, failures = [], {}, []
    for name in [n.strip() for n in args.problems.split(",") if n.strip()]:
        spec = specs[name]
        ir = lower(spec)
        ops = importlib.import_module(f"generated.{name}.jax_ops")
        kern = ops._kernels
        B = args.batch
        rng = np.random.default_rng(0)
        wshape = (ir.weight_numel,) if ir.shared_weights else (B, ir.weight_numel)
        item = 4
        ins = ir.dim_in1 + ir.dim_in2 + (0 if ir.shared_weights else ir.weight_numel)
        bytes_f, bytes_fb = item * B * (ins + ir.dim_out), item * B * (3 * ins + 2 * ir.dim_out)
        # input sets: enough to exceed a 50 MB L2 several times over
        nsets = 1 if args.quick else max(2, min(8, int(4 * 50e6 / bytes_f) + 1))
        sets64 = [(rng.normal(size=(B, ir.dim_in1)), rng.normal(size=(B, ir.dim_in2)), rng.normal(size=wshape),
                   rng.normal(size=(B, ir.dim_out))) for _ in range(nsets)]
        sets = [tuple(jnp.asarray(t, jnp.float32) for t in s) for s in sets64]
        x1, x2, w, g = sets64[0]
        want = (tensor_product_reference(ir, x1, x2, w),) + tuple(tensor_product_vjp_reference(ir, x1, x2, w, g))
        print(f"\n== {name}: batch {B}, {nsets} input sets, default block_batch {kern.BLOCK_BATCH}, "
              f"num_warps {kern.NUM_WARPS}; floor bytes fwd {bytes_f / 1e6:.0f} MB, fwd+bwd {bytes_fb / 1e6:.0f} MB",
              flush=True)

        def make(bb):
            f = jax.jit(lambda a, c, d: ops.tensor_product(a, c, d, block_batch=bb, interpret=interpret))

            def fb(a, c, d, e):
                out, vjp = jax.vjp(lambda a, c, d: ops.tensor_product(a, c, d, block_batch=bb, interpret=interpret),
                                   a, c, d)
                return out, vjp(e)

            return f, jax.jit(fb)

        def check(f, fb) -> float:
            a, c, d, e = sets[0]
            out, (ga, gc, gd) = fb(a, c, d, e)
            errs = [rel_err(f(a, c, d), want[0])] + [rel_err(t, r) for t, r in zip((out, ga, gc, gd), (want[0],) + want[1:])]
            return max(errs)

        default_nw = kern.NUM_WARPS
        results = []
        for bb, nw in grid:
            kern.NUM_WARPS = nw
            jax.clear_caches()
            label = f"eqdsl_jax bb={bb} nw={nw}"
            try:
                f, fb = make(bb)
                err = check(f, fb)
                if not err <= TOL:
                    failures.append(f"{name} {label}: BAD, max relative error {err:.2e}")
                    rows.append((name, label, err, None, None))
                    print(f"  {label}: BAD err {err:.2e}", flush=True)
                    continue
                tf = timeit(lambda i: f(*sets[i][:3]), nsets)
                tfb = timeit(lambda i: fb(*sets[i]), nsets)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported, not fatal
                failures.append(f"{name} {label}: {one_line(e)}")
                traceback.print_exc(limit=2)
                rows.append((name, label, None, None, None))
                continue
            rows.append((name, label, err, tf, tfb))
            results.append((tf + tfb, bb, nw, tf, tfb))
            print(f"  {label}: err {err:.1e}  fwd {tf:8.1f} us ({bytes_f / tf / 1e3:6.0f} GB/s)  "
                  f"fwd+bwd {tfb:8.1f} us ({bytes_fb / tfb / 1e3:6.0f} GB/s)", flush=True)
        kern.NUM_WARPS = default_nw
        jax.clear_caches()
        if results:
            _, bb, nw, tf, tfb = min(results)
            best[name] = {"pallas_block_batch": bb, "pallas_num_warps": nw, "fwd_us": tf, "fwd_bwd_us": tfb}
        try:
            import e3nn_jax as e3nn
            from e3nn_jax.legacy import FunctionalTensorProduct

            tp = FunctionalTensorProduct(
                ir.irreps_in1, ir.irreps_in2, ir.irreps_out, [i.as_tuple() for i in spec.instructions],
                irrep_normalization=spec.irrep_normalization, path_normalization=spec.path_normalization,
                gradient_normalization="path")
            if spec.layout != "mul_ir":
                raise RuntimeError("e3nn-jax takes mul_ir rows; this spec is " + spec.layout)
            one = lambda w, a, b: tp.left_right(w, e3nn.IrrepsArray(tp.irreps_in1, a),  # noqa: E731
                                                e3nn.IrrepsArray(tp.irreps_in2, b)).array
            vf = jax.vmap(one, in_axes=(None if ir.shared_weights else 0, 0, 0))
            ef = jax.jit(lambda a, c, d: vf(d, a, c))

            def efb(a, c, d, e):
                out, vjp = jax.vjp(lambda a, c, d: vf(d, a, c), a, c, d)
                return out, vjp(e)

            efb = jax.jit(efb)
            err = check(ef, efb)
            tf = timeit(lambda i: ef(*sets[i][:3]), nsets)
            tfb = timeit(lambda i: efb(*sets[i]), nsets)
            rows.append((name, "e3nn_jax", err, tf, tfb))
            print(f"  e3nn_jax: err {err:.1e}  fwd {tf:8.1f} us  fwd+bwd {tfb:8.1f} us", flush=True)
            if name in best:
                best[name]["vs_e3nn_jax_fwd"] = tf / best[name]["fwd_us"]
                best[name]["vs_e3nn_jax_fwd_bwd"] = tfb / best[name]["fwd_bwd_us"]
        except Exception as e:  # noqa: BLE001 - optional comparison
            rows.append((name, "e3nn_jax", None, None, None))
            print(f"  e3nn_jax: n/a ({one_line(e)})", flush=True)

    print("\n| problem | impl / config | max rel err | fwd us | fwd+bwd us |\n| --- | --- | ---: | ---: | ---: |")
    for name, label, err, tf, tfb in rows:
        fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
        print(f"| {name} | {label} | {fmt(err, '.1e')} | {fmt(tf, '.1f')} | {fmt(tfb, '.1f')} |")
    print("\nBest config per problem (min of fwd + fwd+bwd), as [tensor_product.tuning] keys:")
    for name, b in best.items():
        extra = "".join(f", {k} {v:.2f}x" for k, v in b.items() if k.startswith("vs_"))
        print(f"  {name}: pallas_block_batch = {b['pallas_block_batch']}, pallas_num_warps = {b['pallas_num_warps']}"
              f"  (fwd {b['fwd_us']:.1f} us, fwd+bwd {b['fwd_bwd_us']:.1f} us{extra})")
    for f in failures:
        print("FAILED:", f)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "best": best, "failures": failures,
                                               "batch": args.batch, "jax": jax.__version__}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
