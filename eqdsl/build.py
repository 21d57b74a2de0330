"""``eqdsl build``: compile a generated package's Triton kernels to cubins on a CPU machine.

A package ships the Triton modules Helion wrote for its kernels (``<package>/triton_kernels/``).
This compiles them ahead of time, for explicit GPU archs, with Triton's own compiler and
ptxas (both ship with the ``triton`` wheel; no GPU and no CUDA toolkit are needed) into
``<package>/cubins/`` (layout and manifest: ``eqdsl.runtime.cubins``). At run time the
launcher installs them into Triton's cache before the package's first launch, and the
first call of each kernel loads its cubin instead of compiling (``docs/ahead-of-time.md``).

How the variants are chosen. Triton compiles one binary per *specialization* of a launch:
the dtypes of the tensors, whether each pointer is 16-byte aligned, whether each integer
argument equals 1 or is divisible by 16, and the launch options. Which specializations a
package needs is decided by the package's own ops, not by a table here: the build imports
the package, calls each of its torch custom ops on small CPU tensors for each dtype, with
row counts that are (and are not) divisible by 16, and for a convolution edge counts on
either side of ``SEGMENT_MIN_EDGES`` (``exercise``), under
``eqdsl.runtime.triton_launch.launch_override``: every launch the ops make is recorded
instead of run. Each recorded launch is then given to ``JITFunction.warmup`` while Triton
believes a CUDA device of the target arch is active (a stand-in driver set with
``triton.runtime.driver.set_active``) and ``triton.knobs.cache.dir`` points at the build
directory: Triton specializes the arguments itself and writes its cache entry. Launches
that specialize alike are compiled once (``distinct_variants``), in a pool of processes.
The manifest records, for each variant, Triton's own description of its specialization,
from which the run time recomputes Triton's key in its own process
(``eqdsl.runtime.cubins.variant_hash``; the build checks it reproduces the key Triton
compiled under). A launch with a single row or node (an integer equal to 1) is not built:
it compiles on first use.

The work runs in a subprocess per package: the stand-in driver and the package's custom
ops (registered process-wide under ``eqdsl_<name>::``) stay out of the calling process,
and Triton's interpreter (``TRITON_INTERPRET=1``, which replaces ``triton.language``
process-wide) is unset there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .runtime import cubins as _cb

__all__ = ["BuildError", "BuildResult", "build", "build_package", "package_dirs", "import_package", "exercise",
           "record_launches", "distinct_variants", "compile_launches", "build_for_current_gpu", "DEFAULT_ARCHS"]

DEFAULT_ARCHS = ("sm_90",)
_DTYPES = ("float32", "float64")


class BuildError(RuntimeError):
    """A build that cannot run or failed; one line naming the package and the reason."""


@dataclass(frozen=True)
class BuildResult:
    """What ``build_package`` compiled for one package.

    Attributes:
        package: the package directory.
        kernels: Triton kernel modules the package's ops launch (for the dtypes built).
        variants: compiled variants (Triton cache entries), summed over ``archs``.
        archs: the archs built, e.g. ``("sm_90",)``.
        seconds: wall time of the build, subprocess included.
    """

    package: Path
    kernels: int
    variants: int
    archs: tuple[str, ...]
    seconds: float

    def line(self) -> str:
        """``mace_large: 22 kernels, 40 variants (sm_90), 164.7 s``."""
        return (f"{self.package.name}: {self.kernels} kernels, {self.variants} variants "
                f"({', '.join(self.archs)}), {self.seconds:.1f} s")


def _is_package(d: Path) -> bool:
    return (d / "__init__.py").is_file() and (d / "torch_ops.py").is_file()


def package_dirs(path: str | os.PathLike, out: str | os.PathLike | None = None) -> list[Path]:
    """The package directories ``eqdsl build PATH`` builds.

    Args:
        path: a generated package (``DIR/<name>``, holding ``torch_ops.py``), a generated
            directory (every package in it), or a spec ``.toml`` (its packages in ``out``).
        out: with a spec, the directory it was generated into.

    Raises:
        BuildError: nothing to build there, or a spec's package was not generated into ``out``.
    """
    p = Path(path)
    if p.suffix == ".toml":
        if out is None:
            raise BuildError(f"{p}: a spec needs -o DIR, the directory it was generated into")
        from .spec import load_spec

        dirs = [Path(out) / s.name for s in load_spec(p)]
        missing = [d for d in dirs if not _is_package(d)]
        if missing:
            raise BuildError(f"{p}: {', '.join(map(str, missing))} not generated; run: eqdsl generate {p} -o {out}")
        return dirs
    if out is not None:
        raise BuildError(f"{p}: -o is for a spec file; give the generated directory or package itself")
    if _is_package(p):
        return [p]
    if p.is_dir():
        dirs = sorted(d for d in p.iterdir() if d.is_dir() and _is_package(d))
        if dirs:
            return dirs
    raise BuildError(f"{p}: not a generated package, a directory of them, or a spec .toml")


def build(path: str | os.PathLike, archs=DEFAULT_ARCHS, dtypes=None, out=None, jobs: int | None = None,
          keep_ir: bool = False, log=None) -> list[BuildResult]:
    """Build every package ``path`` names (``package_dirs``), one after another.

    Args:
        path, out: as ``package_dirs``.
        archs: GPU archs, e.g. ``("sm_90", "sm_80")``.
        dtypes: dtype names to build (default: every dtype of each package).
        jobs: compiling processes per package (default: the CPU count).
        keep_ir: also keep Triton's intermediate stages (ttir, ttgir, llir, ptx) of each variant.
        log: called with each package's ``BuildResult`` as it finishes (e.g. ``print``).

    Raises:
        BuildError: as ``package_dirs`` and ``build_package``.
    """
    results = []
    for d in package_dirs(path, out):
        r = build_package(d, archs, dtypes, jobs, keep_ir)
        results.append(r)
        if log is not None:
            log(r)
    return results


def build_package(package_dir: str | os.PathLike, archs=DEFAULT_ARCHS, dtypes=None,
                  jobs: int | None = None, keep_ir: bool = False) -> BuildResult:
    """Compile one package's kernels into ``<package_dir>/cubins/`` (replacing a previous build).

    The build is written to a temporary sibling and moved into place, so a reader sees the
    old build, no build, or the new one, never a partial one.

    Args:
        package_dir: the generated package directory.
        archs: GPU archs (``"sm_90"``, ...).
        dtypes: dtype names (default: the package's ``DTYPES``).
        jobs: compiling processes (default: the CPU count).
        keep_ir: also keep Triton's intermediate stages (ttir, ttgir, llir, ptx; several
            times the size of the binaries). Without it each variant holds its cubin and
            the metadata Triton loads it with (``TRITON_STORE_BINARY_ONLY=1``, less the
            first IR stage that Triton writes anyway and never reads back).

    Raises:
        BuildError: a bad arch or dtype, or the build subprocess failed (its last lines).
    """
    t0 = time.perf_counter()
    package_dir = Path(package_dir).resolve()
    if not (package_dir / _cb.KERNELS_DIR / "__init__.py").is_file():
        raise BuildError(f"{package_dir.name}: no Triton code ({_cb.KERNELS_DIR}/): generated with --no-triton? "
                         "generate it again without")
    if isinstance(archs, str):
        archs = archs.split(",")
    try:
        caps = sorted({_cb.parse_arch(a) for a in archs if a.strip()}, reverse=True)
    except ValueError as e:
        raise BuildError(f"{package_dir.name}: {e}") from None
    if not caps:
        raise BuildError(f"{package_dir.name}: no GPU arch given (e.g. --arch sm_90)")
    if dtypes is not None:
        bad = [d for d in dtypes if d not in _DTYPES]
        if bad:
            raise BuildError(f"{package_dir.name}: unknown dtype {bad[0]!r}; expected {' or '.join(_DTYPES)}")
    tmp = package_dir / f".{_cb.DIR}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
    except OSError as e:
        raise BuildError(f"{package_dir.name}: cannot write the build into the package: {e}") from None
    try:
        job = {"package": str(package_dir), "caps": caps, "dtypes": list(dtypes) if dtypes else None,
               "out": str(tmp), "jobs": jobs or os.cpu_count() or 1, "keep_ir": keep_ir}
        # Triton's compiler, not its interpreter; the Triton code, not the Helion kernels
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EQDSL_KERNELS")}
        root = str(Path(__file__).resolve().parents[1])  # eqdsl importable in the child as here
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        r = subprocess.run([sys.executable, "-m", "eqdsl.build", "--worker", json.dumps(job)],
                           capture_output=True, text=True, env=env)
        if r.returncode:
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-6:])
            raise BuildError(f"{package_dir.name}: build failed: {tail}")
        report = json.loads((tmp / "report.json").read_text())
        (tmp / "report.json").unlink()
        manifest = {
            "format": _cb.FORMAT,
            "triton": report["triton"],
            "archs": [_cb.arch_name(c) for c in caps],
            "dtypes": report["dtypes"],
            "toolchain": report["toolchain"],
            "modules": _cb.module_hashes(package_dir),
            "groups": report["groups"],
        }
        (tmp / _cb.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        final = package_dir / _cb.DIR
        old = package_dir / f".{_cb.DIR}.old.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return BuildResult(package_dir, report["kernels"], sum(len(g) for g in report["groups"].values()),
                       tuple(manifest["archs"]), time.perf_counter() - t0)


def _built_for(package_dir: Path, arch: str) -> bool:
    try:
        manifest = json.loads((package_dir / _cb.DIR / _cb.MANIFEST).read_text(encoding="utf-8"))
        return arch in manifest.get("archs", ())
    except (OSError, ValueError, AttributeError):
        return False


def build_for_current_gpu(root: str | os.PathLike) -> list[BuildResult]:
    """``eqdsl.load``'s build: every package in ``root`` for the current CUDA device's arch, once.

    Does nothing unless torch is already imported (a JAX-only process never imports it
    for this), CUDA is available and ``EQDSL_BUILD`` is not ``0``; skips packages whose
    manifest already lists the arch and packages whose build failed before (a
    ``.cubins-<arch>.failed`` file holds the error). One process builds while the others
    (e.g. DDP ranks loading the same spec) wait on a file lock, then find the build done.
    A failed build warns (``CubinNotice``) and never raises: the kernels then compile on
    first use, as without a build. Progress is logged on the ``eqdsl`` logger (INFO).

    Returns:
        The builds made by this call (empty when there was nothing to do).
    """
    import logging
    import warnings

    torch = sys.modules.get("torch")
    if os.environ.get("EQDSL_BUILD", "1") == "0" or torch is None or not torch.cuda.is_available():
        return []
    major, minor = torch.cuda.get_device_capability()
    arch = _cb.arch_name(major * 10 + minor)
    root = Path(root)

    def todo():
        return [d for d in sorted(root.iterdir()) if _is_package(d) and (d / _cb.KERNELS_DIR).is_dir()
                and not _built_for(d, arch) and not (d / f".{_cb.DIR}-{arch}.failed").exists()]

    if not todo():
        return []
    from filelock import FileLock

    log = logging.getLogger("eqdsl")
    results = []
    with FileLock(root / f".build-{arch}.lock"):
        for d in todo():
            log.info("eqdsl: building %s for %s (once, into %s)", d.name, arch, d / _cb.DIR)
            try:
                results.append(build_package(d, [arch]))
                log.info("eqdsl: %s", results[-1].line())
            except BuildError as e:
                (d / f".{_cb.DIR}-{arch}.failed").write_text(f"{e}\n", encoding="utf-8")
                warnings.warn(f"eqdsl: building {d.name} for {arch} failed, its kernels compile on first use: {e}",
                              _cb.CubinNotice, stacklevel=3)
    return results


# --------------------------------------------------------------------------------------
# The package's launches: import it and call its ops (also used on the GPU by
# benchmarks/tools/check_cubins.py, which must launch exactly what was built)


def import_package(package_dir: str | os.PathLike, name: str | None = None):
    """Import the generated package at ``package_dir`` under the module name ``name``
    (default ``_eqdsl_build_<dir name>``), whatever its parent directory; its relative
    imports (``torch_ops``, ``triton_kernels``) resolve inside it."""
    package_dir = Path(package_dir).resolve()
    name = name or f"_eqdsl_build_{package_dir.name}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, package_dir / "__init__.py",
                                                  submodule_search_locations=[str(package_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _sizes(lo: int, hi: int | None) -> list[int]:
    """One size in ``[lo, hi)`` divisible by 16 and one not (37 and 64 where they fit),
    never 1: the integer specializations a launch with that many rows can get."""
    lo = max(lo, 2)
    out = []
    for divisible, preferred in ((False, 37), (True, 64)):
        if lo <= preferred and (hi is None or preferred < hi):
            out.append(preferred)
            continue
        n = lo
        while n % 16 == 0 if not divisible else n % 16 != 0:
            n += 1
        if hi is None or n < hi:
            out.append(n)
    return out


def exercise(package, dtype: str, device: str = "cpu", seed: int = 0) -> list[str]:
    """Call every torch custom op of ``package`` on random valid inputs of ``dtype``.

    The calls: ``fwd``, ``bwd_x1``, ``bwd_x2``, ``bwd_w`` (and ``bwd`` where the package
    has it) at 37 and 64 rows; with a convolution, ``conv_fwd``, ``conv_bwd_x``,
    ``conv_bwd_y``, ``conv_bwd_w`` (and ``conv_bwd``, and ``conv_radial``'s ops where the
    package has them) on random graphs of 13 and 32 nodes
    with an edge count divisible by 16 and one not on each side of the package's
    ``SEGMENT_MIN_EDGES`` (atomic kernels below it, segment kernels at and above).

    Args:
        package: the imported generated package (``import_package``).
        dtype: ``"float32"`` or ``"float64"``.
        device: where the tensors are (``"cpu"`` for the build, under ``launch_override``).
        seed: seed of the random inputs.

    Returns:
        ``"<op> <sizes>"`` of each call made, in order.
    """
    import importlib

    import torch

    ops = importlib.import_module(package.__name__ + ".torch_ops")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dt).to(device)

    calls = []
    shared = ops.SHARED_WEIGHTS
    for b in _sizes(2, None):
        x1, x2, g = randn(b, ops.DIM_IN1), randn(b, ops.DIM_IN2), randn(b, ops.DIM_OUT)
        w = randn(ops.WEIGHT_NUMEL) if shared else randn(b, ops.WEIGHT_NUMEL)
        for op, args in (("fwd", (x1, x2, w)), ("bwd_x1", (g, x2, w)), ("bwd_x2", (x1, g, w)),
                         ("bwd_w", (x1, x2, g)), ("bwd", (x1, x2, w, g))):
            if hasattr(ops, f"{op}_op"):
                getattr(ops, f"{op}_op")(*args)
                calls.append(f"{op} rows={b}")
    if not (Path(ops.__file__).parent / "torch_conv.py").is_file():
        return calls
    conv = importlib.import_module(package.__name__ + ".torch_conv")
    s = int(conv.SEGMENT_MIN_EDGES)
    edge_counts = _sizes(2, s or None) + (_sizes(s, None) if s > 0 else [])  # s = 0: no threshold
    for e in edge_counts:
        for n in _sizes(2, None):
            if n == 37:
                n = 13  # fewer nodes than edges, as in a graph
            src = torch.randint(0, n, (e,), generator=gen).to(device)
            dst = torch.randint(0, n, (e,), generator=gen).to(device)
            graph = conv.graph_tensors(src, dst, n)
            x, y, g = randn(n, ops.DIM_IN1), randn(e, ops.DIM_IN2), randn(n, ops.DIM_OUT)
            w = randn(ops.WEIGHT_NUMEL) if shared else randn(e, ops.WEIGHT_NUMEL)
            todo = [("conv_fwd", (x, y, w)), ("conv_bwd_x", (g, y, w)), ("conv_bwd_y", (x, g, w)),
                    ("conv_bwd_w", (x, y, g)), ("conv_bwd", (x, y, w, g))]
            h = getattr(conv, "RADIAL_FEATURES", None)
            if h:  # conv_radial's ops: (edges, H) radial features and the (H, weight_numel) matrix
                rf, wr = randn(e, h), randn(h, ops.WEIGHT_NUMEL)
                todo += [("conv_radial_fwd", (x, y, rf, wr)), ("conv_radial_bwd_x", (g, y, rf, wr)),
                         ("conv_radial_bwd_y", (x, g, rf, wr)), ("conv_radial_bwd", (x, y, rf, wr, g))]
            for op, args in todo:
                if hasattr(conv, f"{op}_op"):
                    getattr(conv, f"{op}_op")(*args, *graph, n)
                    calls.append(f"{op} edges={e} nodes={n}")
    return calls


def record_launches(package, dtypes) -> list[tuple]:
    """The launches ``exercise`` makes for each dtype, recorded, not run:
    ``[(jit_fn, grid, args, options)]`` (``eqdsl.runtime.triton_launch.launch_override``)."""
    from .runtime.triton_launch import launch_override

    launches = []
    with launch_override(lambda jit_fn, grid, args, options: launches.append((jit_fn, grid, args, dict(options)))):
        for dtype in dtypes:
            exercise(package, dtype)
    return launches


# --------------------------------------------------------------------------------------
# The build subprocess


def _stand_in_driver(capability: int):
    """A Triton driver that reports a CUDA device of ``capability`` (device id ``capability``,
    stream 0) and can do nothing else: all ``JITFunction.warmup`` and ``triton.compile``
    ask of the driver. A device id per arch gives each arch its own ``JITFunction``
    per-device cache (target, backend and compiled kernels)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class TargetDriver(DriverBase):
        def __init__(self):
            self.target = GPUTarget("cuda", capability, 32)

        @classmethod
        def is_active(cls):
            return False

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError("eqdsl build: the stand-in driver cannot launch")

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError("eqdsl build: the stand-in driver cannot benchmark")

        def get_current_device(self):
            return capability

        def get_current_stream(self, device=None):
            return 0

    return TargetDriver()


class _TargetScope:
    """Triton compiles for a CUDA device of ``capability`` with its cache at ``cache_dir``
    (``keep_ir=False``: only what ``knobs.compilation.store_binary_only`` keeps, which is
    not part of the cache key); the real driver (or none) again on exit."""

    def __init__(self, capability: int, cache_dir: Path | None = None, keep_ir: bool = False):
        self.capability, self.cache_dir, self.keep_ir = capability, cache_dir, keep_ir

    def __enter__(self):
        import contextlib

        import triton
        from triton.runtime import driver

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(triton.knobs.cache.scope())
        self._stack.enter_context(triton.knobs.compilation.scope())
        if self.cache_dir is not None:
            triton.knobs.cache.dir = str(self.cache_dir)
        triton.knobs.compilation.store_binary_only = not self.keep_ir
        driver.set_active(_stand_in_driver(self.capability))
        return self

    def __exit__(self, *exc):
        from triton.runtime import driver

        try:
            driver.reset_active()
        except RuntimeError:  # no GPU driver on this machine: back to "none chosen yet"
            driver.set_active(None)
        self._stack.close()


def distinct_variants(launches, capability: int) -> list[tuple[int, dict]]:
    """The launches that need a compilation of their own for ``capability``: the first
    launch of each (kernel, Triton specialization and options), with Triton's description
    of that specialization. Triton decides: each launch goes through ``JITFunction.warmup``
    with ``knobs.runtime.jit_cache_hook`` set, which Triton calls right before compiling
    with its key of the launch and its ``specialization_data`` (the JSON
    ``JITFunction.preload`` reads), and which returns ``True`` (skip the compilation).

    Returns:
        ``[(index into launches, {"signature", "constant_keys", "constant_vals",
        "attrs_keys", "attrs_vals"})]``.
    """
    import triton

    seen, picked, current = set(), [], [0]

    def hook(*, key, fn, compile, **_):
        k = (id(fn.jit_function), str(key))
        if k not in seen:
            seen.add(k)
            data = json.loads(compile["specialization_data"])
            picked.append((current[0], {f: data[f] for f in _SPECIALIZATION}))
        return True

    with _TargetScope(capability), triton.knobs.runtime.scope():
        triton.knobs.runtime.jit_cache_hook = hook
        for i, (fn, grid, args, options) in enumerate(launches):
            current[0] = i
            fn.warmup(*args, grid=grid, **options)
    return picked


_SPECIALIZATION = ("signature", "constant_keys", "constant_vals", "attrs_keys", "attrs_vals")


def compile_launches(launches, capability: int, cache_dir: Path, keep_ir: bool = False) -> list:
    """``JITFunction.warmup`` of each launch for ``capability``, Triton's cache at
    ``cache_dir`` (entries already there are cache hits); what ``warmup`` returns for each."""
    with _TargetScope(capability, cache_dir, keep_ir):
        return [fn.warmup(*args, grid=grid, **options) for fn, grid, args, options in launches]


_POOL: dict = {}  # in a compiling process: the package's launches and the job


def _pool_init(job: dict) -> None:
    package = import_package(job["package"])
    _POOL["launches"] = record_launches(package, job["dtypes"])
    _POOL["job"] = job


def _pool_compile(task: tuple) -> dict:
    """Compile launch ``index`` (of kernel module ``module``, specialization ``spec``) for
    ``capability`` (one task of the pool): its manifest entry."""
    capability, index, module, spec = task
    job, launch = _POOL["job"], _POOL["launches"][index]
    fn, _, _, options = launch
    if fn.module != module:  # every process records the same launches in the same order
        raise RuntimeError(f"launch {index} is of {fn.module} here, of {module} in the planning process")
    package_dir = Path(job["package"]).resolve()
    (k,) = compile_launches([launch], capability, Path(job["out"]) / _cb.arch_name(capability), job["keep_ir"])
    key_dir = Path(next(iter(k.metadata_group.values()))).parent
    rel = Path(sys.modules[module].__file__).resolve().relative_to(package_dir).as_posix()
    entry = {"hash": k.hash, "metadata": next(n for n in k.metadata_group if n.endswith(".json")), "module": rel,
             "function": fn.__name__, "options": options, "specialization": spec}
    # the key install() will compute from this entry, here equal to the one Triton just used
    # (same process, same Triton): checks the entry describes the variant completely
    again = _cb.variant_hash(getattr(_cb.kernel_module(package_dir / rel), fn.__name__), entry, capability)
    if again != k.hash:
        raise RuntimeError(f"{rel}: the manifest entry gives Triton key {again[:12]}, Triton compiled "
                           f"{k.hash[:12]} (a Triton cache-invalidating environment variable set?)")
    return {"arch": _cb.arch_name(capability), "key": key_dir.name, "entry": entry}


def _worker(job: dict) -> None:
    import triton

    package_dir, out = Path(job["package"]), Path(job["out"])
    if os.environ.get("TRITON_INTERPRET") or triton.knobs.runtime.interpret:
        raise SystemExit("TRITON_INTERPRET must be unset in the build process")
    package = import_package(package_dir)
    ops_dtypes = [str(d).removeprefix("torch.") for d in
                  importlib.import_module(package.__name__ + ".torch_ops").DTYPES]
    job["dtypes"] = dtypes = job["dtypes"] or ops_dtypes
    missing = [d for d in dtypes if d not in ops_dtypes]
    if missing:
        raise SystemExit(f"{package_dir.name} has no {missing[0]} kernels (DTYPES {ops_dtypes})")
    _pool_init(job)
    launches = _POOL["launches"]
    if not launches:
        raise SystemExit(f"{package_dir.name}: its ops launched no Triton kernel")
    modules = {fn.module for fn, *_ in launches}
    tasks = [(cap, i, launches[i][0].module, spec) for cap in job["caps"] for i, spec in distinct_variants(launches, cap)]
    workers = min(job["jobs"], len(tasks))
    if workers <= 1:
        entries = [_pool_compile(t) for t in tasks]
    else:  # processes, not threads: much of a compilation is Python (code generation from the AST)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_pool_init, initargs=(job,)) as pool:
            entries = list(pool.map(_pool_compile, tasks))
    groups = {_cb.arch_name(cap): {} for cap in job["caps"]}
    for e in entries:
        key_dir = out / e["arch"] / e["key"]
        grp = key_dir / f"__grp__{e['entry']['metadata']}"
        # the group file lists its files by absolute path (this temporary directory):
        # keep their names only (install() writes the cache's own paths)
        names = sorted(json.loads(grp.read_text())["child_paths"])
        if not job["keep_ir"]:  # the kernel's first IR (.source, 5x the cubin's size), which no loader reads
            for n in [n for n in names if n.endswith(".source")]:
                (key_dir / n).unlink()
                names.remove(n)
        grp.write_text(json.dumps({"child_paths": {n: n for n in names}}, sort_keys=True))
        groups[e["arch"]][e["key"]] = e["entry"]
    for arch, entries_of_arch in groups.items():
        keep = set(entries_of_arch)
        if (out / arch).is_dir():  # keep the entries only (Triton removes its temporary dirs itself)
            for d in (out / arch).iterdir():
                if d.name not in keep:
                    shutil.rmtree(d) if d.is_dir() else d.unlink()
        groups[arch] = dict(sorted(entries_of_arch.items()))
    report = {"triton": triton.__version__, "dtypes": dtypes, "kernels": len(modules), "groups": groups,
              "toolchain": {_cb.arch_name(c): _cb.toolchain_fingerprint(c) for c in job["caps"]}}
    (out / "report.json").write_text(json.dumps(report))


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eqdsl.build")
    ap.add_argument("--worker", required=True, help="a JSON job (internal: build_package runs this)")
    _worker(json.loads(ap.parse_args(argv).worker))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
