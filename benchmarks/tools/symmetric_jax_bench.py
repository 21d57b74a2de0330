#!/usr/bin/env python3
"""GPU benchmark of the generated symmetric contraction's JAX entry point (issue 27, Pallas).

Problem: MACE-MP's product basis, ``128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o``,
correlation 3, 10 elements, 3,072 nodes (6 x 512-atom cells), random inputs and weights.

For each dtype (``--dtypes``, float32 and float64), layout (``--layouts``: ``mul_ir``, e3nn's
and MACE's rows; ``ir_mul``, cuEquivariance's) and channel block (``--block-channels``: the
kernels' lanes, fixed at generation):

1. generates the JAX package (``eqdsl.symmetric.pallas.generate_symmetric_jax``) into a
   temporary directory and imports it;
2. checks, failing loudly (``FAILED: ...``, exit 1) before any timing: the forward on all
   nodes against the float64 numpy sum of the IR's terms (``symmetric_contraction_reference``;
   the IR's terms equal mace's dense U contraction, tests/test_symmetric_reference.py), and
   ``d<out, G>/dx``, ``d<out, G>/dW`` and the gradients of a force loss
   (``|d<out, G>/dx|^2`` w.r.t. ``x`` and ``W``: the second-order kernels) on the first 256
   nodes against JAX's own derivatives of a float64 jnp contraction of the same terms
   (vectorized: gathered monomials, one einsum); relative max-norm error at most ``1e-5``
   (float32, ``tests/tolerances.py``) or ``1e-10`` (float64); every value finite;
3. times with ``jax.jit`` (median over ``--reps`` calls after ``--warmup``, each call
   ``block_until_ready``): ``fwd``; ``fwd+bwd`` (``jax.grad`` of ``<out, G>`` w.r.t. ``x`` and
   ``W``); with ``--forces`` also ``forces`` (the force loss's gradients w.r.t. ``x`` and ``W``),
   for every ``--block-nodes`` (rows per program; runtime). The first call's compile time is
   printed too.

Last, the memory floors (each array read or written once, 3.35 TB/s, H100 SXM HBM3):
``fwd`` reads ``x``, ``W`` and writes ``out``; ``fwd+bwd`` adds reading ``G`` (and ``x``,
``W`` again) and writing ``dx``, ``dW``.

Run from the repository root on the GPU machine (jax with CUDA):

    python benchmarks/tools/symmetric_jax_bench.py [--dtypes float32,float64] [--layouts mul_ir,ir_mul]
        [--block-channels 16,32] [--block-nodes 4,8,16] [--chunk-rows 64] [--forces]
        [--nodes 3072 --elements 10]

Each block size compiles its own kernels (Triton, on the first call: printed); for the
10-minute limit of one device call, sweep one dtype / layout per call.

``--quick``: a CPU smoke run (interpret mode, ``4x0e+4x1o -> 4x0e+4x1o``, 64 nodes, one
timing call). Prints one line per measurement and a JSON summary line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

from eqdsl.irreps import Irreps  # noqa: E402
from eqdsl.symmetric.lower import lower  # noqa: E402
from eqdsl.symmetric.pallas import generate_symmetric_jax  # noqa: E402
from eqdsl.symmetric.reference import symmetric_contraction_reference  # noqa: E402
from eqdsl.symmetric.spec import parse_symmetric_specs  # noqa: E402

PROBLEM = ("128x0e+128x1o+128x2e+128x3o", "128x0e+128x1o")
QUICK = ("4x0e+4x1o", "4x0e+4x1o")
TOL = {"float32": 1e-5, "float64": 1e-10}
HBM_BYTES_PER_S = 3.35e12
CHECK_NODES = 256


def fail(msg: str) -> None:
    print(f"FAILED: {msg}", flush=True)
    sys.exit(1)


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - want).max() / np.abs(want).max())


def jnp_contraction(ir):
    """float64 jnp contraction of the IR's terms, vectorized (JAX differentiates it itself):
    monomials as products of gathered components (padded with a component of ones), each
    term's weight a gathered column, summed into its output row by a 0/1 matrix."""
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
        out = jnp.einsum("rt,ntc->nrc", scatter, p, precision=jax.lax.Precision.HIGHEST)
        blocks, s = [], 0
        for d in ir.out_dims:
            b = out[:, s:s + d]
            blocks.append((b.transpose(0, 2, 1) if ir.layout == "mul_ir" else b).reshape(x.shape[0], -1))
            s += d
        return jnp.concatenate(blocks, axis=1)

    return f


def median_ms(fn, args, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def losses(sc, elem, cot):
    """``fwd``, ``fwd+bwd`` and ``forces`` of a contraction ``sc(x, w, elem)``, jitted."""
    def energy(x, w):
        return jnp.sum(sc(x, w, elem) * cot)

    def force_loss(x, w):
        return jnp.sum(jax.grad(energy)(x, w) ** 2)

    return {"fwd": jax.jit(lambda x, w: sc(x, w, elem)),
            "fwd+bwd": jax.jit(jax.grad(energy, argnums=(0, 1))),
            "forces": jax.jit(jax.grad(force_loss, argnums=(0, 1)))}


def bench(args, layout, dtype, block_channels, root, results):
    irreps_in, irreps_out = QUICK if args.quick else PROBLEM
    name = f"mp_{layout}_{dtype}_c{block_channels}"
    (spec,) = parse_symmetric_specs(
        f'[[symmetric_contraction]]\nname = "{name}"\nirreps_in = "{irreps_in}"\nirreps_out = "{irreps_out}"\n'
        f'correlation = 3\nnum_elements = {args.elements}\nlayout = "{layout}"\n')
    t = time.time()
    ir = lower(spec)
    generate_symmetric_jax(ir, root, levels=1, block_channels=block_channels)
    importlib.invalidate_caches()
    ops = importlib.import_module(f"{name}.jax_ops")
    kernels = importlib.import_module(f"{name}.pallas_kernels")
    print(f"[{name}] lowered, generated and imported in {time.time() - t:.1f} s: {len(ir.terms)} terms, "
          f"{len({t.monomial for t in ir.terms})} monomials, weight_numel {ir.weight_numel}, "
          f"{kernels.BLOCK_CHANNELS} lanes x {kernels.CHANNEL_BLOCKS} channel blocks", flush=True)
    rng = np.random.default_rng(0)
    n = args.nodes
    x64 = rng.normal(size=(n, ir.dim_in * ir.mul))
    w64 = rng.normal(size=(ir.num_elements, ir.weight_numel)) * 0.3
    e_np = rng.integers(0, ir.num_elements, n)
    cot64 = rng.normal(size=(n, sum(ir.out_dims) * ir.mul))
    x, w, cot = (jnp.asarray(a, dtype) for a in (x64, w64, cot64))
    elem = jnp.asarray(e_np, jnp.int32)

    # ---- checks (before any timing)
    t = time.time()
    out = np.asarray(jax.jit(lambda x, w: ops.symmetric_contraction(x, w, elem))(x, w))
    print(f"[{name}] first forward (compile + run) {time.time() - t:.1f} s", flush=True)
    want = symmetric_contraction_reference(np.asarray(x, np.float64), np.asarray(w, np.float64), e_np, ir)
    err = rel(out, want)
    print(f"[{name}] forward vs the IR's terms (numpy float64, all {n} nodes): rel err {err:.2e}", flush=True)
    if not err < TOL[dtype]:
        fail(f"{name}: forward rel err {err:.3e} > {TOL[dtype]:.0e} (or not finite)")
    m = min(n, CHECK_NODES)
    got = losses(ops.symmetric_contraction, elem[:m], cot[:m])
    ref = losses(jnp_contraction(ir), elem[:m], jnp.asarray(cot64[:m]))
    xs, ws = x[:m], w
    xd, wd = jnp.asarray(np.asarray(xs, np.float64)), jnp.asarray(np.asarray(ws, np.float64))
    for label in ("fwd+bwd", "forces"):
        t = time.time()
        g = jax.block_until_ready(got[label](xs, ws))
        print(f"[{name}] first {label} (compile + run, {m} nodes) {time.time() - t:.1f} s", flush=True)
        r = ref[label](xd, wd)
        for what, a, b in zip(("dx", "dW"), g, r):
            err = rel(a, b)
            print(f"[{name}] {label} {what} vs jax of the jnp contraction (float64, first {m} nodes): "
                  f"rel err {err:.2e}", flush=True)
            if not err < TOL[dtype]:
                fail(f"{name}: {label} {what} rel err {err:.3e} > {TOL[dtype]:.0e} (or not finite)")

    # ---- timings
    isz = np.dtype(dtype).itemsize
    floor_fwd = (x.size + w.size + out.size) * isz
    floor_bwd = (x.size + w.size + cot.size + x.size + w.size) * isz
    row = {"floor_fwd_bytes": floor_fwd, "floor_fwd_us": floor_fwd / HBM_BYTES_PER_S * 1e6,
           "floor_fwd_bwd_bytes": floor_fwd + floor_bwd,
           "floor_fwd_bwd_us": (floor_fwd + floor_bwd) / HBM_BYTES_PER_S * 1e6}
    labels = ("fwd", "fwd+bwd") + (("forces",) if args.forces else ())
    for bn in (int(b) for b in args.block_nodes.split(",")):
        sc = lambda x, w, e, bn=bn: ops.symmetric_contraction(x, w, e, block_nodes=bn)  # noqa: E731
        fns = losses(sc, elem, cot)
        for label in labels:
            t = time.time()
            jax.block_until_ready(fns[label](x, w))
            first = time.time() - t
            ms = median_ms(fns[label], (x, w), args.warmup, args.reps)
            row[f"{label}_bn{bn}_ms"] = ms
            print(f"[{name}] block_nodes {bn}: {label} {ms * 1e3:.1f} us (median of {args.reps}; "
                  f"first call {first:.1f} s)", flush=True)
    print(f"[{name}] memory floor: fwd {floor_fwd} bytes = {row['floor_fwd_us']:.1f} us, fwd+bwd "
          f"{floor_fwd + floor_bwd} bytes = {row['floor_fwd_bwd_us']:.1f} us at 3.35 TB/s", flush=True)
    results[name] = row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3072)
    p.add_argument("--elements", type=int, default=10)
    p.add_argument("--dtypes", default="float32,float64")
    p.add_argument("--layouts", default="mul_ir,ir_mul")
    p.add_argument("--block-channels", default="16", help="comma list (each a package: kernels compile per value)")
    p.add_argument("--block-nodes", default="8", help="comma list of rows per program")
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="rows per bwd_w program (eqdsl.runtime.jax.symmetric.CHUNK_ROWS, default 64)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--forces", action="store_true", help="also time the force loss's gradients")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny irreps, 64 nodes, interpret mode")
    args = p.parse_args()
    if args.quick:
        args.nodes, args.reps, args.warmup, args.block_nodes = 64, 1, 0, "8"
        args.block_channels = "2"
    elif jax.default_backend() != "gpu":
        fail(f"JAX's default backend is {jax.default_backend()!r}: this benchmark times GPU kernels "
             "(--quick for a CPU smoke run)")
    if args.chunk_rows:
        from eqdsl.runtime.jax import symmetric as runtime

        runtime.CHUNK_ROWS = args.chunk_rows
    print(f"jax {jax.__version__}, device {jax.devices()[0].device_kind}", flush=True)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="eqdsl-sc-jax-bench-") as tmp:
        sys.path.insert(0, tmp)
        for dtype in args.dtypes.split(","):
            for layout in args.layouts.split(","):
                for bc in (int(c) for c in args.block_channels.split(",")):
                    bench(args, layout, dtype, bc, Path(tmp), results)
    print("RESULT " + json.dumps(results, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
