#!/usr/bin/env python3
"""Start-up time of the generated kernels: seconds from a fresh process to the first results.

Issue 22's start-up targets, each step in a FRESH Python subprocess with empty caches
(new empty temporary ``TRITON_CACHE_DIR``, ``TRITON_HOME``, ``EQDSL_CACHE_DIR``,
``XDG_CACHE_HOME``, ``CUDA_CACHE_PATH``, ``TORCHINDUCTOR_CACHE_DIR``;
``JAX_COMPILATION_CACHE_DIR`` unset), wall-clock seconds per part, each part ended by
``torch.cuda.synchronize()`` / ``block_until_ready``:

  torch_cubins  mace_large's torch conv, with the package's built binaries
                (``generated/mace_large/cubins/``, written by ``eqdsl build``; the runtime
                installs them before its first launch): the first forward, then the first
                backward (gradients of the energy = sum of the scalar outputs with respect
                to node features and edge attributes, ``create_graph=True``, as forces),
                then the first double backward (gradient of a force loss with respect to
                the weights). Target: forward + backward + double backward <= 2 s.
                n/a (with the reason) when the package has no ``cubins/``.
  torch_jit     the same three parts, the package copied without ``cubins/``: every
                kernel JIT-compiles (no target; the figure the binaries remove).
  family        the whole mace_large op family JIT-compiled in one process (package copied
                without ``cubins/``), float32: every kernel op of ``torch_ops`` and
                ``torch_conv`` called once (tensor product forward, fused backward,
                ``bwd_x1``/``bwd_x2``/``bwd_w`` alone, second order; conv forward on a graph
                below and one above ``SEGMENT_MIN_EDGES``, fused backward, the three
                backward ops alone, second order). Target: total <= 60 s. Reports which
                kernels of the package were compiled (Triton's cache after the run).
  jax           ``jax_ops.tensor_product`` and ``jax_ops.conv`` of mace_large under
                ``jax.jit``: first forward, then first backward (``jax.vjp``, all three
                gradients). Target: forward + backward <= 15 s, for each.
  oeq           the closest prior art beside ``torch_cubins``: OpenEquivariance's
                ``TensorProductConv`` for the same product (from the package's metadata;
                atomic variant, rows = dst, cols = src), its C++ extension already built
                (``TORCH_EXTENSIONS_DIR`` kept across runs, built before the step, untimed):
                building the op (its kernels JIT-compiled with NVRTC), then the same three
                parts. CUDA only (needs ``benchmarks/tools/oeq_env.sh``); not in the default
                steps.
  oeq_cold      the same with empty caches: importing openequivariance compiles its C++
                extension (once per machine in normal use).

A target is compared with the first calls' seconds only; what comes before them in the
process (importing torch or JAX, starting CUDA or JAX's backend, importing the package)
is listed beside them as parts, and ``process_s`` in the JSON runs from the interpreter's
start to the last result.

After its timed parts, each step checks what it computed against e3nn in float64 on the
same device (``o3.TensorProduct`` from the package metadata, gathered and scattered with
``index_add``; autograd for every gradient order): relative Frobenius error <= 1e-4
(float32). A wrong result or a crash fails the run (exit status 1) after the table; a step
killed at ``--timeout`` is a missed target (``> T`` seconds, with the parts it finished). Graph: 256 nodes x 32 random in-edges = 8,192 edges (mace_large's
``SEGMENT_MIN_EDGES``: the forward's segment kernel); tensor product: 1,024 rows.

``--jobs N`` runs up to N steps at once (``torch_cubins`` always alone, first): faster,
but compilers then share the host's cores; the JSON records it. The table (printed last)
has each step's parts, its target and met / missed. JSON: ``--json`` (default
``$OUT/bench_startup.json``); ``benchmarks/report.py --startup`` turns it into a section of
BENCHMARKS.md. On a GPU::

    python3 benchmarks/bench_startup.py --jobs 3

``--dry-run`` runs the same steps on the CPU (Triton's interpreter, Pallas interpret
mode) on a tiny problem and graph, to test the harness: its seconds mean nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
STEPS = ("torch_cubins", "torch_jit", "family", "jax")
OEQ_STEPS = ("oeq", "oeq_cold")  # opt-in (--steps): OpenEquivariance, the closest prior art
OEQ_EXT_DIR = Path(tempfile.gettempdir()) / "eqdsl_startup_oeq_ext"  # the "built once" extension
TARGETS = {  # step -> (what is compared, seconds)
    "torch_cubins": ("conv fwd + bwd + double bwd", 2.0),
    "family": ("whole op family", 60.0),
    "jax_tp": ("tensor_product fwd + bwd", 15.0),
    "jax_conv": ("conv fwd + bwd", 15.0),
}
RESULT = "STARTUP_RESULT "
PART = "STARTUP_PART "
RTOL32 = 1e-4


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default=",".join(STEPS),
                    help=f"comma-separated, of {','.join(STEPS + OEQ_STEPS)} (default {','.join(STEPS)})")
    ap.add_argument("--problem", default=None, help="generated package (default mace_large; --dry-run: nequip_water)")
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--jobs", type=int, default=1, help="steps at once after torch_cubins (default 1)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per step (its subprocess is killed after)")
    ap.add_argument("--nodes", type=int, default=None, help="graph nodes (default 256; --dry-run 8)")
    ap.add_argument("--in-degree", type=int, default=None, help="random in-edges per node (default 32; --dry-run 3)")
    ap.add_argument("--batch", type=int, default=None, help="tensor-product rows (default 1024; --dry-run 4)")
    ap.add_argument("--no-check", action="store_true", help="skip the e3nn float64 check after the timed parts")
    ap.add_argument("--json", default=None, help="default $OUT/bench_startup.json")
    ap.add_argument("--dry-run", action="store_true", help="CPU: interpreted kernels, tiny sizes (tests the harness)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--pkg", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.problem = args.problem or ("nequip_water" if args.dry_run else "mace_large")
    args.nodes = args.nodes or (8 if args.dry_run else 256)
    args.in_degree = args.in_degree or (3 if args.dry_run else 32)
    args.batch = args.batch or (4 if args.dry_run else 1024)
    return args


# ----------------------------------------------------------------------------- child: helpers


class Clock:
    """Wall seconds per named part; ``sync`` ends each part (device work included)."""

    def __init__(self, sync):
        self.sync, self.parts = sync, {}

    def run(self, name, fn):
        t0 = time.perf_counter()
        out = fn()
        self.sync(out)
        self.parts[name] = time.perf_counter() - t0
        print(f"{PART}{json.dumps([name, self.parts[name]])}", flush=True)  # kept if the step times out later
        return out


def scalar_columns(irreps_out: str) -> list[int]:
    """Columns of the ``0e`` blocks of an output row (``2l+1 = 1``: the same in both layouts)."""
    cols, offset = [], 0
    for term in irreps_out.split("+"):
        mul, ir = term.split("x") if "x" in term else ("1", term)
        width = int(mul) * (2 * int(ir[:-1]) + 1)
        if ir == "0e":
            cols += range(offset, offset + width)
        offset += width
    return cols


def random_graph(nodes: int, in_degree: int, seed: int = 0):
    """``in_degree`` random in-edges per node (numpy int64 src, dst; dst sorted)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dst = np.repeat(np.arange(nodes, dtype=np.int64), in_degree)
    return rng.integers(0, nodes, dst.size, dtype=np.int64), dst


def numpy_inputs(meta, rows_in1: int, rows_edge: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    wshape = (meta.WEIGHT_NUMEL,) if meta.SHARED_WEIGHTS else (rows_edge, meta.WEIGHT_NUMEL)
    return [rng.standard_normal(s).astype(np.float32) for s in ((rows_in1, meta.DIM_IN1), (rows_edge, meta.DIM_IN2), wshape)]


def e3nn_reference(meta, device):
    """``(tp, conv)`` in float64 torch: e3nn's TensorProduct built from the package metadata
    (the README's recipe), and gather + it + ``index_add`` as the conv."""
    import torch
    from e3nn import o3

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # float64 Clebsch-Gordan coefficients, not rounded float32 ones
    try:
        tp = o3.TensorProduct(meta.IRREPS_IN1, meta.IRREPS_IN2, meta.IRREPS_OUT, [tuple(i) for i in meta.INSTRUCTIONS],
                              irrep_normalization=meta.IRREP_NORMALIZATION, path_normalization=meta.PATH_NORMALIZATION,
                              internal_weights=False, shared_weights=meta.SHARED_WEIGHTS).to(device)
    finally:
        torch.set_default_dtype(old)
    if getattr(meta, "CONV_REDUCE", "sum") != "sum":
        raise RuntimeError(f"reference conv: reduce {meta.CONV_REDUCE!r} not supported here (sum only)")

    def conv(x, y, w, src, dst, n):
        return torch.zeros(n, meta.DIM_OUT, dtype=x.dtype, device=x.device).index_add(0, dst, tp(x[src], y, w))

    return tp, conv


def rel_err(got, want) -> float:
    import torch

    got, want = torch.as_tensor(got).double().cpu(), torch.as_tensor(want).double().cpu()
    den = float(want.norm())
    return float((got - want).norm()) / (den if den > 0 else 1.0)


def conv_steps(conv_fn, x, y, w, src, dst, n, scalars, clock=None):
    """Forward, backward (energy = sum of scalar outputs; d/d node features and edge attrs,
    create_graph), double backward (d force loss / d weights). With a ``clock``, each part
    is timed under its name. Returns (out, gx, gy, gw)."""
    import torch

    run = clock.run if clock else (lambda name, fn: fn())
    out = run("fwd", lambda: conv_fn(x, y, w, src, dst, n))
    gx, gy = run("bwd", lambda: torch.autograd.grad(out.index_select(1, scalars).sum(), (x, y), create_graph=True))
    (gw,) = run("dbl", lambda: torch.autograd.grad(gx.pow(2).sum() + gy.pow(2).sum(), (w,)))
    return out, gx, gy, gw


def check_conv(meta, got, inputs, src, dst, n, scalars, device) -> dict:
    """Relative errors of ``conv_steps``' four results against e3nn float64."""
    _, ref = e3nn_reference(meta, device)
    x, y, w = (t.detach().double().requires_grad_(True) for t in inputs)
    want = conv_steps(ref, x, y, w, src, dst, n, scalars)
    return {k: rel_err(a.detach(), b.detach()) for k, a, b in zip(("out", "grad_x", "grad_y", "grad_w_of_force_loss"),
                                                                     got, want)}


def torch_setup(args):
    """Import torch; device and sync. On --dry-run: the CPU (TRITON_INTERPRET=1 already set)."""
    import torch

    device = torch.device("cpu" if args.dry_run else "cuda")

    def sync(_=None):
        if device.type == "cuda":
            torch.cuda.synchronize()

    return torch, device, sync


def import_pkg(args, module: str):
    return importlib.import_module(f"{args.pkg}.{args.problem}.{module}")


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "triton", "helion", "jax", "jaxlib", "e3nn"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


# ----------------------------------------------------------------------------- child: steps


def child_torch(args) -> dict:
    """torch_cubins / torch_jit: import, CUDA init, then fwd, bwd, dbl of the conv."""
    res = {"parts": {}}
    t0 = time.perf_counter()
    torch, device, sync = torch_setup(args)
    res["parts"]["import torch"] = time.perf_counter() - t0
    clock = Clock(sync)
    if device.type == "cuda":
        clock.run("cuda init", lambda: torch.zeros(1, device=device))
        res["device"] = torch.cuda.get_device_name()
    meta = importlib.import_module(f"{args.pkg}.{args.problem}")  # metadata only: no framework import
    conv = clock.run("import package", lambda: import_pkg(args, "torch_conv"))
    s, d = random_graph(args.nodes, args.in_degree)
    n = args.nodes
    src, dst = torch.as_tensor(s, device=device), torch.as_tensor(d, device=device)
    arrs = numpy_inputs(meta, n, len(s), seed=1)
    inputs = [torch.as_tensor(a, device=device).requires_grad_(True) for a in arrs]
    scalars = torch.tensor(scalar_columns(meta.IRREPS_OUT), device=device)
    sync()
    res["graph"] = {"nodes": n, "edges": int(len(s)), "segment_min_edges": getattr(conv, "SEGMENT_MIN_EDGES", None)}
    got = conv_steps(conv.conv, *inputs, src, dst, n, scalars, clock)
    res["parts"].update(clock.parts)
    res["first_results_s"] = sum(clock.parts[k] for k in ("fwd", "bwd", "dbl"))
    res["process_s"] = time.perf_counter() - _T_START
    if not args.no_check:
        res["rel_err"] = check_conv(meta, got, inputs, src, dst, n, scalars, device)
    return res


def child_oeq(args) -> dict:
    """oeq / oeq_cold: import, CUDA init, import openequivariance, build the conv op for the
    package's product, then fwd, bwd, dbl as ``child_torch``."""
    import numpy as np

    res = {"parts": {}}
    t0 = time.perf_counter()
    torch, device, sync = torch_setup(args)
    res["parts"]["import torch"] = time.perf_counter() - t0
    clock = Clock(sync)
    clock.run("cuda init", lambda: torch.zeros(1, device=device))
    res["device"] = torch.cuda.get_device_name()
    meta = importlib.import_module(f"{args.pkg}.{args.problem}")
    oeq = clock.run("import openequivariance", lambda: importlib.import_module("openequivariance"))

    def build():
        problem = oeq.TPProblem(oeq.Irreps(meta.IRREPS_IN1), oeq.Irreps(meta.IRREPS_IN2), oeq.Irreps(meta.IRREPS_OUT),
                                [tuple(i) for i in meta.INSTRUCTIONS], irrep_normalization=meta.IRREP_NORMALIZATION,
                                path_normalization=meta.PATH_NORMALIZATION, internal_weights=False,
                                shared_weights=meta.SHARED_WEIGHTS, irrep_dtype=np.float32, weight_dtype=np.float32)
        return oeq.TensorProductConv(problem, torch_op=True, deterministic=False)

    mod = clock.run("build op", build)
    cols = torch.arange(meta.WEIGHT_NUMEL, dtype=torch.float32, device=device).reshape(1, -1)
    if not torch.equal(mod.reorder_weights_from_e3nn(cols, has_batch_dim=True).reshape(-1), cols.reshape(-1)):
        raise SystemExit("OpenEquivariance orders this product's weights unlike e3nn: not wired here")
    s, d = random_graph(args.nodes, args.in_degree)
    n = args.nodes
    src, dst = torch.as_tensor(s, device=device), torch.as_tensor(d, device=device)
    arrs = numpy_inputs(meta, n, len(s), seed=1)
    inputs = [torch.as_tensor(a, device=device).requires_grad_(True) for a in arrs]
    scalars = torch.tensor(scalar_columns(meta.IRREPS_OUT), device=device)
    sync()
    res["graph"] = {"nodes": n, "edges": int(len(s))}
    got = conv_steps(lambda x, y, w, s_, d_, n_: mod(x, y, w, d_, s_), *inputs, src, dst, n, scalars, clock)
    res["parts"].update(clock.parts)
    res["first_results_s"] = sum(clock.parts[k] for k in ("build op", "fwd", "bwd", "dbl"))
    res["process_s"] = time.perf_counter() - _T_START
    if not args.no_check:
        res["rel_err"] = check_conv(meta, got, inputs, src, dst, n, scalars, device)
    return res


def child_family(args) -> dict:
    """Every kernel op of the package once, float32, JIT (no cubins in the copy)."""
    res = {"parts": {}}
    torch, device, sync = torch_setup(args)
    if device.type == "cuda":
        torch.zeros(1, device=device)
        res["device"] = torch.cuda.get_device_name()
    meta = importlib.import_module(f"{args.pkg}.{args.problem}")
    clock = Clock(sync)
    ops = clock.run("import torch_ops", lambda: import_pkg(args, "torch_ops"))
    conv = import_pkg(args, "torch_conv")
    f32 = torch.float32
    b = args.batch
    x1, x2, w = (torch.as_tensor(a, device=device) for a in numpy_inputs(meta, b, b, seed=2))
    go = torch.randn(b, meta.DIM_OUT, device=device, dtype=f32)
    leaves = [t.clone().requires_grad_(True) for t in (x1, x2, w)]

    def tp_second_order():
        out = ops.tensor_product(*leaves)
        g = torch.autograd.grad(out, leaves, go, create_graph=True)
        return torch.autograd.grad(sum(t.pow(2).sum() for t in g), leaves)

    # the tensor product's kernel ops (fused backward through autograd, the others called directly)
    clock.run("tp fwd", lambda: ops.tensor_product(x1, x2, w))
    clock.run("tp bwd (fused)", lambda: torch.autograd.grad(ops.tensor_product(*leaves), leaves, go))
    clock.run("tp bwd_x1 op", lambda: ops.bwd_x1_op(go, x2, w))
    clock.run("tp bwd_x2 op", lambda: ops.bwd_x2_op(x1, go, w))
    clock.run("tp bwd_w op", lambda: ops.bwd_w_op(x1, x2, go))
    clock.run("tp second order", tp_second_order)
    # the conv's: forward on a graph below SEGMENT_MIN_EDGES (atomic kernel) and one at or above it
    n = args.nodes
    s, d = random_graph(n, args.in_degree)
    src, dst = torch.as_tensor(s, device=device), torch.as_tensor(d, device=device)
    small = max(1, min(len(s), getattr(conv, "SEGMENT_MIN_EDGES", len(s))) // 2)
    cx, cy, cw = (torch.as_tensor(a, device=device) for a in numpy_inputs(meta, n, len(s), seed=3))
    g_nodes = torch.randn(n, meta.DIM_OUT, device=device, dtype=f32)
    graph = conv.graph_tensors(src, dst, n)
    cleaves = [t.clone().requires_grad_(True) for t in (cx, cy, cw)]
    scalars = torch.tensor(scalar_columns(meta.IRREPS_OUT), device=device)
    clock.run("conv fwd, small graph", lambda: conv.conv(cx, cy[:small], cw[:small], src[:small], dst[:small], n))
    clock.run("conv fwd", lambda: conv.conv(cx, cy, cw, src, dst, n))
    clock.run("conv bwd (fused)", lambda: torch.autograd.grad(conv.conv(*cleaves, src, dst, n), cleaves, g_nodes))
    clock.run("conv bwd_x op", lambda: conv.conv_bwd_x_op(g_nodes, cy, cw, *graph, n))
    clock.run("conv bwd_y op", lambda: conv.conv_bwd_y_op(cx, g_nodes, cw, *graph, n))
    clock.run("conv bwd_w op", lambda: conv.conv_bwd_w_op(cx, cy, g_nodes, *graph, n))
    got = clock.run("conv second order", lambda: conv_steps(conv.conv, *cleaves, src, dst, n, scalars))
    res["parts"].update(clock.parts)
    res["first_results_s"] = sum(clock.parts.values())
    res["process_s"] = time.perf_counter() - _T_START
    res["graph"] = {"nodes": n, "edges": int(len(s)), "small_edges": small,
                    "segment_min_edges": getattr(conv, "SEGMENT_MIN_EDGES", None)}
    if not args.no_check:
        tp_ref, _ = e3nn_reference(meta, device)
        a, bb, c = (t.detach().double().requires_grad_(True) for t in leaves)
        want = tp_ref(a, bb, c)
        out = ops.tensor_product(*leaves)
        errs = {"tp out": rel_err(out.detach(), want.detach())}
        for name, gt, wt in zip(("tp grad_x1", "tp grad_x2", "tp grad_w"), torch.autograd.grad(out, leaves, go),
                                torch.autograd.grad(want, (a, bb, c), go.double())):
            errs[name] = rel_err(gt, wt)
        errs.update({f"conv {k}": v for k, v in check_conv(meta, got, cleaves, src, dst, n, scalars, device).items()})
        res["rel_err"] = errs
    return res


def child_jax(args) -> dict:
    """jit(tensor_product) and jit(conv): first forward, first backward (jax.vjp)."""
    res = {"parts": {}}
    t0 = time.perf_counter()
    import jax
    import numpy as np

    jax.config.update("jax_default_matmul_precision", "highest")
    res["parts"]["import jax"] = time.perf_counter() - t0
    clock = Clock(jax.block_until_ready)
    clock.run("jax init", lambda: jax.jit(lambda a: a + 1)(np.zeros(4, np.float32)))
    res["device"] = str(jax.devices()[0].device_kind)
    meta = importlib.import_module(f"{args.pkg}.{args.problem}")
    mod = clock.run("import jax_ops", lambda: import_pkg(args, "jax_ops"))
    b = args.batch
    x1, x2, w = (jax.device_put(a) for a in numpy_inputs(meta, b, b, seed=2))
    go = jax.device_put(np.random.default_rng(4).standard_normal((b, meta.DIM_OUT)).astype(np.float32))
    tp = jax.jit(mod.tensor_product)
    tp_vjp = jax.jit(lambda a, bb, c, g: jax.vjp(mod.tensor_product, a, bb, c)[1](g))
    out = clock.run("tp fwd", lambda: tp(x1, x2, w))
    grads = clock.run("tp bwd", lambda: tp_vjp(x1, x2, w, go))
    n = args.nodes
    s, d = random_graph(n, args.in_degree)
    cx, cy, cw = (jax.device_put(a) for a in numpy_inputs(meta, n, len(s), seed=3))
    js, jd = jax.device_put(s.astype(np.int32)), jax.device_put(d.astype(np.int32))
    gn = jax.device_put(np.random.default_rng(5).standard_normal((n, meta.DIM_OUT)).astype(np.float32))
    has_conv = hasattr(mod, "conv")
    if has_conv:
        cf_ = jax.jit(lambda a, bb, c, s_, d_: mod.conv(a, bb, c, s_, d_, n, check=False))
        cv = jax.jit(lambda a, bb, c, s_, d_, g: jax.vjp(lambda *t: mod.conv(*t, s_, d_, n, check=False), a, bb, c)[1](g))
        cout = clock.run("conv fwd", lambda: cf_(cx, cy, cw, js, jd))
        cgrads = clock.run("conv bwd", lambda: cv(cx, cy, cw, js, jd, gn))
    res["parts"].update(clock.parts)
    res["tp_s"] = clock.parts["tp fwd"] + clock.parts["tp bwd"]
    res["conv_s"] = clock.parts["conv fwd"] + clock.parts["conv bwd"] if has_conv else None
    res["first_results_s"] = res["tp_s"] + (res["conv_s"] or 0.0)
    res["process_s"] = time.perf_counter() - _T_START
    res["graph"] = {"nodes": n, "edges": int(len(s))}
    if not args.no_check:
        import torch

        dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
        tp_ref, conv_ref = e3nn_reference(meta, dev)
        t = [torch.as_tensor(np.asarray(a), device=dev).double().requires_grad_(True) for a in (x1, x2, w)]
        want = tp_ref(*t)
        errs = {"tp out": rel_err(np.asarray(out), want.detach())}
        for name, gt, wt in zip(("tp grad_x1", "tp grad_x2", "tp grad_w"), grads,
                                torch.autograd.grad(want, t, torch.as_tensor(np.asarray(go), device=dev).double())):
            errs[name] = rel_err(np.asarray(gt), wt)
        if has_conv:
            ct = [torch.as_tensor(np.asarray(a), device=dev).double().requires_grad_(True) for a in (cx, cy, cw)]
            ts, td = torch.as_tensor(s, device=dev), torch.as_tensor(d, device=dev)
            cwant = conv_ref(*ct, ts, td, n)
            errs["conv out"] = rel_err(np.asarray(cout), cwant.detach())
            for name, gt, wt in zip(("conv grad_x", "conv grad_y", "conv grad_w"), cgrads,
                                    torch.autograd.grad(cwant, ct, torch.as_tensor(np.asarray(gn), device=dev).double())):
                errs[name] = rel_err(np.asarray(gt), wt)
        res["rel_err"] = errs
    res["versions"] = versions()
    return res


def compiled_kernels(pkg_dir: Path, cache: Path, dtype: str = "float32") -> dict:
    """Which of the package's kernels have a binary in Triton's cache ``cache``.

    The package's kernel names: ``triton_kernels.KERNELS`` (shipped Triton sources) for
    ``dtype``, else the Helion kernels' ``def`` names. A binary is ``<hash>/<fn>.cubin``
    whose ``fn`` is the kernel name or Helion's ``_helion_<name>``."""
    names = []
    init = pkg_dir / "triton_kernels" / "__init__.py"
    if init.exists():
        ns: dict = {}
        try:
            exec(compile(init.read_text(), str(init), "exec"), ns)  # noqa: S102  (our own generated file)
            names = sorted({k for (k, dt) in ns.get("KERNELS", {}) if dt == dtype})
        except Exception:  # noqa: BLE001
            names = []
    if not names:
        import re

        for f in ("helion_kernels.py", "helion_conv_kernels.py"):
            if (pkg_dir / f).exists():
                text = (pkg_dir / f).read_text()
                names += re.findall(r"@helion\.kernel\([^\n]*\)\s*\ndef (\w+)\(", text)
                names += re.findall(r"@helion\.kernel\s*\ndef (\w+)\(", text)
        names = sorted(set(names))
    stems = {p.stem for p in cache.rglob("*.cubin")} if cache.exists() else set()
    found = sorted(n for n in names if n in stems or f"_helion_{n}" in stems)
    return {"kernels": names, "compiled": found, "missing": sorted(set(names) - set(found)), "cubins_in_cache": len(stems)}


def child_main(args) -> int:
    fn = {"torch": child_torch, "family": child_family, "jax": child_jax, "oeq": child_oeq}[args.child]
    res = fn(args)
    res.setdefault("versions", versions())
    print(RESULT + json.dumps(res), flush=True)
    return 0


# ----------------------------------------------------------------------------- parent


def copy_package(src: Path, dest_root: Path, with_cubins: bool) -> str:
    """``src`` copied to ``dest_root/eqdsl_startup/<name>`` (no bytecode; ``cubins/`` only
    if asked); returns the parent package name to import it by."""
    parent = dest_root / "eqdsl_startup"
    parent.mkdir(parents=True)
    (parent / "__init__.py").write_text("")
    ignore = ["__pycache__"] + ([] if with_cubins else ["cubins"])
    shutil.copytree(src, parent / src.name, ignore=shutil.ignore_patterns(*ignore))
    return "eqdsl_startup"


def fresh_env(tmp: Path, dry_run: bool) -> dict:
    env = dict(os.environ)
    for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "TRITON_INTERPRET", "EQDSL_KERNELS"):
        env.pop(key, None)
    dirs = {"TRITON_CACHE_DIR": "triton", "TRITON_HOME": "triton_home", "EQDSL_CACHE_DIR": "eqdsl",
            "XDG_CACHE_HOME": "xdg", "CUDA_CACHE_PATH": "cuda", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
    for key, sub in dirs.items():
        (tmp / sub).mkdir()
        env[key] = str(tmp / sub)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "pkgs"), str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the torch reference shares the GPU
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_step(step: str, args, concurrent: list[str]) -> dict:
    pkg_src = Path(args.generated).resolve() / args.problem
    row = {"step": step, "status": "ok", "reason": "", "concurrent_with": concurrent}
    if not pkg_src.is_dir():
        return dict(row, status="n/a", reason=f"no generated package {pkg_src}")
    if step == "torch_cubins" and not (pkg_src / "cubins").is_dir():
        return dict(row, status="n/a", reason=f"{pkg_src.name}/cubins/ absent (the package has no built binaries: "
                                              "run eqdsl build)")
    tmp = Path(tempfile.mkdtemp(prefix=f"eqdsl-startup-{step}-"))
    try:
        pkg = copy_package(pkg_src, tmp / "pkgs", with_cubins=step == "torch_cubins")
        env = fresh_env(tmp, args.dry_run)
        if step == "oeq":  # the extension built once, as a user's machine has it after the first import
            env["TORCH_EXTENSIONS_DIR"] = str(OEQ_EXT_DIR)
            subprocess.run([sys.executable, "-c", "import openequivariance"], env=env, capture_output=True,
                           timeout=args.timeout, cwd=str(tmp))
        elif step == "oeq_cold":
            (tmp / "torch_extensions").mkdir()
            env["TORCH_EXTENSIONS_DIR"] = str(tmp / "torch_extensions")
        child = {"torch_cubins": "torch", "torch_jit": "torch", "family": "family", "jax": "jax", "oeq": "oeq",
                 "oeq_cold": "oeq"}[step]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", child, "--pkg", pkg, "--problem", args.problem,
               "--nodes", str(args.nodes), "--in-degree", str(args.in_degree), "--batch", str(args.batch)]
        cmd += ["--dry-run"] if args.dry_run else []
        cmd += ["--no-check"] if args.no_check else []
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=str(tmp))
        except subprocess.TimeoutExpired as e:
            err, out = ((x.decode(errors="replace") if isinstance(x, bytes) else (x or "")) for x in (e.stderr, e.stdout))
            parts = dict(json.loads(ln[len(PART):]) for ln in out.splitlines() if ln.startswith(PART))
            return dict(row, status="timeout", reason=f"killed after {args.timeout:.0f} s (parts done before: listed)",
                        wall_s=time.perf_counter() - t0, parts=parts, stderr_tail=err[-3000:])
        row["wall_s"] = time.perf_counter() - t0
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
        # the runtime's one-line notices (a kernel compiled without a matching binary, ...)
        row["notices"] = [ln for ln in p.stderr.splitlines() if "eqdsl" in ln.lower()][-20:]
        if p.returncode != 0 or not lines:
            return dict(row, status="failed", reason=f"exit status {p.returncode}: "
                        + (p.stderr.strip().splitlines() or ["no output"])[-1][:300], stderr_tail=p.stderr[-3000:])
        row.update(json.loads(lines[-1][len(RESULT):]))
        if step in ("torch_cubins", "torch_jit", "family") and not args.dry_run:  # (the interpreter compiles nothing)
            row["kernels"] = compiled_kernels(tmp / "pkgs" / pkg / args.problem, tmp / "triton")
        bad = {k: v for k, v in (row.get("rel_err") or {}).items() if not v <= RTOL32}
        if bad:
            row["status"] = "BAD"
            row["reason"] = "disagrees with e3nn float64: " + ", ".join(f"{k} {v:.1e}" for k, v in bad.items())
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def target_rows(results: list[dict]) -> list[dict]:
    """One row per target (and the untargeted torch_jit row): seconds, target, met."""
    out = []
    for r in results:
        parts = r.get("parts", {})
        measured = []
        if r["step"] == "jax":
            measured = [("jax_tp", "jax: tensor_product first fwd + bwd", r.get("tp_s")),
                        ("jax_conv", "jax: conv first fwd + bwd", r.get("conv_s"))]
        elif r["step"] == "family":
            measured = [("family", "torch: whole op family JIT, one process", r.get("first_results_s"))]
        elif r["step"] in OEQ_STEPS:
            label = "OpenEquivariance: conv op built + first fwd + bwd + double bwd, " + (
                "extension built before" if r["step"] == "oeq" else "empty caches (extension compiled)")
            measured = [(r["step"], label, r.get("first_results_s"))]
        else:
            label = "torch: conv first fwd + bwd + double bwd, " + ("built cubins" if r["step"] == "torch_cubins"
                                                                    else "JIT (no cubins)")
            measured = [(r["step"], label, r.get("first_results_s"))]
        for key, label, secs in measured:
            target = TARGETS.get(key, (None, None))[1]
            own = parts
            if key in ("jax_tp", "jax_conv"):  # each row its own parts (the process's start with the first)
                keep = ("tp fwd", "tp bwd", "import jax", "jax init", "import jax_ops") if key == "jax_tp" else (
                    "conv fwd", "conv bwd")
                own = {k: v for k, v in parts.items() if k in keep}
            if r["status"] == "timeout":
                secs_s, met = f"> {r.get('wall_s', 0):.0f}", "missed" if target else "-"
            elif r["status"] != "ok" or secs is None:
                secs_s, met = r["status"], "n/a"
            else:
                secs_s = f"{secs:.2f}"
                met = "-" if target is None else ("met" if secs <= target else "missed")
            out.append({"key": key, "what": label, "seconds": secs, "seconds_str": secs_s, "target_s": target,
                        "met": met, "status": r["status"], "reason": r.get("reason", ""), "parts": own,
                        "process_s": r.get("process_s"), "wall_s": r.get("wall_s")})
    return out


def format_table(rows: list[dict]) -> str:
    head = ("what", "seconds", "target", "", "parts (s)")
    lines = [head]
    for r in rows:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["parts"].items()) if r["parts"] else r["reason"]
        lines.append((r["what"], r["seconds_str"], "-" if r["target_s"] is None else f"<= {r['target_s']:g}",
                      r["met"], parts))
    widths = [max(len(str(ln[i])) for ln in lines) for i in range(4)]
    return "\n".join("  ".join([str(c).ljust(w) for c, w in zip(ln[:4], widths)] + [ln[4]]) for ln in lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS + OEQ_STEPS]
    if unknown:
        raise SystemExit(f"unknown step(s) {unknown}; known: {', '.join(STEPS + OEQ_STEPS)}")
    t0 = time.perf_counter()
    results = []
    first = [s for s in steps if s == "torch_cubins"]
    rest = [s for s in steps if s != "torch_cubins"]
    for s in first:  # alone: the 2 s target is the one a busy host would distort most
        print(f"[startup] {s} ...", flush=True)
        results.append(run_step(s, args, []))
        print(f"[startup] {s}: {results[-1]['status']} {results[-1].get('first_results_s', '')}", flush=True)
    jobs = max(1, args.jobs)
    with cf.ThreadPoolExecutor(jobs) as pool:
        futs = {}
        for s in rest:
            others = [o for o in rest if o != s] if jobs > 1 else []
            futs[pool.submit(run_step, s, args, others[: jobs - 1])] = s
            print(f"[startup] {s} queued", flush=True)
        done = {}
        for f in cf.as_completed(futs):
            done[futs[f]] = f.result()
            print(f"[startup] {futs[f]}: {done[futs[f]]['status']} {done[futs[f]].get('first_results_s', '')}",
                  flush=True)
        results += [done[s] for s in rest]
    rows = target_rows(results)
    device = next((r.get("device") for r in results if r.get("device")), None)
    meta = {"what": "start-up", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "argv": sys.argv[1:] if argv is None else list(argv), "jobs": jobs,
            "problem": args.problem, "dry_run": args.dry_run, "timeout_s": args.timeout,
            "versions": next((r.get("versions") for r in results if r.get("versions")), {}),
            "elapsed_s": time.perf_counter() - t0}
    doc = {"meta": meta, "steps": results, "rows": rows}
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_startup.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(doc, indent=1, default=str))
        print(f"JSON: {path}")
    for r in results:
        if r["status"] not in ("ok", "n/a"):  # failed, BAD, timeout: say why
            print(f"\n{r['step']}: {r['status']}: {r['reason']}\n{r.get('stderr_tail', '')[-1500:]}")
        if r.get("kernels"):
            k = r["kernels"]
            print(f"{r['step']}: {len(k['compiled'])} of {len(k['kernels'])} kernels have a binary in Triton's cache"
                  + (f"; missing {', '.join(k['missing'])}" if k["missing"] else ""))
        if r.get("rel_err"):
            print(f"{r['step']}: max rel. error vs e3nn float64 {max(r['rel_err'].values()):.1e}")
    print(f"\nstart-up, {args.problem}, {device or '?'}, fresh process and empty caches"
          + (f", up to {jobs} steps at once" if jobs > 1 else "") + (" (DRY RUN: CPU, meaningless times)" if args.dry_run else ""))
    print(format_table(rows))
    failed = [r["step"] for r in results if r["status"] in ("failed", "BAD")]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv and "--dry-run" in sys.argv:
        os.environ["TRITON_INTERPRET"] = "1"  # before torch or a generated module is imported
    sys.exit(main())
