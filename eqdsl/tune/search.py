"""``tune()``: the command behind ``eqdsl tune SPEC`` (see the package docstring)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..spec import TensorProductSpec, parse_spec
from .choose import label, winner
from .grid import (
    ALL_OPS, CONV_OPS, FUSED_CONV_OPS, FUSED_OPS, PALLAS_CONV_OPS, PALLAS_OPS, TP_OPS, Candidate, Pairs, TuneError,
    candidates,
    for_dtype, op_grid, override,
)
from .report import Progress
from .spec_text import read_single, with_tuning
from .worker import run_job

__all__ = ["tune"]


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
    run_worker: Callable[..., dict] = run_job,
    require_cuda: bool = True,
    report: Callable[[str], None] = print,
) -> tuple[Pairs, dict[str, list[tuple[Candidate, dict]]]]:
    """Time every (op, candidate) and pick each op's fastest.

    Args:
        spec_path: a spec file with one ``[[tensor_product]]`` table.
        out_dir: where ``write`` regenerates the package (``None``: not regenerated).
        batch: rows per call (edges for the conv ops).
        dtype: one of the spec's ``dtypes``.
        grid: parameter values to try (``grid.parse_grid``); ``None``: each op's default grid.
        ops: the ops to tune; ``None``: ``TP_OPS``, ``bwd`` where the product has the fused
            backward, and where jax sees a GPU ``pallas`` and, for a conv spec, ``pallas_conv``.
        workers: jobs run at once (default: CPU cores - 1).
        write: put the result into the spec file (``spec_text.with_tuning``) and regenerate.
        timeout: seconds per job.
        run_worker: ``run_worker(spec_file, package_dir, op, batch, dtype, timeout)`` runs one
            job (``worker.run_job``: a subprocess; tests substitute it).
        require_cuda: refuse to run without the GPUs the ops need.
        report: receives one progress line per job (a rich progress bar is shown as well on a
            terminal).

    Returns:
        ``(table, {op: [(candidate, {"us": t} or {"error": why}), ...]})``: ``table`` is the
        spec's tuning with each op's winner (``choose.winner``: the current tuning stays unless
        a candidate beats it by ``MIN_GAIN``).

    Raises:
        TuneError: see the package docstring.
        SpecError: the spec is invalid.
    """
    spec_path = Path(spec_path)
    text, spec = read_single(spec_path)
    if dtype not in spec.dtypes:
        raise TuneError(f"{spec_path}: dtype {dtype} is not in the spec's dtypes {list(spec.dtypes)}")
    fused = _has_fused_bwd(spec)
    if ops is None:
        jax_ops = PALLAS_OPS if spec.conv else tuple(op for op in PALLAS_OPS if op not in PALLAS_CONV_OPS)
        ops = TP_OPS + (FUSED_OPS if fused else ()) + (jax_ops if require_cuda and _jax_gpu() else ())
    bad = [op for op in ops if op not in ALL_OPS
           or (op in CONV_OPS + PALLAS_CONV_OPS and not spec.conv) or (op in FUSED_OPS and not fused)
           or (op in FUSED_CONV_OPS and not _has_fused_bwd(spec, op))]
    if bad or not ops:
        raise TuneError(f"ops {', '.join(bad) or '(none)'}: expected some of {', '.join(TP_OPS)}"
                        f"{', ' + ', '.join(FUSED_OPS) if fused else ' (bwd: this product has no fused backward)'}"
                        f"{', ' + ', '.join(CONV_OPS + PALLAS_CONV_OPS) if spec.conv else ' (conv ops need conv = true)'}"
                        f", {PALLAS_OPS[0]} (the JAX kernels)")
    if require_cuda:
        _require_gpus(ops)
    loops = PALLAS_OPS[0] in ops and _has_channel_loops(spec)
    ir = _lowered(spec) if any(op in PALLAS_CONV_OPS for op in ops) else None
    jobs = [(op, cand) for op in ops
            for cand in candidates(for_dtype(op_grid(grid, op, loops), op, dtype, spec.dtypes, spec.tuning),
                                   spec.tuning, op, ir)]
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    results: dict[str, list[tuple[Candidate, dict]]] = {op: [] for op in ops}
    with tempfile.TemporaryDirectory(prefix="eqdsl_tune_") as scratch, Progress(len(jobs), report) as progress:
        def one(i: int) -> dict:
            op, cand = jobs[i]
            d = Path(scratch) / f"j{i}"
            d.mkdir()
            spec_file = d / spec_path.name
            spec_file.write_text(with_tuning(text, override(spec.tuning, op, cand)), encoding="utf-8")
            r = run_worker(str(spec_file), str(d / "pkg"), op, batch, dtype, timeout)
            progress.advance(f"{op} {label(cand)}: " + (r["error"] if "error" in r else f"{r['us']:.0f} us"))
            return r

        with ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(one, range(len(jobs))))
        for (op, cand), r in zip(jobs, done):
            results[op].append((cand, r))
    table = spec.tuning
    for op, rs in results.items():
        table = override(table, op, winner(op, rs))
    if write:
        new_text = with_tuning(text, table)
        parse_spec(new_text, str(spec_path))  # never write a spec that does not load
        spec_path.write_text(new_text, encoding="utf-8")
        if out_dir is not None:
            from ..codegen.generate import generate

            generate(spec_path, out_dir)
    return table, results


def _lowered(spec: TensorProductSpec):
    from ..lower import lower

    return lower(spec)


def _jax_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("jax") is not None


def _jax_gpu() -> bool:
    """Whether jax is installed and its default backend is a GPU (imports jax: this process
    then holds a GPU context, so it must not also take 75% of the memory the workers need)."""
    if not _jax_importable():
        return False
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax.default_backend() == "gpu"


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
        raise TuneError("eqdsl tune --ops pallas / pallas_conv needs jax with a CUDA GPU (it times the Pallas kernels); "
                        + ("jax is not installed" if not _jax_importable() else "jax sees none"))


def _has_channel_loops(spec: TensorProductSpec) -> bool:
    """Whether the spec's Pallas kernels loop over a channel (then the default ``pallas`` grid
    tries ``pallas_unroll``)."""
    from ..backends.pallas.plan import has_channel_loops
    from ..lower import lower

    return has_channel_loops(lower(spec))


def _has_fused_bwd(spec: TensorProductSpec, op: str = "bwd") -> bool:
    """Whether the spec's package has the fused backward ``op`` to tune: ``bwd`` (the plain
    tensor product's) or ``conv_bwd`` (the atomic convolution's), each by its own
    ``fuse_bwd`` (the generators read it from the op's sub-table)."""
    from ..analysis import fused_bwd_reason
    from ..backends.helion.fused import FUSED_MODES
    from ..backends.helion.tuning import tuning_for
    from ..lower import lower

    if op == "conv_bwd" and not (spec.conv and not spec.deterministic):
        return False
    return bool(tuning_for(spec.tuning, op).fuse_bwd) and fused_bwd_reason(lower(spec), FUSED_MODES) is None
