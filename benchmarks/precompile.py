"""Compile what a benchmark run will call, in parallel, before anything is timed.

Compiling is single-threaded per kernel (Triton and ptxas for a torch kernel; XLA's Triton pipeline for a Pallas kernel): 20 to 60 s per
kernel on the device machine's host, several minutes per problem, so a benchmark of
every problem would spend most of a device call compiling one kernel at a time. This
script runs the compile jobs on a pool of ``--workers`` processes, longest first, and
leaves their results where the benchmark's processes find them:

* torch (always): one job per generated Helion kernel (``--per-op``: per kernel op). The
  job calls its op once on a small CUDA batch with every other kernel of the op stubbed
  out, which leaves the compiled binary of the kernel's shipped Triton code
  (``eqdsl.runtime.triton_launch``) in ``$TRITON_CACHE_DIR``. (``eqdsl build`` compiles
  the same binaries on a CPU instead: ``docs/ahead-of-time.md``.)
  Sizes are multiples of 16 like the benchmarks' (Triton specializes integers on
  divisibility by 16), so the benchmarks only load both.
* JAX (``--jax``): one job per problem and JAX implementation (eqdsl's Pallas ops, their
  ``ir_mul`` twins, e3nn-jax) runs ``bench_tp.py --warm-only`` (and, for a conv problem,
  ``bench_conv.py --warm-only``) compiling that implementation alone: the same jitted
  functions on the same shapes as the timed run, each called once and not timed. With JAX's persistent compilation cache on
  (``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``, as
  ``run_device.sh`` sets them) the timed run then loads the executables instead of
  compiling them. The warm jobs take the benchmark defaults (20,000 rows; the conv's
  default graphs and latency graph): pass the same to the timed run.

``--bench`` compiles only the torch kernels that the benchmarks' forward and
forward+backward call: the forward, and the fused backward where the product has one
(channelwise) or else the three backward ops; the conv's likewise. Without it every op
(the second-order ones too).

    python3 benchmarks/precompile.py --workers 15 [--bench] [--jax] [--problems a,b]
                                     [--dtypes float32] [--no-conv | --conv-only] [--generated DIR]

Prints one line per job (seconds, or the error) and a total; exits 0 even if a job failed
(the benchmark reports that problem as n/a with the reason).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import importlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOAT64_PROBLEMS = ("mace_large", "nequip_toluene")
TP_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")
CONV_OPS = ("conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w")
# conv_radial's ops with kernels of their own (a spec with radial_features; each where its launcher exists)
RADIAL_OPS = ("conv_radial_fwd", "conv_radial_bwd_x", "conv_radial_bwd_y", "conv_radial_bwd")
CONV_PROBLEMS = ("mace_large", "nequip_toluene")  # bench_conv.py's default problems
TWIN_SUFFIX = "_irmul"  # the ir_mul twins' package names (benchmarks/layout_twins.py)
LATENCY_PROBLEM = "mace_large"  # bench_conv.py's default latency problem
JAX_IMPLS = "eqdsl_jax,eqdsl_jax_irmul,e3nn_jax"  # in the timed run's order (ALL_IMPLS)
RADIAL_JAX_IMPLS = "eqdsl_jax,eqdsl_jax_unfused,e3nn_jax"  # bench_conv --radial's, in order (RADIAL_IMPLS)
LATENCY_JAX_IMPLS = "eqdsl_jax,e3nn_jax"  # bench_conv.LATENCY_IMPLS' JAX ones, in order


@dataclass(frozen=True)
class Job:
    """One compile job: a label for the log, its command line, and a cost estimate (s) for ordering."""

    label: str
    argv: tuple[str, ...]
    cost: float

    def __str__(self) -> str:
        return f"{self.label} (~{self.cost:.0f} s)"


def launcher_name(op: str) -> str:
    """The generated module's function that launches ``op``'s kernels (``conv_bwd_x`` -> ``_launch_bwd_x``)."""
    return "_launch_" + op.removeprefix("conv_")


def op_kernels(source: str, op: str) -> list[str]:
    """Names of the Helion kernels ``op``'s launcher calls (``_k.<name>(...)``), in source order."""
    want = launcher_name(op)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == want:
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and isinstance(n.func.value, ast.Name) and n.func.value.id == "_k"]
            return list(dict.fromkeys(c.func.attr for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))))
    raise ValueError(f"no {want} in the generated module")


def kernel_lines(source: str) -> dict[str, int]:
    """Source lines of every function of a generated kernels module (a cost estimate)."""
    return {n.name: (n.end_lineno or n.lineno) - n.lineno + 1 for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef)}


def needed_ops(source: str, conv: bool, bench: bool) -> list[str]:
    """The kernel ops of a generated torch module (``torch_ops.py``, or ``torch_conv.py`` with
    ``conv``) to compile: all of them, or with ``bench`` those the benchmarks' forward and
    forward+backward call (the fused backward replaces the three backward ops there; conv_radial's
    ops only without ``bench``)."""
    ops = list(CONV_OPS if conv else TP_OPS)
    radial = [op for op in RADIAL_OPS if f"\ndef {launcher_name(op)}(" in source] if conv and not bench else []
    if "\ndef _launch_bwd(" not in source:  # no fused backward (one launcher for the three gradients)
        return ops + radial
    fused = ("conv_" if conv else "") + "bwd"
    return [ops[0], fused] if bench else ops + [fused] + radial


def torch_jobs(problems: list[str], dtypes: list[str] | None, conv: str, bench: bool, per_kernel: bool,
               generated: Path) -> list[Job]:
    """``conv``: "with", "no" or "only"."""
    out = []
    for p in problems:
        gen = generated / p
        name = p.removesuffix(TWIN_SUFFIX)  # an ir_mul twin is benchmarked where its problem is
        modules = []
        if conv != "only" and (gen / "torch_ops.py").is_file():
            modules.append(("torch_ops.py", "helion_kernels.py", False))
        if conv != "no" and (gen / "torch_conv.py").is_file() and (not bench or name in CONV_PROBLEMS):
            modules.append(("torch_conv.py", "helion_conv_kernels.py", True))
        for module, kernels_file, is_conv in modules:
            source = (gen / module).read_text(encoding="utf-8")
            lines = kernel_lines((gen / kernels_file).read_text(encoding="utf-8"))
            for dt in dtypes or (["float32", "float64"] if name in FLOAT64_PROBLEMS else ["float32"]):
                if is_conv and dt != "float32" and bench and not dtypes:
                    continue  # bench_conv times float32 unless told otherwise (harness.sh conv64)
                def cost(kernels, scale=1.5 if dt == "float64" else 1.0):
                    return scale * (10 + sum(lines.get(k, 200) for k in kernels) / 25)

                for op in needed_ops(source, is_conv, bench):
                    kernels = op_kernels(source, op)
                    base = (sys.executable, str(Path(__file__).resolve()), "--generated", str(generated),
                            "--job", p, dt, op)
                    if per_kernel:
                        out += [Job(f"{p}/{dt}/{op}/{k}", base + ("--kernel", k), cost([k])) for k in kernels]
                    else:
                        out.append(Job(f"{p}/{dt}/{op}", base, cost(kernels)))
    return out


def jax_jobs(problems: list[str], conv: str, generated: Path, specs: Path, subset: bool = False,
             dtypes: list[str] | None = None, radial: bool = False, latency: bool = True) -> list[Job]:
    """Warm-up runs of the benchmarks' JAX implementations, one process per problem, benchmark
    and implementation (label ``<problem>/jax/<tp|conv>/<impl>``).

    Each compiles its implementation of its problem (``--warm-target``, ``--warm-impl``) after
    lowering, in the timed run's order, what the timed run lowers before it: with jax 0.11.2 a
    Pallas kernel's serialized Triton IR, hence its persistent-cache key, came out different after
    other lowerings in the same process (the same text, other bytes), so a job that compiled its
    problem alone missed the cache for every fused backward but the timed run's first. Lowering
    is a few seconds where compiling is tens, so the implementations of one problem compile side
    by side (2026-11-27, H100: one job for the three took 206 s for nequip_toluene's float64 conv,
    its slowest member 75 s). ``subset``: pass ``problems`` on (the timed run was given the same
    ``--problems``); ``dtypes``: pass ``--dtypes`` on (likewise); ``radial``: the conv jobs replay
    ``bench_conv.py --radial`` (its JAX implementations) instead; ``latency`` False: the conv jobs
    skip the latency section (``--no-latency``, as the timed run is told)."""
    out = []
    for p in problems:
        gen = generated / p
        if not (gen / "jax_ops.py").is_file():
            continue
        size = (gen / "pallas_kernels.py").stat().st_size if (gen / "pallas_kernels.py").is_file() else 0
        common = ("--generated", str(generated), "--specs", str(specs), "--warm-only", "--warm-target", p) \
            + (("--dtypes", ",".join(dtypes)) if dtypes else ())
        if conv != "only":
            dts = 2 if p in FLOAT64_PROBLEMS else 1
            argv = (sys.executable, str(ROOT / "benchmarks" / "bench_tp.py"), "--batch", "20000") + common \
                + ("--impls", JAX_IMPLS) + (("--problems", ",".join(problems)) if subset else ())
            out += [Job(f"{p}/jax/tp/{impl}", argv + ("--warm-impl", impl), dts * (5 + size / 60000))
                    for impl in JAX_IMPLS.split(",")]
        if conv != "no" and p in CONV_PROBLEMS and "def conv(" in (gen / "jax_ops.py").read_text(encoding="utf-8"):
            # the latency section comes first in the timed run: lowered here, or compiled for its problem
            section = ("--latency-impls", LATENCY_JAX_IMPLS) if latency else ("--no-latency",)
            conv_problems = ("--problems", ",".join(q for q in problems if q in CONV_PROBLEMS)) if subset else ()
            impls = RADIAL_JAX_IMPLS if radial else JAX_IMPLS
            argv = (sys.executable, str(ROOT / "benchmarks" / "bench_conv.py")) + common \
                + (("--radial",) if radial else ()) + ("--impls", impls) + conv_problems \
                + section
            out += [Job(f"{p}/jax/conv/{impl}", argv + ("--warm-impl", impl), 10 + size / 20000)
                    for impl in impls.split(",")]
    return out


class _OnlyKernel:
    """The launchers of a generated module with every kernel but one replaced by a no-op."""

    def __init__(self, launchers, keep: str):
        self._launchers, self._keep = launchers, keep

    def __getattr__(self, name):
        if name == self._keep:
            return getattr(self._launchers, name)
        return lambda *args, **kwargs: None


def run_job(problem: str, dtype: str, op: str, generated: Path = ROOT / "generated", kernel: str | None = None) -> None:
    """Call one op of ``<generated>/<problem>`` once on CUDA (compiles its kernels, or only ``kernel``)."""
    import torch

    sys.path.insert(0, str(generated.resolve().parent))
    package = f"{generated.resolve().name}.{problem}"
    if op.startswith("conv_"):
        ops = importlib.import_module(f"{package}.torch_conv")
    else:
        ops = importlib.import_module(f"{package}.torch_ops")
    if kernel is not None:
        if not hasattr(ops._k, kernel):
            raise SystemExit(f"{package}: no kernel {kernel}")
        ops._k = _OnlyKernel(ops._k, kernel)  # the launchers read the module global at call time
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    # enough rows that shared-weight gradients have several partial-sum rows (a size of 1
    # is a Triton specialization of its own: tetris_poly_1's bwd_w recompiled for 97 s)
    rows = 4096
    x1 = torch.randn(rows, ops.DIM_IN1, dtype=dt, device=dev)
    x2 = torch.randn(rows, ops.DIM_IN2, dtype=dt, device=dev)
    g = torch.randn(rows, ops.DIM_OUT, dtype=dt, device=dev)
    shared = getattr(ops, "SHARED_WEIGHTS", False)
    w = torch.randn(*(() if shared else (rows,)), ops.WEIGHT_NUMEL, dtype=dt, device=dev)
    if op.startswith("conv_"):
        nodes = 256
        xn = torch.randn(nodes, ops.DIM_IN1, dtype=dt, device=dev)
        gn = torch.randn(nodes, ops.DIM_OUT, dtype=dt, device=dev)
        # graphs below SEGMENT_MIN_EDGES launch a segment op's atomic kernels: compile both
        sizes = [rows] + ([max(rows, ops.SEGMENT_MIN_EDGES)] if getattr(ops, "SEGMENT_MIN_EDGES", 0) > rows else [])
        for edges in sizes:
            src = torch.randint(0, nodes, (edges,), device=dev)
            dst = torch.sort(torch.randint(0, nodes, (edges,), device=dev)).values
            ye = torch.randn(edges, ops.DIM_IN2, dtype=dt, device=dev)
            we = w if shared else torch.randn(edges, ops.WEIGHT_NUMEL, dtype=dt, device=dev)
            h = getattr(ops, "RADIAL_FEATURES", None) or 1  # conv_radial: (edges, H) features, (H, numel) matrix
            rf = torch.randn(edges, h, dtype=dt, device=dev)
            wr = torch.randn(h, ops.WEIGHT_NUMEL, dtype=dt, device=dev)
            args = {
                "conv_fwd": (xn, ye, we),
                "conv_bwd_x": (gn, ye, we),
                "conv_bwd_y": (xn, gn, we),
                "conv_bwd_w": (xn, ye, gn),
                "conv_bwd": (xn, ye, we, gn),
                "conv_radial_fwd": (xn, ye, rf, wr),
                "conv_radial_bwd_x": (gn, ye, rf, wr),
                "conv_radial_bwd_y": (xn, gn, rf, wr),
                "conv_radial_bwd": (xn, ye, rf, wr, gn),
            }[op]
            # the graph tensors the spec's ops take (sort orders and row pointers of segment scatters)
            getattr(ops, op + "_op")(*args, *ops.graph_tensors(src, dst, nodes), nodes)
    else:
        args = {"fwd": (x1, x2, w), "bwd_x1": (g, x2, w), "bwd_x2": (x1, g, w), "bwd_w": (x1, x2, g), "bwd": (x1, x2, w, g)}[op]
        getattr(ops, op + "_op")(*args)
    torch.cuda.synchronize()


def schedule(jobs: list[Job]) -> list[Job]:
    """Longest estimated job first (so the longest ones never start last), ties by label."""
    return sorted(jobs, key=lambda j: (-j.cost, j.label))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--problems", help="comma-separated (default: every generated/ tensor-product package)")
    p.add_argument("--dtypes", help="comma-separated (default: float32, and float64 for " + ", ".join(FLOAT64_PROBLEMS) + ")")
    p.add_argument("--no-conv", action="store_true", help="only the plain tensor product's kernels")
    p.add_argument("--conv-only", action="store_true", help="only the fused convolution's kernels")
    p.add_argument("--radial", action="store_true", help="the JAX conv warm-ups replay bench_conv.py --radial "
                   "(harness.sh radial)")
    p.add_argument("--no-latency", dest="latency", action="store_false", help="the JAX conv warm-ups skip "
                   "bench_conv.py's latency section (the timed run is given --no-latency: harness.sh conv64)")
    p.add_argument("--bench", action="store_true", help="only the torch kernels the benchmarks call")
    p.add_argument("--jax", action="store_true", help="also warm JAX's persistent compilation cache (bench_tp / "
                   "bench_conv --warm-only with " + JAX_IMPLS + ")")
    p.add_argument("--per-op", action="store_true", help="one torch job per kernel op instead of per kernel")
    p.add_argument("--list", action="store_true", help="print the jobs in start order and exit")
    p.add_argument("--log-dir", type=Path, help="write each job's output to <dir>/<label>.log")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per job")
    p.add_argument("--deadline", type=float, default=None, help="seconds from the start: no job starts after "
                   "it and a job still running then is killed (what it would have compiled compiles on first use)")
    p.add_argument("--generated", type=Path, default=ROOT / "generated", help="generated directory (default: generated)")
    p.add_argument("--specs", type=Path, default=ROOT / "examples" / "specs", help="spec directory (JAX jobs)")
    p.add_argument("--job", nargs=3, metavar=("PROBLEM", "DTYPE", "OP"), help=argparse.SUPPRESS)
    p.add_argument("--kernel", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        run_job(*args.job, generated=args.generated, kernel=args.kernel)
        return 0
    # default: the tensor-product packages (a symmetric contraction has no torch_ops.py; its kernels compile on first use)
    problems = args.problems.split(",") if args.problems else sorted(
        d.name for d in args.generated.iterdir() if (d / "torch_ops.py").is_file())
    conv = "no" if args.no_conv else "only" if args.conv_only else "with"
    dtypes = args.dtypes.split(",") if args.dtypes else None
    todo = torch_jobs(problems, dtypes, conv, args.bench, not args.per_op, args.generated)
    if args.jax:
        todo += jax_jobs(problems, conv, args.generated, args.specs, subset=bool(args.problems), dtypes=dtypes,
                         radial=args.radial, latency=args.latency)
    todo = schedule(todo)
    if args.list:
        for j in todo:
            print(j)
        print(f"{len(todo)} jobs, ~{sum(j.cost for j in todo):.0f} s of compiling estimated")
        return 0
    t0 = time.perf_counter()

    def one(job: Job):
        t = time.perf_counter()
        limit = args.timeout
        if args.deadline is not None:
            limit = min(limit, args.deadline - (t - t0))
            if limit <= 0:
                return job, False, "not started: deadline", 0.0
        try:
            r = subprocess.run(list(job.argv), capture_output=True, text=True, timeout=limit)
            if args.log_dir is not None:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                (args.log_dir / (job.label.replace("/", "_") + ".log")).write_text(r.stdout + r.stderr, encoding="utf-8")
            ok = r.returncode == 0
            warm = [x for x in r.stdout.splitlines() if x.startswith(("warm:", "  not warmed:"))]
            why = " | ".join(warm)[:300] if ok else (warm or r.stderr.strip().splitlines() or ["?"])[-1][:300]
        except subprocess.TimeoutExpired:
            ok, why = False, f"killed after {limit:.0f} s" + (" (deadline)" if limit < args.timeout else "")
        return job, ok, why, time.perf_counter() - t

    failed = 0
    with cf.ThreadPoolExecutor(args.workers) as pool:
        for fut in cf.as_completed([pool.submit(one, j) for j in todo]):
            job, ok, why, dt = fut.result()
            failed += not ok
            print(f"[{time.perf_counter() - t0:6.1f}s] {job.label:50s} {dt:6.1f}s (est {job.cost:4.0f}) "
                  f"{'ok ' + why if ok else 'FAILED: ' + why}", flush=True)
    print(f"precompile: {len(todo)} jobs, {failed} failed, {time.perf_counter() - t0:.0f} s on {args.workers} workers",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
