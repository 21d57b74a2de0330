#!/usr/bin/env python3
"""GPU check of the symmetric contraction's JAX op (Pallas kernels looping over term tables, issue 27):
compile time, correctness, speed, in one device call.

Problem: MACE-MP's product basis (``examples/specs/mace_mp_products.toml``:
``128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o``, correlation 3, 89 elements, ``mul_ir``),
generated into a temporary directory with the current generator (``--package-dir DIR``
imports ``DIR/mace_mp_products`` instead, e.g. ``generated``), 3,072 nodes whose elements are
drawn from the first ``--elements-used`` (10) elements, random inputs. Per dtype (float32,
float64):

1. compile time (``jax.jit(f).lower(...)``: tracing and the Pallas -> Triton lowering;
   ``.compile()``: XLA and Triton; the first call) of the forward and of the force loss's
   weight gradient: ``energy = sum(out * r)``, ``forces = -d energy / dx``,
   ``loss = sum(forces^2)``, ``d loss / dW`` (second-order kernels: ``fwd_1``, ``bwd_x_1``,
   ``bwd_w_1``);
2. correctness on the first ``--check-nodes`` (192) nodes, failing loudly (``FAILED: ...``,
   exit status 1) before any timing: the forward against the float64 numpy sum of the IR's terms
   (``symmetric_contraction_reference``), the forces and ``d loss / dW`` against JAX's own
   derivatives of a float64 jnp contraction of the same terms (vectorized: gathered monomials,
   one einsum); relative max-norm error at most 1e-5 (float32) or 1e-10 (float64), the
   tolerances of ``tests/tolerances.py``; every value finite;
3. median times (``--reps`` calls after ``--warmup``, each ``jax.block_until_ready``) of the
   jitted forward, ``fwd+bwd`` (``jax.grad`` of ``sum(out * G)`` w.r.t. ``x`` and ``W``) and
   the force loss's weight gradient, per ``--block-nodes`` (rows per program).

It prints one line per step and a table last. Run from the repository root on the GPU machine:

    python benchmarks/symmetric_jax_check.py [--dtypes float32,float64] [--block-nodes 2]
        [--block-channels 128] [--num-warps 4] [--chunk-rows 64] [--nodes 3072]

``--tiny``: a CPU run in interpret mode (``4x0e+4x1o+4x2e -> 4x0e+4x1o``, correlation 3, 40
nodes, two timing calls) that checks the script itself.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64 runs and the float64 reference

import jax.numpy as jnp  # noqa: E402

from eqdsl.irreps import Irreps  # noqa: E402
from eqdsl.symmetric import load_symmetric_specs, lower, parse_symmetric_specs  # noqa: E402
from eqdsl.symmetric import symmetric_contraction_reference  # noqa: E402
from eqdsl.symmetric.pallas import DEFAULT_BLOCK_CHANNELS, generate_symmetric_jax  # noqa: E402

REL_TOL = {"float32": 1e-5, "float64": 1e-10}  # tests/tolerances.py
TINY = ('[[symmetric_contraction]]\nname = "sc_tiny"\nirreps_in = "4x0e+4x1o+4x2e"\nirreps_out = "4x0e+4x1o"\n'
        'correlation = 3\nnum_elements = 5\nlayout = "mul_ir"\n')


class Failed(Exception):
    pass


def jnp_reference(ir):
    """The contraction of the IR's terms in jnp (JAX differentiates it itself): every monomial a
    product of gathered components (padded with a component of ones), every term's weight a
    gathered column, summed into its output component by a 0/1 matrix; rows in ``ir.layout``."""
    in_dims = tuple(mi.ir.dim for mi in Irreps(ir.irreps_in))
    degree = max(t.nu for t in ir.terms)
    mono = np.array([t.monomial + (ir.dim_in,) * (degree - t.nu) for t in ir.terms])
    cols = np.array([ir.weight_offsets[t.out][t.nu - 1] + t.k * ir.mul for t in ir.terms])[:, None] + np.arange(ir.mul)
    coeff = np.array([t.coeff for t in ir.terms])[:, None]
    rows = np.cumsum((0,) + ir.out_dims)[[t.out for t in ir.terms]] + np.array([t.m for t in ir.terms])
    scatter = np.zeros((sum(ir.out_dims), len(ir.terms)))
    scatter[rows, np.arange(len(ir.terms))] = 1.0

    def channels(a, dims):
        blocks, s = [], 0
        for d in dims:
            b = a[:, s:s + d * ir.mul]
            blocks.append(b.reshape(-1, ir.mul, d).transpose(0, 2, 1) if ir.layout == "mul_ir"
                          else b.reshape(-1, d, ir.mul))
            s += d * ir.mul
        return jnp.concatenate(blocks, axis=1)

    def f(x, w, elem):
        xc = channels(x, in_dims)
        xe = jnp.concatenate([xc, jnp.ones_like(xc[:, :1])], axis=1)
        p = jnp.prod(xe[:, mono, :], axis=2) * coeff * w[elem][:, cols]
        out = jnp.einsum("rt,ntc->nrc", scatter, p)
        blocks, s = [], 0
        for d in ir.out_dims:
            b = out[:, s:s + d]
            blocks.append((b.transpose(0, 2, 1) if ir.layout == "mul_ir" else b).reshape(x.shape[0], -1))
            s += d
        return jnp.concatenate(blocks, axis=1)

    return f


def force_loss_grad(contract, r):
    """``d loss / dW`` and the forces, ``loss = sum(forces^2)``, ``forces = -d sum(out * r) / dx``."""
    def energy(x, w, e):
        return jnp.sum(contract(x, w, e) * r)

    def loss(x, w, e):
        forces = -jax.grad(energy)(x, w, e)
        return jnp.sum(forces ** 2), forces

    def grads(x, w, e):
        gw, forces = jax.grad(loss, argnums=1, has_aux=True)(x, w, e)
        return gw, forces

    return grads


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - want).max() / np.abs(want).max())


def check(what: str, got, want, dtype: str, log) -> float:
    err = rel_err(got, want)
    ok = err <= REL_TOL[dtype] and np.abs(np.asarray(want)).max() > 0
    log(f"  check {what:<22} {dtype}: max rel err {err:.2e} (tol {REL_TOL[dtype]:.0e}) {'ok' if ok else 'FAILED'}")
    if not ok:
        raise Failed(f"{what} {dtype}: relative error {err:.3e} above {REL_TOL[dtype]:.0e}")
    return err


def compile_times(f, args) -> tuple[float, float, float, object]:
    """``(lower s, compile s, first call s, compiled)``."""
    t0 = time.perf_counter()
    lowered = jax.jit(f).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, compiled


def median_ms(f, args, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--nodes", type=int, default=3072)
    ap.add_argument("--elements-used", type=int, default=10)
    ap.add_argument("--check-nodes", type=int, default=192)
    ap.add_argument("--block-nodes", default="2", help="rows per program, comma-separated (runtime)")
    ap.add_argument("--block-channels", type=int, default=DEFAULT_BLOCK_CHANNELS, help="lanes (generation)")
    ap.add_argument("--chunk-rows", type=int, default=None, help="bwd_w rows per program (runtime CHUNK_ROWS)")
    ap.add_argument("--num-warps", type=int, default=None, help="Triton warps per program (default 4)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--package-dir", default=None, help="import <dir>/mace_mp_products instead of generating it")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run (interpret mode, small irreps)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.nodes, args.check_nodes, args.warmup, args.reps, args.elements_used = 40, 40, 1, 2, 5
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    if not args.tiny and jax.default_backend() != "gpu":
        raise SystemExit("FAILED: no GPU (use --tiny for the CPU smoke run)")
    if args.chunk_rows:
        from eqdsl.runtime.jax import symmetric as runtime

        runtime.CHUNK_ROWS = args.chunk_rows
    if args.num_warps:
        from eqdsl.runtime.jax import launch

        launch.NUM_WARPS = args.num_warps  # read by launch.compiler_params at each launch

    if args.tiny:
        (spec,) = parse_symmetric_specs(TINY)
    else:
        (spec,) = load_symmetric_specs(ROOT / "examples/specs/mace_mp_products.toml")
    t = time.perf_counter()
    ir = lower(spec)
    log(f"IR {ir.name}: {len(ir.terms)} terms, lowered in {time.perf_counter() - t:.1f} s")
    if args.package_dir:
        root = str(Path(args.package_dir).resolve())
    else:
        root = tempfile.mkdtemp(prefix="sc_jax_check_")
        generate_symmetric_jax(ir, root, block_channels=args.block_channels)
    sys.path.insert(0, root)
    ops = importlib.import_module(f"{ir.name}.jax_ops")
    kernels = importlib.import_module(f"{ir.name}.pallas_kernels")
    src = Path(kernels.__file__).read_text()
    log(f"package {root}/{ir.name}: pallas_kernels.py {len(src):,} bytes, {len(src.splitlines())} lines, "
        f"{len(kernels.KERNELS)} kernels, lanes {kernels.BLOCK_CHANNELS}")

    rng = np.random.default_rng(0)
    n = args.nodes
    x64 = rng.normal(size=(n, ir.dim_in * ir.mul)) * 0.5
    w64 = rng.normal(size=(ir.num_elements, ir.weight_numel)) / np.sqrt(8.0)
    elem = rng.integers(0, min(args.elements_used, ir.num_elements), n).astype(np.int32)
    r64 = rng.normal(size=(n, sum(ir.out_dims) * ir.mul))
    g64 = rng.normal(size=r64.shape)
    k = min(args.check_nodes, n)
    ref = jnp_reference(ir)
    t = time.perf_counter()
    want_fwd = symmetric_contraction_reference(x64[:k], w64, elem[:k], ir)
    want_gw, want_forces = jax.jit(force_loss_grad(ref, jnp.asarray(r64[:k])))(
        jnp.asarray(x64[:k]), jnp.asarray(w64), jnp.asarray(elem[:k]))
    log(f"float64 references on {k} nodes: {time.perf_counter() - t:.1f} s")

    rows, failures = [], []
    for dtype in args.dtypes.split(","):
        x, w, r, g = (jnp.asarray(a, dtype) for a in (x64, w64, r64, g64))
        e = jnp.asarray(elem)
        for bn in (int(b) for b in args.block_nodes.split(",")):
            def sc(x, w, e, bn=bn):
                return ops.symmetric_contraction(x, w, e, block_nodes=bn)

            fwd = sc
            fwd_bwd = jax.grad(lambda x, w, e: jnp.sum(sc(x, w, e) * g), argnums=(0, 1))
            force = force_loss_grad(sc, r)
            log(f"{dtype}, block_nodes {bn}:")
            lo_f, co_f, first_f, c_fwd = compile_times(fwd, (x, w, e))
            log(f"  compile fwd: lower {lo_f:.2f} s, compile {co_f:.2f} s, first call {first_f:.2f} s")
            lo_l, co_l, first_l, c_force = compile_times(force, (x, w, e))
            log(f"  compile d loss/dW: lower {lo_l:.2f} s, compile {co_l:.2f} s, first call {first_l:.2f} s")
            c_fb = jax.jit(fwd_bwd).lower(x, w, e).compile()
            try:
                errs = [check("forward", jax.jit(fwd)(x[:k], w, e[:k]), want_fwd, dtype, log)]
                gw, forces = jax.jit(force_loss_grad(sc, r[:k]))(x[:k], w, e[:k])
                errs.append(check("forces", forces, want_forces, dtype, log))
                errs.append(check("d loss/dW", gw, want_gw, dtype, log))
            except Failed as exc:
                failures.append(str(exc))
                continue
            t_fwd = median_ms(c_fwd, (x, w, e), args.warmup, args.reps)
            t_fb = median_ms(c_fb, (x, w, e), args.warmup, args.reps)
            t_force = median_ms(c_force, (x, w, e), args.warmup, args.reps)
            log(f"  fwd {t_fwd:.3f} ms, fwd+bwd {t_fb:.3f} ms, force loss dW {t_force:.3f} ms")
            rows.append((dtype, bn, lo_f + co_f + first_f, lo_l + co_l + first_l, t_fwd, t_fb, t_force, max(errs)))

    log("")
    log(f"{ir.name}, {n} nodes, {jax.devices()[0].device_kind}, lanes {kernels.BLOCK_CHANNELS}, "
        f"warps {args.num_warps or 4}:")
    log("| dtype | block_nodes | compile fwd (s) | compile dloss/dW (s) | fwd (ms) | fwd+bwd (ms) | "
        "dloss/dW (ms) | max rel err |")
    log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype, bn, cf, cl, tf, tfb, tl, err in rows:
        log(f"| {dtype} | {bn} | {cf:.1f} | {cl:.1f} | {tf:.3f} | {tfb:.3f} | {tl:.3f} | {err:.1e} |")
    if failures:
        for f in failures:
            log(f"FAILED: {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
