"""The Triton code Helion writes for each generated kernel, shipped with the package.

Helion is the kernels' authoring language and their compiler: for a kernel and its
pinned config, ``BoundKernel.to_triton_code`` prints a Python module holding one
``@triton.jit`` function and a *host function* that computes the grid and the launch
arguments (sizes, strides) and calls the launcher it is given (``launcher(jit_fn, grid,
*args, num_warps=, num_stages=)``). Doing that in every new process cost 10-22 s per mace_large kernel
(2026-11-22), so ``eqdsl generate`` does it once, on the CPU, and writes the result as
``<package>/triton_kernels/<kernel>_<dtype>.py``; the runtime
(``eqdsl.runtime.triton_launch``) imports those modules and never Helion.

The module is Helion's, changed structurally only (on its ``ast``, never its text):
Helion's import of its own default launcher is dropped and the host function's keyword
that defaulted to it becomes the required keyword ``launcher``, so the runtime supplies it and
importing the module imports torch and triton alone. A ``TRITON_OPTIONS`` dict (extra
launch options, e.g. ``maxnreg``) is appended. Anything else that would need Helion at
run time is refused (``LoweringError``), never patched.

Binding needs example tensors: Helion specializes a kernel on each argument's dtype,
number of dimensions, and each size bucketed to 0, 1 or "2 or more" (sizes are symbolic
otherwise, strides are arguments), so rows of 64 (16 graph nodes) give the code every
call of 2 or more rows runs; a call with a single row runs it too, correctly (masks use
the size argument). Helion's binding on a CPU needs Triton's interpreter, which patches
``triton.language`` process-wide, so the lowering runs in a subprocess with
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..backends.helion.tuning import DTYPES, TWIN

__all__ = ["LoweringError", "Operands", "SOURCES", "DIR", "module_name", "lower_package", "modules", "stamp", "index",
           "kernel_names", "helion_kernel", "code_digest", "LAUNCHER"]

# the generated Helion kernel files whose kernels are lowered, in this order
SOURCES = ("helion_kernels.py", "helion_conv_kernels.py", "helion_symmetric_kernels.py")
DIR = "triton_kernels"  # package subdirectory of the lowered modules
_ROWS, _NODES = 64, 16  # example rows (edges) and graph nodes: every size "2 or more"
_ALLOWED_IMPORTS = {"__future__", "torch", "triton", "triton.language"}


class LoweringError(RuntimeError):
    """Helion's Triton code for a kernel has a shape the runtime cannot launch; one line."""


@dataclass(frozen=True)
class Operands:
    """Row widths of a package's operands (from the IR), enough to bind every kernel."""

    dim_in1: int
    dim_in2: int
    dim_out: int
    weight_numel: int
    shared_weights: bool
    dtypes: tuple[str, ...]


def module_name(kernel: str, dtype: str) -> str:
    """``tp_fwd_0``, ``float32`` -> ``tp_fwd_0_float32`` (the module of one kernel and dtype)."""
    return f"{kernel}_{dtype}"


def lower_package(files: dict[str, str], operands: Operands, header: str) -> dict[str, str]:
    """The lowered modules of one package, as ``{relative path: text}``.

    Args:
        files: the package's generated files (``helion_kernels.py`` and, for a conv,
            ``helion_conv_kernels.py`` are read; others ignored).
        operands: the package's widths and dtypes.
        header: the generated-file header (``generate.Header.lines()``).

    A kernel lowered before with the same inputs (``_cache_key``) is read from
    ``$EQDSL_CACHE_DIR/lowered`` instead (``EQDSL_CACHE_DIR=`` turns that off).

    Returns:
        ``triton_kernels/<kernel>_<dtype>.py`` for every kernel and dtype, and
        ``triton_kernels/__init__.py`` with ``KERNELS``.

    Raises:
        LoweringError: Helion failed, or its code needs Helion at run time.
    """
    sources = {name: files[name] for name in SOURCES if name in files}
    wanted = modules(files, operands.dtypes)
    cache = _cache_dir()
    code, keys = {}, {}
    for source, kernel, dtype in wanted.values():
        keys[(kernel, dtype)] = key = _cache_key(sources[source], kernel, dtype, operands)
        if cache is not None and (cache / f"{key}.py").is_file():
            code[(kernel, dtype)] = (cache / f"{key}.py").read_text(encoding="utf-8")
    missing = [t for t in wanted.values() if (t[1], t[2]) not in code]
    if missing:
        code.update(_lower(sources, missing, operands))
        if cache is not None:
            for _, kernel, dtype in missing:
                _store(cache / f"{keys[(kernel, dtype)]}.py", code[(kernel, dtype)])
    out = {}
    for rel, (source, kernel, dtype) in wanted.items():
        out[rel] = stamp(header, sources[source], source, kernel, dtype) + code[(kernel, dtype)]
    out[f"{DIR}/__init__.py"] = index(files, operands.dtypes, header)
    return out


def _lower(sources: dict[str, str], tasks: list[tuple[str, str, str]], operands: Operands) -> dict[tuple[str, str], str]:
    """Lower ``tasks`` ((source file, kernel, dtype), ...) in a subprocess under Triton's interpreter."""
    with tempfile.TemporaryDirectory(prefix="eqdsl_lower_") as tmp:
        for name, text in sources.items():
            Path(tmp, name).write_text(text, encoding="utf-8")
        job = Path(tmp, "job.json")
        jobs = [(source, kernel, dtype, helion_kernel(sources[source], kernel, dtype)) for source, kernel, dtype in tasks]
        job.write_text(json.dumps({"dir": tmp, "tasks": jobs, "operands": asdict(operands)}))
        env = dict(os.environ, TRITON_INTERPRET="1")
        r = subprocess.run([sys.executable, "-m", __name__, str(job)], capture_output=True, text=True, env=env)
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise LoweringError(f"lowering the Helion kernels to Triton failed: {last}")
        return {(i["kernel"], i["dtype"]): i["code"] for i in json.loads(Path(tmp, "out.json").read_text())}


def _cache_dir() -> Path | None:
    """``$EQDSL_CACHE_DIR/lowered`` (default ``~/.cache/eqdsl/lowered``); None when
    ``EQDSL_CACHE_DIR`` is set empty."""
    root = os.environ.get("EQDSL_CACHE_DIR", str(Path.home() / ".cache" / "eqdsl"))
    return Path(root) / "lowered" if root else None


def _cache_key(source_text: str, kernel: str, dtype: str, operands: Operands) -> str:
    """Everything the lowered code depends on: the kernel file's code, kernel, dtype,
    operand widths, the versions that write it (helion, triton, torch, Python) and this
    module's code (both as ``code_digest``: a docstring or comment changes no key)."""
    parts = [code_digest(source_text), kernel, dtype, json.dumps(asdict(operands), sort_keys=True),
             *(version(d) for d in ("helion", "triton", "torch")), sys.version,
             code_digest(Path(__file__).read_text(encoding="utf-8"))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


@functools.lru_cache(maxsize=64)  # one kernel file's digest serves each of its kernels and dtypes
def code_digest(text: str) -> str:
    """sha256 (16 hex digits) of a Python module's code: its ``ast`` without docstrings.

    Helion lowers a kernel from its function's ``ast`` (and the module globals it reads),
    so comments and docstrings cannot change the Triton code; keying on the code alone
    lets the generated files' documentation change without lowering every kernel again
    (minutes per package on a CPU).
    """
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def _store(path: Path, text: str) -> None:
    """Atomic, best effort (an unwritable cache only costs a lowering next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".lowered.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def modules(files: dict[str, str], dtypes: tuple[str, ...]) -> dict[str, tuple[str, str, str]]:
    """``{relative path: (source file, kernel, dtype)}`` of the lowered modules of a package."""
    return {
        f"{DIR}/{module_name(kernel, dtype)}.py": (source, kernel, dtype)
        for source in SOURCES
        if source in files
        for kernel in kernel_names(files[source])
        for dtype in dtypes
    }


def stamp(header: str, source_text: str, source: str, kernel: str, dtype: str, *, versions: bool = True) -> str:
    """The first lines of a lowered module: the generated-file header, then what it was
    lowered from (``eqdsl check`` compares these without lowering again: a changed Helion
    kernel file or Helion/Triton version makes the module stale).

    The hash is the kernel file's ``code_digest``: its documentation may change without
    making the lowered modules stale. ``versions=False`` stops after the hash (what
    ``eqdsl check`` can still compare where helion or triton is not installed, as in a
    JAX-only environment).
    """
    line = f"# Triton code of {kernel} ({dtype}) from {source} (code sha256 {code_digest(source_text)}), written by helion "
    if not versions:
        return header + line
    return header + line + f"{version('helion')} for triton {version('triton')}.\n"


def toolchain_installed() -> bool:
    """Whether helion and triton are installed (their versions are part of ``stamp``)."""
    try:
        version("helion"), version("triton")
    except PackageNotFoundError:
        return False
    return True


def index(files: dict[str, str], dtypes: tuple[str, ...], header: str) -> str:
    """``triton_kernels/__init__.py``: ``KERNELS[(kernel, dtype)]`` -> module name, and
    ``SOURCES[kernel file stem]`` -> its kernel names."""
    entries = "".join(
        f"    ({kernel!r}, {dtype!r}): {module_name(kernel, dtype)!r},\n"
        for _, kernel, dtype in modules(files, dtypes).values()
    )
    sources = "".join(
        f"    {source.removesuffix('.py')!r}: {tuple(kernel_names(files[source]))!r},\n" for source in SOURCES if source in files
    )
    return (
        header
        + '"""Triton modules of this package\'s kernels (``eqdsl.codegen.triton_lowering``).\n\n'
        + "``KERNELS[(kernel, dtype)]`` names the module (in this directory) holding a kernel\'s\n"
        + "Triton code for that dtype, launched by ``eqdsl.runtime.triton_launch``; ``SOURCES``\n"
        + 'names the kernels of each Helion kernel file."""\n\n'
        + "KERNELS = {\n" + entries + "}\n"
        + "SOURCES = {\n" + sources + "}\n"
    )


def _helion_names(text: str) -> list[str]:
    """Names of the ``@helion.kernel`` functions of a generated kernel file, in file order."""
    return [
        n.name
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef)
        and any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == "helion.kernel" for d in n.decorator_list)
    ]


def kernel_names(text: str) -> list[str]:
    """The kernels of a generated kernel file, in file order: its ``@helion.kernel`` functions
    but those tuned for one dtype (``<kernel>__<dtype>``, ``helion_kernel``)."""
    names = _helion_names(text)
    twins = {f"{k}{TWIN}{d}" for k in names for d in DTYPES}
    return [n for n in names if n not in twins]


def helion_kernel(text: str, kernel: str, dtype: str) -> str:
    """The Helion kernel of a generated kernel file whose code ``kernel`` runs in ``dtype``:
    ``<kernel>__<dtype>`` where the spec tunes that dtype apart (``block_b_float64``, ...:
    ``eqdsl.backends.helion.assemble``), else ``kernel``."""
    twin = f"{kernel}{TWIN}{dtype}"
    return twin if twin in _helion_names(text) else kernel


# ------------------------------------------------------------------ in the subprocess


def _symmetric_example_args(params: list[str], dtype) -> tuple:
    """CPU tensors for a symmetric-contraction kernel (``eqdsl.symmetric.helion``): node rows
    ``x``, ``v<i>``, ``g`` and the result, per-element ``weights``, int64 ``elem``, and the term
    tables (``eqdsl.runtime.torch.symmetric.SymmetricOps.tables_on``: int32, ``coeff`` in the
    dtype). Every size is "2 or more" (zeros: the table loops are empty, nothing runs at
    binding), so the code is the one every table and node count runs; the widths do not
    enter it (the kernels loop over the tables)."""
    import torch

    n, width = _ROWS, 8

    def f(*shape, dt=dtype):
        return torch.zeros(shape, dtype=dt)

    i32 = torch.int32
    pool = {"weights": f(2, width), "elem": torch.zeros(n, dtype=torch.int64),
            "slots": f(2, 2, dt=i32), "mono_ptr": f(9, dt=i32), "mono_cols": f(2, 8, dt=i32),
            "mono_terms": f(3, dt=i32), "cols": f(2, 2, dt=i32), "coeff": f(2)}
    missing = [p for p in params if p not in pool and not (p in ("x", "g", "out", "gw_rows", "gx") or
                                                           (p[0] == "v" and p[1:].isdigit()))]
    if missing:
        raise LoweringError(f"no example tensor for symmetric kernel parameter(s) {', '.join(missing)}")
    return tuple(pool[p] if p in pool else f(n, width) for p in params)


def _example_args(params: list[str], ops: Operands, dtype) -> tuple:
    """CPU tensors of the right rank and dtype for each parameter of a generated kernel."""
    import torch

    if "slots" in params:  # a symmetric contraction's kernel
        return _symmetric_example_args(params, dtype)

    n, nodes = _ROWS, _NODES

    def f(*shape):
        return torch.zeros(shape, dtype=dtype)

    w = f(ops.weight_numel) if ops.shared_weights else f(n, ops.weight_numel)
    pool = {
        # plain tensor product: one row per batch element
        "x1": f(n, ops.dim_in1), "x2": f(n, ops.dim_in2), "g": f(n, ops.dim_out), "out": f(n, ops.dim_out),
        "gx1": f(n, ops.dim_in1), "gx2": f(n, ops.dim_in2), "gx2p": f(n, 2 * ops.dim_in2),
        "weights": w, "gw": f(n, ops.weight_numel),
        # convolution: node rows x / g / out / gx, edge rows y / gy / weights, int64 graph
        "x": f(nodes, ops.dim_in1), "y": f(n, ops.dim_in2), "gx": f(nodes, ops.dim_in1),
        "gy": f(n, ops.dim_in2), "gyp": f(n, 2 * ops.dim_in2),
        "src": torch.arange(n) % nodes, "dst": torch.arange(n) % nodes, "order": torch.arange(n),
        "ptr": torch.arange(nodes + 1) * (n // nodes),
        # conv_radial: the kernels take H as a literal (hl.arange), so any width of 2 or more
        # gives the same code
        "radial_features": f(n, 2), "radial_weight": f(2, ops.weight_numel),
    }
    conv = "src" in params
    if conv:  # node-level rows of the conv's output and its gradient
        pool["g"], pool["out"] = f(nodes, ops.dim_out), f(nodes, ops.dim_out)
    missing = [p for p in params if p not in pool]
    if missing:
        raise LoweringError(f"no example tensor for kernel parameter(s) {', '.join(missing)}")
    return tuple(pool[p] for p in params)


LAUNCHER = "launcher"  # the host function's keyword through which the runtime passes its launcher


def _restructure(code: str, kernel: str, options: dict, name: str | None = None) -> str:
    """Helion's module for ``kernel``: its import of Helion's default launcher dropped, the
    host function's keyword that defaulted to it renamed ``LAUNCHER`` and made required,
    the host function named ``name`` (default ``kernel``: a dtype's twin ``<name>__<dtype>``
    runs as ``name``), ``TRITON_OPTIONS`` appended (all through ``ast``).

    The keyword is found by what it is (the one keyword-only argument whose default is the
    name Helion imports its launcher as), never by Helion's name for it.
    """
    tree = ast.parse(code)
    body, host, helion_names = [], None, set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "helion.runtime":
            if [a.name for a in node.names] != ["default_launcher"]:
                raise LoweringError(f"{kernel}: Helion's code imports {ast.unparse(node)!r}")
            helion_names |= {a.asname or a.name for a in node.names}
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if not set(mods) <= _ALLOWED_IMPORTS:
                raise LoweringError(f"{kernel}: Helion's code imports {ast.unparse(node)!r}")
        if isinstance(node, ast.FunctionDef) and node.name == kernel:
            host = node
        body.append(node)
    if host is None:
        raise LoweringError(f"{kernel}: Helion's code has no host function {kernel}")
    args = host.args
    defaults = [ast.unparse(d) if d is not None else None for d in args.kw_defaults]
    if len(args.kwonlyargs) != 1 or defaults[0] not in helion_names:
        raise LoweringError(f"{kernel}: host function keywords {[a.arg for a in args.kwonlyargs]} (defaults "
                            f"{defaults}), expected one defaulting to Helion's launcher")
    old = args.kwonlyargs[0].arg
    if any(isinstance(n, ast.Name) and n.id == LAUNCHER for n in ast.walk(host)):
        raise LoweringError(f"{kernel}: the host function already uses the name {LAUNCHER!r}")
    args.kwonlyargs[0].arg, args.kw_defaults = LAUNCHER, [None]  # required: the runtime passes its launcher
    host.name = name or kernel
    for n in ast.walk(host):
        if isinstance(n, ast.Name) and n.id == old:
            n.id = LAUNCHER
    body.append(ast.Assign(targets=[ast.Name("TRITON_OPTIONS", ast.Store())], value=ast.parse(repr(options), mode="eval").body))
    module = ast.Module(body=body, type_ignores=[])
    names = {n.id for n in ast.walk(module) if isinstance(n, ast.Name)}
    left = names & ({"helion", "hl"} | helion_names)
    if left:
        raise LoweringError(f"{kernel}: Helion's code uses {sorted(left)} at run time")
    return ast.unparse(ast.fix_missing_locations(module)) + "\n"


def _lower_one(task: tuple) -> dict:
    directory, source, kernel_name, dtype_name, helion_name, ops = task
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(f"eqdsl_lowering_{Path(source).stem}", Path(directory, source))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = getattr(module, helion_name)
    params = list(inspect.signature(kernel.fn).parameters)
    args = _example_args(params, ops, getattr(torch, dtype_name))
    code = kernel.bind(args).to_triton_code(kernel.configs[0], output_origin_lines=False)
    options = getattr(module, "TRITON_OPTIONS", {}).get(helion_name, {})
    return {"source": source, "kernel": kernel_name, "dtype": dtype_name,
            "code": _restructure(code, helion_name, options, kernel_name)}


def _main(job_path: str) -> None:
    from concurrent.futures import ProcessPoolExecutor

    job = json.loads(Path(job_path).read_text())
    ops = Operands(**{**job["operands"], "dtypes": tuple(job["operands"]["dtypes"])})
    tasks = [(job["dir"], source, kernel, dtype, helion, ops) for source, kernel, dtype, helion in job["tasks"]]
    workers = max(1, min(len(tasks), os.cpu_count() or 1))
    if workers == 1:
        results = [_lower_one(t) for t in tasks]
    else:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_lower_one, tasks))
    Path(job["dir"], "out.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _main(sys.argv[1])
