#!/usr/bin/env python3
"""Small-graph latency of energy + forces, and host overhead per eager op call (issue 22's targets).

Part 1, one MD-like step on a small graph: 32 atoms at random positions in a 6 A box,
512 random directed edges (src != dst; fixed seed), mace_large's conv in float32:

    vec = pos[dst] - pos[src];  sh = spherical harmonics of vec (IRREPS_IN2, normalized, "component")
    w = (sin(k r) / r) @ theta  (8 radial functions -> per-edge weights);  h: fixed node features
    energy = sum of the scalar (0e) columns of conv(h, sh, w, src, dst, 32);  forces = -d energy / d pos

Per implementation, the median wall time of one synchronized step (new positions each step,
rotating over 4 sets) over ``--steps`` steps (default 300) after ``--warmup``, and the
pipelined time per step (the same steps issued back to back, one synchronize at the end):

  torch_eager     the step in eager PyTorch (``torch_ops.conv``, e3nn's ``o3.spherical_harmonics``,
                  ``torch.autograd.grad``); the graph's indices are checked once before, the steps
                  call the conv with ``check=False`` (no device sync: a trusted neighbour list)
  torch_graph     the same step captured once with ``torch.cuda.graph`` (after an eager warm-up),
                  each step = copy the positions into the static input, replay
  torch_compile   ``torch.compile(energy, mode="reduce-overhead")``, forces by ``autograd.grad``
                  (forward and backward replayed as CUDA graphs); n/a with the reason if it fails
  torch_compile_graph  ``torch.compile(energy)`` (default mode: inductor fuses the spherical
                  harmonics' and the radial part's elementwise ops; the conv stays one custom op
                  per kernel), the whole energy + forces step then captured with ``torch.cuda.graph``
  jax_jit         ``jax.jit`` of energy and ``-jax.grad``: e3nn-jax spherical harmonics and
                  ``jax_ops.conv`` (the package's fused conv; without one: ``jax_ops.tensor_product``
                  on gathered rows + ``jax.ops.segment_sum``, and the JSON says so)
  torch_conv_fwd_bwd  for continuity with the 374 us measured before (issue 22): the eager conv
                  alone, forward and backward (all three gradients), per synchronized call

Targets: <= 100 us per step for torch_graph and jax_jit. Before timing, every step's energy
and forces are checked against e3nn in float64 (``o3.TensorProduct`` from the package
metadata, gather + ``index_add``, autograd): relative error <= 1e-4; a disagreeing
implementation is BAD (timed anyway, and the run exits with status 1).

Part 2, host overhead: microseconds of host time per eager call, ``--calls`` calls back to
back with no synchronization inside (minimum over ``--reps`` loops), and per call until the
device is done (pipelined): ``tensor_product`` at 16 rows (no grad; inputs requiring grad),
``conv`` on the 512-edge graph (``check=False``; ``check=True``, whose index check reads
the device once per call: no target), e3nn's ``TensorProduct`` (same metadata, 16 rows) as
the anchor, and the host's floor (``x + 1`` on a small tensor). Target: <= 15 us per
``tensor_product`` / ``conv`` call (``check=False``).

The table (printed last) has both parts. JSON: ``--json`` (default
``$OUT/bench_small_graph.json``); ``benchmarks/report.py --small-graph`` adds it to
BENCHMARKS.md. On a GPU::

    python3 benchmarks/bench_small_graph.py

``--warm-only`` builds and calls every implementation once (compiles kernels into the
caches: Triton's, inductor's, JAX's persistent cache when ``JAX_COMPILATION_CACHE_DIR`` is
set) and times nothing. ``--quick`` is a CPU smoke run (Triton's interpreter, Pallas
interpret mode; a tiny graph of nequip_water; CUDA graphs and torch.compile n/a).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: eqdsl, and benchmarks.bench_startup as a script

IMPLS = ("torch_eager", "torch_graph", "torch_compile", "torch_compile_graph", "jax_jit", "torch_conv_fwd_bwd")
STEP_TARGET_US = {"torch_graph": 100.0, "torch_compile_graph": 100.0, "jax_jit": 100.0}
HOST_TARGET_US = 15.0
RTOL32 = 1e-4
NUM_RADIAL = 8


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default=None, help="generated package with a conv (default mace_large; --quick: nequip_water)")
    ap.add_argument("--generated", default=str(ROOT / "generated"))
    ap.add_argument("--atoms", type=int, default=None, help="default 32 (--quick 6)")
    ap.add_argument("--edges", type=int, default=None, help="default 512 (--quick 20)")
    ap.add_argument("--batch", type=int, default=16, help="tensor_product rows in the host-overhead part")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per implementation (default 300; --quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 30; --quick 1)")
    ap.add_argument("--calls", type=int, default=None, help="calls per host-overhead loop (default 200; --quick 3)")
    ap.add_argument("--reps", type=int, default=None, help="host-overhead loops, the minimum is kept (default 10; --quick 1)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    ap.add_argument("--no-host", action="store_true", help="skip part 2 (host overhead)")
    ap.add_argument("--warm-only", action="store_true", help="call everything once (fill the caches), time nothing")
    ap.add_argument("--json", default=None, help="default $OUT/bench_small_graph.json")
    ap.add_argument("--quick", action="store_true", help="CPU smoke run (interpreted kernels, tiny sizes)")
    args = ap.parse_args(argv)
    q = args.quick
    args.problem = args.problem or ("nequip_water" if q else "mace_large")
    args.atoms = args.atoms or (6 if q else 32)
    args.edges = args.edges or (20 if q else 512)
    args.steps = args.steps or (3 if q else 300)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 30)
    args.calls = args.calls or (3 if q else 200)
    args.reps = args.reps or (1 if q else 10)
    if q:
        args.batch = min(args.batch, 4)
    return args


# ----------------------------------------------------------------------------- the problem


class System:
    """Positions (4 sets), graph, node features and radial parameters, as numpy float32."""

    def __init__(self, meta, atoms: int, edges: int, seed: int = 0):
        import numpy as np

        from benchmarks.bench_startup import scalar_columns

        rng = np.random.default_rng(seed)
        self.meta, self.atoms = meta, atoms
        self.src = rng.integers(0, atoms, edges).astype(np.int64)
        self.dst = ((self.src + rng.integers(1, atoms, edges)) % atoms).astype(np.int64)  # no self-loops
        base = rng.uniform(0.0, 6.0, (atoms, 3))
        self.positions = [(base + rng.normal(0.0, 0.05, base.shape)).astype(np.float32) for _ in range(4)]
        self.h = rng.standard_normal((atoms, meta.DIM_IN1)).astype(np.float32)
        self.theta = (rng.standard_normal((NUM_RADIAL, meta.WEIGHT_NUMEL)) / NUM_RADIAL**0.5).astype(np.float32)
        self.freq = np.arange(1, NUM_RADIAL + 1, dtype=np.float32) * (np.pi / 6.0)
        self.scalars = np.asarray(scalar_columns(meta.IRREPS_OUT), dtype=np.int64)
        if not len(self.scalars):
            raise SystemExit(f"{meta.__name__}: no 0e output block, no energy to sum")


def torch_energy(torch, system, conv_fn, device, dtype):
    """``energy(pos)`` and ``energy_forces(pos)`` in torch on ``device``."""
    from e3nn import o3

    s = system
    src, dst = torch.as_tensor(s.src, device=device), torch.as_tensor(s.dst, device=device)
    h = torch.as_tensor(s.h, device=device).to(dtype)
    theta = torch.as_tensor(s.theta, device=device).to(dtype)
    freq = torch.as_tensor(s.freq, device=device).to(dtype)
    scalars = torch.as_tensor(s.scalars, device=device)
    irreps_in2 = s.meta.IRREPS_IN2

    def energy(pos):
        vec = pos[dst] - pos[src]
        sh = o3.spherical_harmonics(irreps_in2, vec, normalize=True, normalization="component")
        r = vec.norm(dim=1, keepdim=True)
        w = (torch.sin(freq * r) / r) @ theta
        return conv_fn(h, sh, w, src, dst, s.atoms).index_select(1, scalars).sum()

    def energy_forces(pos):
        pos = pos.detach().requires_grad_(True)
        e = energy(pos)
        (g,) = torch.autograd.grad(e, pos)
        return e.detach(), -g

    return energy, energy_forces


def jax_energy_forces(system, jax_ops):
    """``jit(pos -> (energy, forces))`` in JAX, and which conv it uses."""
    import e3nn_jax
    import jax
    import jax.numpy as jnp

    s = system
    src, dst = jnp.asarray(s.src.astype("int32")), jnp.asarray(s.dst.astype("int32"))
    h, theta, freq = jnp.asarray(s.h), jnp.asarray(s.theta), jnp.asarray(s.freq)
    scalars = jnp.asarray(s.scalars)
    if hasattr(jax_ops, "conv"):
        how = "jax_ops.conv"

        def conv(x, y, w):
            return jax_ops.conv(x, y, w, src, dst, s.atoms, check=False)
    else:
        how = "jax_ops.tensor_product on gathered rows + jax.ops.segment_sum"

        def conv(x, y, w):
            return jax.ops.segment_sum(jax_ops.tensor_product(x[src], y, w), dst, num_segments=s.atoms)

    def energy(pos):
        vec = pos[dst] - pos[src]
        sh = e3nn_jax.spherical_harmonics(s.meta.IRREPS_IN2, vec, normalize=True, normalization="component").array
        r = jnp.linalg.norm(vec, axis=1, keepdims=True)
        w = (jnp.sin(freq * r) / r) @ theta
        return conv(h, sh, w)[:, scalars].sum()

    @jax.jit
    def energy_forces(pos):
        e, g = jax.value_and_grad(energy)(pos)
        return e, -g

    return energy_forces, how


def reference(torch, system, device):
    """Energy and forces of every position set in float64 (e3nn TensorProduct conv)."""
    from benchmarks.bench_startup import e3nn_reference

    _, conv_ref = e3nn_reference(system.meta, device)
    _, ef = torch_energy(torch, system, conv_ref, device, torch.float64)
    out = []
    for p in system.positions:
        e, f = ef(torch.as_tensor(p, device=device).double())
        out.append((float(e), f.cpu().numpy()))
    return out


def rel_errors(got, want) -> float:
    """Largest relative error of energy and forces (Frobenius) over the position sets."""
    import numpy as np

    errs = []
    for (e, f), (we, wf) in zip(got, want):
        errs.append(abs(float(e) - we) / max(abs(we), 1e-30))
        errs.append(float(np.linalg.norm(np.asarray(f, np.float64) - wf) / max(np.linalg.norm(wf), 1e-30)))
    return max(errs)


# ----------------------------------------------------------------------------- timing


def time_steps(step, sync, n_pos: int, steps: int, warmup: int) -> dict:
    """Median wall us per synchronized step, and pipelined us per step (one sync at the end)."""
    for i in range(warmup):
        step(i % n_pos)
    sync()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i % n_pos)
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i % n_pos)
    sync()
    pipelined = (time.perf_counter() - t0) * 1e6 / steps
    return {"median_us": statistics.median(times), "p10_us": sorted(times)[len(times) // 10],
            "p90_us": sorted(times)[(9 * len(times)) // 10], "pipelined_us": pipelined, "steps": steps}


def host_us(fn, sync, calls: int, reps: int) -> dict:
    """Host us per call (``calls`` calls, no sync inside; min over ``reps``) and pipelined us."""
    for _ in range(10):
        fn()
    sync()
    hosts, pipes = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / calls * 1e6)
        pipes.append((t2 - t0) / calls * 1e6)
    return {"host_us": min(hosts), "pipelined_us": min(pipes)}


# ----------------------------------------------------------------------------- implementations


def build_torch_impls(torch, system, conv, device, impls, notes):
    """name -> (step(i) -> (energy, forces) of position set i); failures -> notes[name]."""
    f32 = torch.float32
    pos = [torch.as_tensor(p, device=device) for p in system.positions]
    # the graph's indices are checked once here (an eager call with check=True), then the
    # steps skip the check (its device sync), as the docs advise for a trusted neighbour list
    e = len(system.src)
    conv.conv(torch.zeros(system.atoms, conv.DIM_IN1, device=device), torch.zeros(e, conv.DIM_IN2, device=device),
              torch.zeros(e, conv.WEIGHT_NUMEL, device=device), torch.as_tensor(system.src, device=device),
              torch.as_tensor(system.dst, device=device), system.atoms, check=True)
    energy, energy_forces = torch_energy(torch, system, lambda *a: conv.conv(*a, check=False), device, f32)
    out = {}
    if "torch_eager" in impls:
        out["torch_eager"] = lambda i: energy_forces(pos[i])
    def captured(step_fn):
        """``step_fn(pos) -> (energy, forces)`` captured once with ``torch.cuda.graph``."""
        if device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        static = pos[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step_fn(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            e_s, f_s = step_fn(static)

        def graph_step(i, static=static, graph=graph, e_s=e_s, f_s=f_s):
            static.copy_(pos[i])
            graph.replay()
            return e_s, f_s

        return graph_step

    if "torch_graph" in impls:
        try:
            out["torch_graph"] = captured(energy_forces)
        except Exception as e:  # noqa: BLE001  (reported as n/a with the reason)
            notes["torch_graph"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if "torch_compile_graph" in impls:
        try:
            fused = torch.compile(energy, dynamic=False)

            def fused_energy_forces(p):
                p = p.detach().requires_grad_(True)
                e = fused(p)
                (g,) = torch.autograd.grad(e, p)
                return e.detach(), -g

            out["torch_compile_graph"] = captured(fused_energy_forces)
        except Exception as e:  # noqa: BLE001
            notes["torch_compile_graph"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    if "torch_compile" in impls:
        try:
            if device.type != "cuda":
                raise RuntimeError("mode='reduce-overhead' runs CUDA graphs: needs a CUDA device")
            compiled = torch.compile(energy, mode="reduce-overhead")

            def compile_step(i):
                torch.compiler.cudagraph_mark_step_begin()
                p = pos[i].clone().requires_grad_(True)
                e = compiled(p)
                (g,) = torch.autograd.grad(e, p)
                return e.detach(), -g

            for i in range(3):  # warm-up, record, replay: compile errors surface here
                compile_step(i % len(pos))
            out["torch_compile"] = compile_step
        except Exception as e:  # noqa: BLE001
            notes["torch_compile"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return out


def conv_fwd_bwd_step(torch, system, conv, device):
    """The eager conv alone, forward and backward of all three inputs (the 374 us figure)."""
    import numpy as np

    rng = np.random.default_rng(7)
    m, e = system.meta, len(system.src)
    x, y, w = (torch.as_tensor(rng.standard_normal(s).astype(np.float32), device=device).requires_grad_(True)
               for s in ((system.atoms, m.DIM_IN1), (e, m.DIM_IN2), (e, m.WEIGHT_NUMEL)))
    src, dst = torch.as_tensor(system.src, device=device), torch.as_tensor(system.dst, device=device)

    def step(i):
        out = conv.conv(x, y, w, src, dst, system.atoms, check=False)
        return torch.autograd.grad(out, (x, y, w), torch.ones_like(out))

    return step


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        os.environ["TRITON_INTERPRET"] = "1"  # before the generated torch modules are imported
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU
    import numpy as np
    import torch

    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    bad_names = [s for s in impls if s not in IMPLS]
    if bad_names:
        raise SystemExit(f"unknown implementation(s) {bad_names}; known {', '.join(IMPLS)}")
    gpu = torch.cuda.is_available() and not args.quick
    if not gpu and not args.quick:
        raise SystemExit("no CUDA device: run with --quick on the CPU")
    device = torch.device("cuda" if gpu else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    gen = Path(args.generated).resolve()
    if str(gen.parent) not in sys.path:
        sys.path.insert(0, str(gen.parent))
    meta = importlib.import_module(f"{gen.name}.{args.problem}")
    ops = importlib.import_module(f"{gen.name}.{args.problem}.torch_ops")
    conv = importlib.import_module(f"{gen.name}.{args.problem}.torch_conv")
    system = System(meta, args.atoms, args.edges)
    dev_name = torch.cuda.get_device_name() if gpu else "CPU (interpreted kernels: --quick, times meaningless)"
    print(f"{dev_name}; {args.problem} conv, {args.atoms} atoms, {args.edges} edges, float32", flush=True)
    notes: dict[str, str] = {}
    t_build = time.perf_counter()
    steps = build_torch_impls(torch, system, conv, device, impls, notes)
    if "torch_conv_fwd_bwd" in impls:
        steps["torch_conv_fwd_bwd"] = conv_fwd_bwd_step(torch, system, conv, device)
    jax_sync = None
    if "jax_jit" in impls:
        try:
            import jax

            jax.config.update("jax_default_matmul_precision", "highest")
            jax_ops = importlib.import_module(f"{gen.name}.{args.problem}.jax_ops")
            ef, how = jax_energy_forces(system, jax_ops)
            jpos = [jax.device_put(p) for p in system.positions]
            jax.block_until_ready(ef(jpos[0]))  # compile
            steps["jax_jit"] = lambda i: ef(jpos[i])
            notes["jax_jit how"] = how
            jax_sync = jax.block_until_ready
        except Exception as e:  # noqa: BLE001
            notes["jax_jit"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    print(f"built in {time.perf_counter() - t_build:.1f} s: {', '.join(steps)}"
          + "".join(f"\n  n/a {k}: {v}" for k, v in notes.items() if not k.endswith(" how")), flush=True)
    if args.warm_only:
        for name, step in steps.items():
            out = step(0)
            if name == "jax_jit":
                jax_sync(out)
            sync()
        print("warm-only: every implementation called once; nothing timed")
        return 0

    # correctness first: energy and forces of every position set against e3nn float64
    want = reference(torch, system, device)
    results = []
    n_pos = len(system.positions)
    for name in impls:
        row = {"impl": name, "status": "ok", "reason": notes.get(name, ""), "target_us": STEP_TARGET_US.get(name)}
        if name not in steps:
            results.append(dict(row, status="n/a"))
            continue
        step = steps[name]
        if name != "torch_conv_fwd_bwd":
            got = []
            for i in range(n_pos):
                e, f = step(i)
                got.append((float(np.asarray(e.cpu() if hasattr(e, "cpu") else e)),
                            np.asarray(f.detach().cpu() if hasattr(f, "detach") else f)))
            row["rel_err"] = rel_errors(got, want)
            if not row["rel_err"] <= RTOL32:
                row["status"], row["reason"] = "BAD", f"rel. error {row['rel_err']:.1e} > {RTOL32:g} vs e3nn float64"
        if name == "jax_jit":
            row["note"] = notes.get("jax_jit how", "")
            last = {}  # JAX dispatches asynchronously: a step is done when its outputs are

            def jstep(i, step=step, last=last):
                last["out"] = step(i)

            row.update(time_steps(jstep, lambda last=last: jax_sync(last.get("out")), n_pos, args.steps, args.warmup))
        else:
            row.update(time_steps(step, sync, n_pos, args.steps, args.warmup))
        t = row["median_us"]
        row["met"] = None if row["target_us"] is None else ("met" if t <= row["target_us"] else "missed")
        print(f"{name}: median {t:.1f} us per synchronized step, pipelined {row['pipelined_us']:.1f}"
              + (f", rel. err {row['rel_err']:.1e}" if "rel_err" in row else "") + f" [{row['status']}]", flush=True)
        results.append(row)

    host_rows = []
    if not args.no_host:
        host_rows = host_overhead(torch, meta, ops, conv, system, device, sync, args)

    doc = {"meta": {"what": "small-graph energy + forces latency and host overhead",
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "device": dev_name, "problem": args.problem, "atoms": args.atoms, "edges": args.edges,
                    "dtype": "float32", "steps": args.steps, "warmup": args.warmup, "calls": args.calls,
                    "reps": args.reps, "quick": args.quick, "argv": sys.argv[1:] if argv is None else list(argv),
                    "torch": torch.__version__, "jax": sys.modules["jax"].__version__ if "jax" in sys.modules else None,
                    "step": "positions -> edge vectors -> spherical harmonics and radial weights (8 functions) -> "
                            "conv -> energy = sum of 0e outputs; forces = -d energy / d positions"},
           "steps": results, "host": host_rows}
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_small_graph.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(doc, indent=1, default=str))
        print(f"JSON: {path}")
    print()
    print(format_tables(doc))
    failed = [r["impl"] for r in results if r["status"] == "BAD"]
    if failed:
        print(f"\nFAILED (wrong energy or forces): {', '.join(failed)}")
        return 1
    return 0


def host_overhead(torch, meta, ops, conv, system, device, sync, args) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(11)
    f32 = torch.float32
    b = args.batch

    def t(*shape, grad=False):
        return torch.as_tensor(rng.standard_normal(shape).astype(np.float32), device=device).requires_grad_(grad)

    x1, x2, w = t(b, meta.DIM_IN1), t(b, meta.DIM_IN2), t(b, meta.WEIGHT_NUMEL)
    x2g, wg = x2.clone().requires_grad_(True), w.clone().requires_grad_(True)
    e = len(system.src)
    cx, cy, cw = t(system.atoms, meta.DIM_IN1), t(e, meta.DIM_IN2), t(e, meta.WEIGHT_NUMEL)
    src, dst = torch.as_tensor(system.src, device=device), torch.as_tensor(system.dst, device=device)
    n = system.atoms
    small = torch.zeros(b, meta.DIM_IN1, device=device, dtype=f32)
    cases = [
        ("torch", "floor: x + 1", None, lambda: small + 1),
        ("eqdsl", "tensor_product, no grad", HOST_TARGET_US, lambda: ops.tensor_product(x1, x2, w)),
        ("eqdsl", "tensor_product, inputs need grad", HOST_TARGET_US, lambda: ops.tensor_product(x1, x2g, wg)),
        ("eqdsl", "conv, no grad, check=False", HOST_TARGET_US, lambda: conv.conv(cx, cy, cw, src, dst, n, check=False)),
        ("eqdsl", "conv, no grad, check=True (syncs)", None, lambda: conv.conv(cx, cy, cw, src, dst, n)),
    ]
    try:  # the anchor: e3nn's module for the same product, float32 (the default dtype)
        from e3nn import o3

        tp = o3.TensorProduct(meta.IRREPS_IN1, meta.IRREPS_IN2, meta.IRREPS_OUT,
                              [tuple(i) for i in meta.INSTRUCTIONS], irrep_normalization=meta.IRREP_NORMALIZATION,
                              path_normalization=meta.PATH_NORMALIZATION, internal_weights=False,
                              shared_weights=meta.SHARED_WEIGHTS).to(device)
        cases += [("e3nn", "TensorProduct, no grad", None, lambda: tp(x1, x2, w)),
                  ("e3nn", "TensorProduct, inputs need grad", None, lambda: tp(x1, x2g, wg))]
    except Exception as ex:  # noqa: BLE001
        print(f"e3nn anchor n/a: {type(ex).__name__}: {ex}")
    rows = []
    for impl, case, target, fn in cases:
        r = host_us(fn, sync, args.calls, args.reps)
        met = None if target is None else ("met" if r["host_us"] <= target else "missed")
        rows.append({"impl": impl, "case": case, "target_us": target, "met": met, **r})
        print(f"host: {impl} {case}: {r['host_us']:.1f} us/call, pipelined {r['pipelined_us']:.1f}", flush=True)
    return rows


def format_tables(doc: dict) -> str:
    m = doc["meta"]
    lines = [f"energy + forces step, {m['problem']} conv, {m['atoms']} atoms, {m['edges']} edges, {m['dtype']}, "
             f"{m['device']}: us per synchronized step (median of {m['steps']})"]
    rows = [("implementation", "median us", "pipelined us", "target", "", "rel. err", "note")]
    for r in doc["steps"]:
        if "median_us" in r:
            rows.append((r["impl"], f"{r['median_us']:.1f}", f"{r['pipelined_us']:.1f}",
                         "-" if r["target_us"] is None else f"<= {r['target_us']:g}", r.get("met") or "-",
                         f"{r['rel_err']:.1e}" if "rel_err" in r else "-",
                         (r["status"] + ": " + r["reason"]) if r["status"] != "ok" else r.get("note", "")))
        else:
            rows.append((r["impl"], r["status"], "-", "-" if r["target_us"] is None else f"<= {r['target_us']:g}",
                         "n/a", "-", r.get("reason", "")))
    lines.append(_columns(rows))
    if doc.get("host"):
        lines += ["", "host overhead per eager call (no sync in the loop; min over loops)"]
        rows = [("impl", "case", "host us", "pipelined us", "target", "")]
        for r in doc["host"]:
            rows.append((r["impl"], r["case"], f"{r['host_us']:.1f}", f"{r['pipelined_us']:.1f}",
                         "-" if r["target_us"] is None else f"<= {r['target_us']:g}", r.get("met") or "-"))
        lines.append(_columns(rows))
    return "\n".join(lines)


def _columns(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([str(c).ljust(w) for c, w in zip(r[:-1], widths)] + [str(r[-1])]) for r in rows)


if __name__ == "__main__":
    sys.exit(main())
