"""``eqdsl tune SPEC``: choose a spec's Helion kernel parameters by timing them on a GPU.

Each kernel op is tuned on its own: an op's kernels depend only on its tuning, so the
best ``fwd`` kernels and the best ``bwd_x2`` kernels need not share tile sizes (they
hold different operands in registers). For each op (``TP_OPS``, plus ``CONV_OPS`` when
asked and the spec has ``conv = true``) the candidates are the spec's current tuning of
that op, then every combination of a grid over ``spec.TUNING_KEYS`` (default
``DEFAULT_GRID``: ``num_warps`` 4, 8; ``block_b`` 2, 4, 8, 16; ``block_c`` 32, 64, 128) set in
the op's sub-table ``[tensor_product.tuning.<op>]``; combinations that give the op the
same kernels as an earlier one are dropped.

One job per (op, candidate), run in a pool of worker processes: generate the package
with that table, call the op once on CUDA (compiling: Helion's code generation, then
Triton; 20 s to 2 min per kernel on the H100 machine's host, single-threaded, hence the
pool), then time it while holding a machine-wide lock (``LOCK``), so that exactly one
job at a time runs on the GPU while the others compile. A timing is the median of
``TIMED_CALLS`` CUDA-event intervals around the op at ``batch`` rows (edges for the
conv ops, on a random graph with ``batch // 64`` nodes) after warm-up calls.

The Pallas (JAX) kernels are tuned as one more op, ``pallas`` (``PALLAS_OPS``; in the
default ops when jax sees a GPU): all of a spec's Pallas kernels share the top-level
keys ``pallas_block_batch`` and ``pallas_num_warps`` (and ``pallas_fuse_bwd``, when
asked for in ``grid``), so a candidate sets those (default grid ``PALLAS_GRID``), and its
time is that of the jitted forward and backward together (``jax.vjp`` of
``tensor_product``, what training runs): the median over groups of calls ended by
``block_until_ready``, wall clock. The JAX conv's per-edge kernels take the same
``pallas_block_batch``, so they follow the choice made on the plain product (not timed on
a graph); its segment kernels' ``pallas_segment_edges`` is not tuned here
(``benchmarks/gpu_jax_conv_blocks.py`` times it on graphs). The grid's ``pallas_*`` keys apply to the ``pallas``
op only, the others to the Helion ops only; an op none of whose keys the grid names
gets its default grid.

With ``write``, the winners replace the spec's tuning sections (each Helion op's
sub-table, the ``pallas_*`` keys of the top-level section; its other keys stay) and the
package is regenerated, so the choice is committed with the spec and the generated
module; users never tune at import.

Raises ``TuneError`` (one line) without a CUDA GPU (for the Helion ops: torch's; for
``pallas``: jax's), for a multi-table spec, a bad grid or op list, or when no candidate
of an op ran; ``SpecError`` for a bad spec.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .spec import TUNING_KEYS, TUNING_OPS, TensorProductSpec, load_spec, parse_spec

__all__ = [
    "TuneError", "DEFAULT_GRID", "PALLAS_GRID", "TP_OPS", "FUSED_OPS", "CONV_OPS", "PALLAS_OPS", "parse_grid",
    "candidates", "override",
    "tuning_sections", "with_tuning", "tune", "format_results",
]

# 2- and 4-row tiles with 64 or 128 channels: why they suit mul_ir blocks is in
# helion_backend.Tuning (block_b)
DEFAULT_GRID = {"num_warps": (4, 8), "block_b": (2, 4, 8, 16), "block_c": (32, 64, 128)}
TP_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")
FUSED_OPS = ("bwd",)  # a channelwise product's fused backward (helion_fused), where it has one
FUSED_CONV_OPS = ("conv_bwd",)  # and its atomic convolution's
CONV_OPS = ("conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w")
PALLAS_OPS = ("pallas",)  # every Pallas kernel of the spec, timed as the jitted forward + backward
# rows per program from 8 (small graphs: more programs) to 128, and warps per program
PALLAS_GRID = {"pallas_block_batch": (8, 16, 32, 64, 128), "pallas_num_warps": (2, 4, 8)}
JAX_GROUP_CALLS, JAX_GROUPS = 10, 7  # pallas timing: calls per block_until_ready, groups (median)
LOCK = Path(tempfile.gettempdir()) / "eqdsl_tune_gpu.lock"
WARMUP_CALLS, TIMED_CALLS = 3, 30
MIN_GAIN = 0.01  # a candidate replaces the op's current tuning only if at least this much faster
_SECTION = re.compile(r"^\[\s*tensor_product\s*\.\s*tuning\s*(\.\s*(\w+)\s*)?\]", re.MULTILINE)
_ANY_SECTION = re.compile(r"^\[", re.MULTILINE)

Pairs = tuple[tuple[str, int], ...]  # a spec's tuning table (TensorProductSpec.tuning)
Candidate = tuple[tuple[str, int], ...]  # the keys one op's sub-table sets; () = the op as the spec has it


class TuneError(RuntimeError):
    """Why ``eqdsl tune`` cannot run (one line)."""


def parse_grid(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["num_warps=4,8", "block_b=16"]`` -> ``{"num_warps": (4, 8), "block_b": (16,)}``, validated."""
    grid: dict[str, tuple[int, ...]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or key not in TUNING_KEYS:
            raise TuneError(f"--grid {item!r}: expected KEY=V1,V2,... with KEY one of {', '.join(TUNING_KEYS)}")
        test, accepts = TUNING_KEYS[key]
        try:
            vals = tuple(int(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise TuneError(f"--grid {item!r}: values must be integers") from None
        bad = [v for v in vals if not test(v)]
        if not vals or bad:
            raise TuneError(f"--grid {item!r}: {key} must be {accepts}")
        grid[key] = vals
    return grid


def override(table: Pairs, op: str, cand: Candidate) -> Pairs:
    """``table`` with ``cand``'s keys set in ``op``'s sub-table (replacing what it had there);
    for ``pallas``, the top-level ``pallas_*`` keys."""
    new = {k if op in PALLAS_OPS else f"{op}.{k}": v for k, v in cand}
    return tuple(sorted({**dict(table), **new}.items()))


def op_grid(grid: dict[str, tuple[int, ...]] | None, op: str) -> dict[str, tuple[int, ...]]:
    """The part of ``grid`` that tunes ``op`` (``pallas_*`` keys for ``pallas``, the others for
    the Helion ops), or the op's default grid when ``grid`` is ``None`` or names none of them."""
    pallas = op in PALLAS_OPS
    mine = {k: v for k, v in (grid or {}).items() if k.startswith("pallas_") == pallas}
    return mine or dict(PALLAS_GRID if pallas else DEFAULT_GRID)


def _effective(table: Pairs, op: str):
    """What decides ``op``'s kernels under ``table`` (two candidates with equal values are one)."""
    if op in PALLAS_OPS:
        return tuple((k, v) for k, v in table if k.startswith("pallas_"))
    from .codegen.helion_backend import tuning_for

    return tuning_for(table, op)


def candidates(grid: dict[str, tuple[int, ...]], table: Pairs, op: str) -> list[Candidate]:
    """``()`` (the op as ``table`` tunes it), then every combination of ``grid`` for ``op``'s
    sub-table (``pallas``: the top-level ``pallas_*`` keys) that gives the op other kernels
    than every earlier candidate."""
    keys = sorted(grid)
    out: list[Candidate] = [()]
    seen = {_effective(table, op)}
    for values in itertools.product(*(grid[k] for k in keys)):
        cand = tuple(zip(keys, values))
        t = _effective(override(table, op, cand), op)
        if t not in seen:
            seen.add(t)
            out.append(cand)
    return out


def tuning_sections(table: Pairs, comments: dict[str, list[str]] | None = None) -> str:
    """TOML text of ``table``: ``[tensor_product.tuning]`` for its top-level keys, then one
    ``[tensor_product.tuning.<op>]`` per op sub-table (in ``TUNING_OPS`` order).
    ``comments``: full-line comments to put under a section's header, by op (``""``: the
    top-level section), as ``_section_comments`` reads them from the spec."""
    comments = comments or {}

    def section(op: str, pairs: list[tuple[str, int]]) -> str:
        header = f"[tensor_product.tuning{'.' + op if op else ''}]\n"
        return header + "".join(c + "\n" for c in comments.get(op, [])) + "".join(f"{k} = {v}\n" for k, v in pairs)

    base = [(k, v) for k, v in table if "." not in k]
    text = section("", base) if base else ""
    for op in TUNING_OPS:
        sub = [(k.partition(".")[2], v) for k, v in table if k.partition(".")[0] == op]
        if sub:
            text += ("\n" if text else "") + section(op, sub)
    return text


def _section_comments(sections: str) -> dict[str, list[str]]:
    """The full-line comments of each tuning section of ``sections`` (spec text from the first
    ``[tensor_product.tuning...]`` header on), by op (``""``: the top-level section): the
    reasons a spec's author wrote there survive ``eqdsl tune --write``."""
    out: dict[str, list[str]] = {}
    heads = list(_SECTION.finditer(sections))
    for m, nxt in zip(heads, heads[1:] + [None]):
        body = sections[m.end(): nxt.start() if nxt else len(sections)]
        lines = [line.strip() for line in body.splitlines() if line.strip().startswith("#")]
        if lines:
            out[m.group(2) or ""] = lines
    return out


def with_tuning(text: str, table: Pairs) -> str:
    """Spec text with its tuning sections replaced by ``table``'s (appended at the end; the
    sections must be the file's last, as ``eqdsl tune`` writes them). A section's full-line
    comments are kept under its header; comments after a value are not."""
    first = _SECTION.search(text)
    body, comments = text, {}
    if first:
        rest = text[first.start():]
        if any(not _SECTION.match(rest, m.start()) for m in _ANY_SECTION.finditer(rest)):
            raise TuneError("the [tensor_product.tuning] sections must be the last sections of the spec file")
        body, comments = text[: first.start()], _section_comments(rest)
    body = body.rstrip("\n") + "\n"
    sections = tuning_sections(table, comments)
    return body + ("\n" + sections if sections else "")


def _single(spec_path: Path) -> tuple[str, TensorProductSpec]:
    text = spec_path.read_text(encoding="utf-8")
    specs = load_spec(spec_path)
    if len(specs) != 1:
        raise TuneError(f"{spec_path}: {len(specs)} [[tensor_product]] tables; eqdsl tune takes a spec with one")
    return text, specs[0]


# ------------------------------------------------------------------ the worker processes


def _op_call(ops, conv, op: str, batch: int, dtype: str):
    """A no-argument call of one op of the imported package on random CUDA inputs."""
    import torch

    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=dt)

    x1, x2 = rand(batch, ops.DIM_IN1), rand(batch, ops.DIM_IN2)
    w = rand(ops.WEIGHT_NUMEL) if ops.SHARED_WEIGHTS else rand(batch, ops.WEIGHT_NUMEL)
    if op in TP_OPS + FUSED_OPS:
        g = rand(batch, ops.DIM_OUT)
        args = {"fwd": (x1, x2, w), "bwd_x1": (g, x2, w), "bwd_x2": (x1, g, w), "bwd_w": (x1, x2, g), "bwd": (x1, x2, w, g)}[op]
        fn = getattr(ops, f"{op}_op")
        return lambda: fn(*args)
    nodes = max(1, batch // 64)
    src = torch.randint(0, nodes, (batch,), generator=gen, device=dev)
    dst = torch.sort(torch.randint(0, nodes, (batch,), generator=gen, device=dev)).values
    # node operands only: a per-edge cotangent would be (edges, DIM_OUT), 4 GB for
    # mace_large at 114,688 edges, times the workers sharing the GPU
    xn, gn = rand(nodes, ops.DIM_IN1), rand(nodes, ops.DIM_OUT)
    args = {"conv_fwd": (xn, x2, w), "conv_bwd_x": (gn, x2, w), "conv_bwd_y": (xn, gn, w), "conv_bwd_w": (xn, x2, gn),
            "conv_bwd": (xn, x2, w, gn)}[op]
    fn = getattr(conv, f"{op}_op")
    graph = conv.graph_tensors(src, dst, nodes)  # with the sort orders of segment scatters
    return lambda: fn(*args, *graph, nodes)


def _jax_call(jax_ops, batch: int, dtype: str):
    """A no-argument call of the jitted forward + backward (``jax.vjp`` of
    ``tensor_product``) of the imported package on random inputs, returning the output and
    the three gradients (the output too, so that XLA cannot drop the forward kernel)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    dt = jnp.dtype(dtype)

    def rand(key, *shape):
        return jax.random.normal(key, shape, dt)

    x1, x2, g = rand(keys[0], batch, jax_ops.DIM_IN1), rand(keys[1], batch, jax_ops.DIM_IN2), rand(keys[2], batch, jax_ops.DIM_OUT)
    w = rand(keys[3], jax_ops.WEIGHT_NUMEL) if jax_ops.SHARED_WEIGHTS else rand(keys[3], batch, jax_ops.WEIGHT_NUMEL)

    @jax.jit
    def fwd_bwd(x1, x2, w, g):
        out, vjp = jax.vjp(jax_ops.tensor_product, x1, x2, w)
        return out, vjp(g)

    return lambda: fwd_bwd(x1, x2, w, g)


def jax_median_us(call, warmup: int, groups: int, per_group: int) -> float:
    """Median microseconds per call of ``call()`` over ``groups`` groups of ``per_group`` calls,
    each group ended by ``block_until_ready`` (wall clock: JAX has no CUDA events)."""
    import time

    import jax

    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(groups):
        t0 = time.perf_counter()
        for _ in range(per_group):
            out = call()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / per_group)
    return sorted(times)[len(times) // 2] * 1e6


def measure(spec_file: str, package_dir: str, op: str, batch: int, dtype: str, lock: str) -> float:
    """Generate one candidate's package, compile ``op`` (outside the lock), then time it
    holding the GPU lock; the median call in microseconds."""
    import fcntl
    import importlib

    from .codegen.generate import generate_files, write_package

    files = generate_files(spec_file, package_dir, triton=False)
    write_package(Path(package_dir), files)
    name = next(iter(files)).split("/")[0]
    sys.path.insert(0, package_dir)
    if op in PALLAS_OPS:
        call = _jax_call(importlib.import_module(f"{name}.jax_ops"), batch, dtype)
        call()  # compiles

        def timed() -> float:
            return jax_median_us(call, WARMUP_CALLS, JAX_GROUPS, JAX_GROUP_CALLS)
    else:
        import torch

        ops = importlib.import_module(f"{name}.torch_ops")
        conv = importlib.import_module(f"{name}.torch_conv") if op in CONV_OPS + FUSED_CONV_OPS else None
        call = _op_call(ops, conv, op, batch, dtype)
        call()  # compiles
        torch.cuda.synchronize()

        def timed() -> float:
            return cuda_median_us(call, WARMUP_CALLS, TIMED_CALLS)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            return timed()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cuda_median_us(call, warmup: int, reps: int) -> float:
    """Median microseconds of ``call()`` over ``reps`` CUDA-event intervals after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in events)
    return ms[len(ms) // 2] * 1e3


def _error_line(stderr: str) -> str:
    """The exception line of a failed job's stderr (torch's CUDA errors end with a hint
    line, not the error), or its last line."""
    lines = stderr.strip().splitlines() or ["?"]
    errors = [s for s in lines if re.match(r"^[\w.]*(Error|Exception)\b", s)]
    return (errors or lines)[-1][:200]


def _worker(spec_file: str, package_dir: str, op: str, batch: int, dtype: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "eqdsl.tune", "--worker", spec_file, package_dir, op, str(batch), dtype, str(LOCK)]
    # JAX workers compile side by side: each allocates GPU memory as it needs it, not 75% up front
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if op in PALLAS_OPS and dtype == "float64":
        env["JAX_ENABLE_X64"] = "1"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": _error_line(r.stderr)}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the command


def tune(
    spec_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    batch: int = 20000,
    dtype: str = "float32",
    grid: dict[str, tuple[int, ...]] | None = None,
    ops: tuple[str, ...] | None = None,
    workers: int | None = None,
    write: bool = False,
    timeout: float = 900.0,
    run_worker: Callable[..., dict] = _worker,
    require_cuda: bool = True,
    report: Callable[[str], None] = print,
) -> tuple[Pairs, dict[str, list[tuple[Candidate, dict]]]]:
    """Time every (op, candidate) and return ``(table, {op: [(candidate, {"us": t} or
    {"error": why}), ...]})``, where ``table`` is the spec's tuning with each op's fastest
    candidate in its sub-table (what ``write`` puts into the spec; the current tuning stays
    unless a candidate beats it by ``MIN_GAIN``).

    ``run_worker(spec_file, package_dir, op, batch, dtype, timeout)`` runs one job (a
    subprocess by default; tests substitute it). Progress goes to ``report`` and to a rich
    progress bar on a terminal.
    """
    spec_path = Path(spec_path)
    text, spec = _single(spec_path)
    if dtype not in spec.dtypes:
        raise TuneError(f"{spec_path}: dtype {dtype} is not in the spec's dtypes {list(spec.dtypes)}")
    fused = _has_fused_bwd(spec)
    if ops is None:
        ops = TP_OPS + (FUSED_OPS if fused else ()) + (PALLAS_OPS if require_cuda and _jax_gpu() else ())
    bad = [op for op in ops if op not in TP_OPS + FUSED_OPS + CONV_OPS + FUSED_CONV_OPS + PALLAS_OPS
           or (op in CONV_OPS and not spec.conv) or (op in FUSED_OPS and not fused)
           or (op in FUSED_CONV_OPS and not _has_fused_bwd(spec, op))]
    if bad or not ops:
        raise TuneError(f"ops {', '.join(bad) or '(none)'}: expected some of {', '.join(TP_OPS)}"
                        f"{', ' + ', '.join(FUSED_OPS) if fused else ' (bwd: only a channelwise product has the fused backward)'}"
                        f"{', ' + ', '.join(CONV_OPS) if spec.conv else ' (conv ops need conv = true)'}"
                        f", {', '.join(PALLAS_OPS)} (the JAX kernels)")
    if require_cuda:
        _require_gpus(ops)
    jobs = [(op, cand) for op in ops for cand in candidates(op_grid(grid, op), spec.tuning, op)]
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    results: dict[str, list[tuple[Candidate, dict]]] = {op: [] for op in ops}
    with tempfile.TemporaryDirectory(prefix="eqdsl_tune_") as scratch, _Progress(len(jobs), report) as progress:
        def one(i: int) -> dict:
            op, cand = jobs[i]
            d = Path(scratch) / f"j{i}"
            d.mkdir()
            spec_file = d / spec_path.name
            spec_file.write_text(with_tuning(text, override(spec.tuning, op, cand)), encoding="utf-8")
            r = run_worker(str(spec_file), str(d / "pkg"), op, batch, dtype, timeout)
            progress.advance(f"{op} {_label(cand)}: " + (r["error"] if "error" in r else f"{r['us']:.0f} us"))
            return r

        for (op, cand), r in zip(jobs, _map(one, len(jobs), workers)):
            results[op].append((cand, r))
    table = spec.tuning
    for op, rs in results.items():
        table = override(table, op, _winner(op, rs))
    if write:
        new_text = with_tuning(text, table)
        parse_spec(new_text, str(spec_path))  # never write a spec that does not load
        spec_path.write_text(new_text, encoding="utf-8")
        if out_dir is not None:
            from .codegen.generate import generate

            generate(spec_path, out_dir)
    return table, results


def _jax_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax") is not None


def _require_gpus(ops: tuple[str, ...]) -> None:
    """``TuneError`` unless the frameworks that time ``ops`` see a CUDA GPU: torch for the
    Helion ops, jax for ``pallas``."""
    if any(op not in PALLAS_OPS for op in ops):
        try:
            import torch
        except ImportError:
            raise TuneError("eqdsl tune needs torch with a CUDA GPU (it times the compiled kernels)") from None
        if not torch.cuda.is_available():
            raise TuneError("eqdsl tune needs a CUDA GPU (it times the compiled kernels); none is visible")
    if any(op in PALLAS_OPS for op in ops) and not _jax_gpu():
        raise TuneError("eqdsl tune --ops pallas needs jax with a CUDA GPU (it times the Pallas kernels); "
                        + ("jax is not installed" if not _jax_importable() else "jax sees none"))


def _jax_gpu() -> bool:
    """Whether jax is installed and its default backend is a GPU (imports jax: this process
    then holds a GPU context, so it must not also take 75% of the memory the workers need)."""
    if not _jax_importable():
        return False
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax.default_backend() == "gpu"


def _has_fused_bwd(spec: TensorProductSpec, op: str = "bwd") -> bool:
    """Whether the spec's package has the fused backward ``op`` to tune: ``bwd`` (the plain
    tensor product's) or ``conv_bwd`` (the atomic convolution's), each by its own
    ``fuse_bwd`` (the generators read it from the op's sub-table)."""
    from .codegen.helion_backend import tuning_for
    from .analysis import fused_bwd_reason
    from .lower import lower

    if op == "conv_bwd" and not (spec.conv and not spec.deterministic):
        return False
    return bool(tuning_for(spec.tuning, op).fuse_bwd) and fused_bwd_reason(lower(spec)) is None


def _winner(op: str, rs: list[tuple[Candidate, dict]]) -> Candidate:
    """The fastest candidate, unless the op's current tuning (``()``) is within ``MIN_GAIN``
    of it: timing noise (about 0.1% between runs on the H100) must not rewrite the spec."""
    timed = sorted((r["us"], i) for i, (_, r) in enumerate(rs) if "error" not in r)
    if not timed:
        raise TuneError(f"{op}: no candidate ran: " + "; ".join(f"{_label(c)}: {r['error']}" for c, r in rs))
    current = next((r["us"] for c, r in rs if c == () and "error" not in r), None)
    if current is not None and current <= timed[0][0] * (1 + MIN_GAIN):
        return ()
    return rs[timed[0][1]][0]


def _map(fn: Callable[[int], dict], n: int, workers: int) -> list[dict]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, range(n)))


def _label(c: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in c) or "as the spec has it"


class _Progress:
    """A rich progress bar on a terminal (when rich is installed), and one line per step."""

    def __init__(self, total: int, report: Callable[[str], None]):
        self.total, self.report, self.done, self.bar = total, report, 0, None

    def __enter__(self):
        try:
            from rich.progress import Progress

            if self.report is print and sys.stderr.isatty():
                self.bar = Progress(transient=False)
                self.task = self.bar.add_task("tuning", total=self.total)
                self.bar.start()
        except ImportError:
            pass
        return self

    def advance(self, what: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=what[:60])
        self.report(f"[{self.done}/{self.total}] {what}")

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


def format_results(results: dict[str, list[tuple[Candidate, dict]]]) -> str:
    """Plain text: per op, each candidate's microseconds (fastest first, the winner marked)."""
    lines = []
    for op, rs in results.items():
        lines.append(f"{op}:")
        ranked = sorted(rs, key=lambda cr: cr[1].get("us", float("inf")))
        winner = _winner(op, rs) if any("error" not in r for _, r in rs) else None
        for cand, r in ranked:
            what = f"failed: {r['error']}" if "error" in r else f"{r['us']:9.1f} us" + ("  <- best" if cand == winner else "")
            lines.append(f"  {_label(cand):40s} {what}")
    return "\n".join(lines)


def _worker_main(argv: list[str]) -> int:
    spec_file, package_dir, op, batch, dtype, lock = argv[:6]
    print(json.dumps({"us": measure(spec_file, package_dir, op, int(batch), dtype, lock)}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit("usage: eqdsl tune SPEC (this module's own entry point is for its worker processes)")
