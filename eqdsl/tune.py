"""``eqdsl tune SPEC``: choose a spec's Helion kernel parameters by timing them on a GPU.

Candidates are the product of a grid over ``spec.TUNING_KEYS`` (default
``DEFAULT_GRID``: ``num_warps`` 4, 8; ``block_b`` 8, 16, 32; ``block_c`` 32, 64) on top
of the spec's current ``[tensor_product.tuning]`` table. Each candidate's package is
generated into a scratch directory with that table. Compiling is single-threaded
(Helion's code generation, then Triton: 20 s to 2 min per kernel on the H100 machine's
host), so phase 1 compiles every candidate in parallel worker processes; phase 2 times
them one at a time, each in a fresh process that loads the compiled kernels from the
disk caches (``eqdsl.runtime.helion_launch``, Triton's). A timing is the median of CUDA
events around each of the four kernel ops (``fwd_op``, ``bwd_x1_op``, ``bwd_x2_op``,
``bwd_w_op``) at ``batch`` rows; the candidate with the least total (forward plus the
three backward ops) wins. With ``write``, its table replaces the spec's
``[tensor_product.tuning]`` (single-table specs: the table must be the file's last
section) and the package is regenerated, so the choice is committed with the spec and
the generated module; users never tune at import.

Raises ``TuneError`` (one line) without a CUDA GPU, for a multi-table spec, or for a bad
grid; ``SpecError`` for a bad spec.
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

from .spec import TUNING_KEYS, TensorProductSpec, load_spec, parse_spec

__all__ = ["TuneError", "DEFAULT_GRID", "parse_grid", "candidates", "with_tuning", "tune", "OPS"]

DEFAULT_GRID = {"num_warps": (4, 8), "block_b": (8, 16, 32), "block_c": (32, 64)}
OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")
_TUNING_SECTION = re.compile(r"^\[tensor_product\.tuning\][^\n]*\n(?:(?!\[)[^\n]*\n?)*", re.MULTILINE)

Candidate = tuple[tuple[str, int], ...]


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


def candidates(grid: dict[str, tuple[int, ...]], base: Candidate = ()) -> list[Candidate]:
    """Every combination of ``grid`` over ``base`` (the spec's table), ``base`` itself first;
    a combination that gives the same kernels as an earlier one (defaults spelt out) is dropped."""
    from .codegen.helion_backend import tuning_for

    keys = sorted(grid)
    out, seen = [tuple(sorted(base))], {tuning_for(tuple(sorted(base)))}
    for values in itertools.product(*(grid[k] for k in keys)):
        c = tuple(sorted({**dict(base), **dict(zip(keys, values))}.items()))
        if tuning_for(c) not in seen:
            seen.add(tuning_for(c))
            out.append(c)
    return out


def with_tuning(text: str, tuning: Candidate) -> str:
    """Spec text with its ``[tensor_product.tuning]`` section replaced by ``tuning`` (appended
    at the end; the section must be the file's last, as ``eqdsl tune`` writes it)."""
    m = list(_TUNING_SECTION.finditer(text))
    if m and text[m[-1].end():].strip():
        raise TuneError("the [tensor_product.tuning] section must be the last section of the spec file")
    body = text[: m[-1].start()] if m else text
    body = body.rstrip("\n") + "\n"
    if tuning:
        body += "\n[tensor_product.tuning]\n" + "".join(f"{k} = {v}\n" for k, v in tuning)
    return body


def _single(spec_path: Path) -> tuple[str, TensorProductSpec]:
    text = spec_path.read_text(encoding="utf-8")
    specs = load_spec(spec_path)
    if len(specs) != 1:
        raise TuneError(f"{spec_path}: {len(specs)} [[tensor_product]] tables; eqdsl tune takes a spec with one")
    return text, specs[0]


# ------------------------------------------------------------------ the worker processes


def measure(package_dir: str, name: str, batch: int, dtype: str, compile_only: bool) -> dict[str, float]:
    """Call (and unless ``compile_only`` time, in us) the four kernel ops of one package on CUDA."""
    import torch

    sys.path.insert(0, package_dir)
    ops = __import__(f"{name}.torch_ops", fromlist=["torch_ops"])
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=dt)

    x1, x2, g = rand(batch, ops.DIM_IN1), rand(batch, ops.DIM_IN2), rand(batch, ops.DIM_OUT)
    w = rand(ops.WEIGHT_NUMEL) if ops.SHARED_WEIGHTS else rand(batch, ops.WEIGHT_NUMEL)
    calls = {
        "fwd": lambda: ops.fwd_op(x1, x2, w),
        "bwd_x1": lambda: ops.bwd_x1_op(g, x2, w),
        "bwd_x2": lambda: ops.bwd_x2_op(x1, g, w),
        "bwd_w": lambda: ops.bwd_w_op(x1, x2, g),
    }
    times = {}
    for op, call in calls.items():
        call()
        torch.cuda.synchronize()
        if compile_only:
            continue
        for _ in range(3):
            call()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(30)]
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in events)
        times[op] = ms[len(ms) // 2] * 1e3
    return times


def _worker(package_dir: str, name: str, batch: int, dtype: str, compile_only: bool, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "eqdsl.tune", "--worker", package_dir, name, str(batch), dtype]
    cmd += ["--compile-only"] if compile_only else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the command


def tune(
    spec_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    batch: int = 20000,
    dtype: str = "float32",
    grid: dict[str, tuple[int, ...]] | None = None,
    workers: int | None = None,
    write: bool = False,
    timeout: float = 900.0,
    run_worker: Callable[..., dict] = _worker,
    require_cuda: bool = True,
    report: Callable[[str], None] = print,
) -> tuple[Candidate, list[tuple[Candidate, dict]]]:
    """Time every candidate and return ``(best, [(candidate, {op: us} or {"error": why}), ...])``.

    ``run_worker(package_dir, name, batch, dtype, compile_only, timeout)`` runs one worker
    (a subprocess by default; tests substitute it). Progress goes to ``report`` and a
    rich progress bar when rich is installed.
    """
    spec_path = Path(spec_path)
    if require_cuda:
        try:
            import torch
        except ImportError:
            raise TuneError("eqdsl tune needs torch with a CUDA GPU (it times the compiled kernels)") from None
        if not torch.cuda.is_available():
            raise TuneError("eqdsl tune needs a CUDA GPU (it times the compiled kernels); none is visible")
    text, spec = _single(spec_path)
    if dtype not in spec.dtypes:
        raise TuneError(f"{spec_path}: dtype {dtype} is not in the spec's dtypes {list(spec.dtypes)}")
    cands = candidates(DEFAULT_GRID if grid is None else grid, spec.tuning)
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    from .codegen.generate import generate_files, write_package

    results: list[tuple[Candidate, dict]] = []
    with tempfile.TemporaryDirectory(prefix="eqdsl_tune_") as scratch:
        dirs = []
        for i, cand in enumerate(cands):
            d = Path(scratch) / f"c{i}"
            d.mkdir()
            cand_spec = d / spec_path.name
            cand_spec.write_text(with_tuning(text, cand), encoding="utf-8")
            parse_spec(cand_spec.read_text(encoding="utf-8"), str(cand_spec))  # a bad grid fails here, not in a worker
            write_package(d / "pkg", generate_files(cand_spec, d / "pkg"))
            dirs.append(str(d / "pkg"))
        with _Progress(len(cands) * 2, report) as progress:
            def compile_one(i: int) -> dict:
                r = run_worker(dirs[i], spec.name, batch, dtype, True, timeout)
                progress.advance(f"compiled {_label(cands[i])}" + (f": {r['error']}" if "error" in r else ""))
                return r

            with ThreadPoolExecutor(workers) as pool:
                compiled = list(pool.map(compile_one, range(len(cands))))
            for i, cand in enumerate(cands):
                r = compiled[i] if "error" in compiled[i] else run_worker(dirs[i], spec.name, batch, dtype, False, timeout)
                results.append((cand, r))
                what = r["error"] if "error" in r else f"{sum(r.values()):.0f} us"
                progress.advance(f"timed {_label(cand)}: {what}")
    timed = [(sum(r.values()), c) for c, r in results if "error" not in r]
    if not timed:
        raise TuneError("no candidate ran: " + "; ".join(f"{_label(c)}: {r['error']}" for c, r in results))
    best = min(timed)[1]
    if write:
        spec_path.write_text(with_tuning(text, best), encoding="utf-8")
        if out_dir is not None:
            from .codegen.generate import generate

            generate(spec_path, out_dir)
    return best, results


def _label(c: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in c) or "defaults"


class _Progress:
    """A rich progress bar when rich is installed, else one line per step."""

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


def format_results(best: Candidate, results: list[tuple[Candidate, dict]]) -> str:
    """A plain-text table: candidate, microseconds per op and total, best marked."""
    lines = [f"{'candidate':40s} " + " ".join(f"{op:>8s}" for op in OPS) + f" {'total':>9s}"]
    for cand, r in sorted(results, key=lambda cr: sum(cr[1].values()) if "error" not in cr[1] else float("inf")):
        if "error" in r:
            lines.append(f"{_label(cand):40s} failed: {r['error']}")
            continue
        mark = "  <- best" if cand == best else ""
        lines.append(f"{_label(cand):40s} " + " ".join(f"{r[op]:8.1f}" for op in OPS) + f" {sum(r.values()):9.1f}{mark}")
    return "\n".join(lines)


def _worker_main(argv: list[str]) -> int:
    package_dir, name, batch, dtype = argv[:4]
    print(json.dumps(measure(package_dir, name, int(batch), dtype, "--compile-only" in argv)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit("usage: eqdsl tune SPEC (this module's own entry point is for its worker processes)")
