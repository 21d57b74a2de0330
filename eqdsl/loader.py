"""``eqdsl.load``: generate a spec's package into a per-user cache and import it.

A spec (TOML text, a file, or ``TensorProductSpec`` objects) is keyed by the SHA-256 of
its canonical text (``spec_to_toml``: every key explicit, no comments, so the same specs
written differently share one entry) and of the generator itself (eqdsl's version and
the source of its Python modules and templates, so that a changed generator never serves
stale kernels). The package lives in ``<cache>/packages/<key>/<name>/``, with the
canonical spec beside it as ``spec.toml``; ``<cache>`` is ``cache_dir``, else
``$EQDSL_CACHE_DIR``, else ``~/.cache/eqdsl`` (where the Helion launcher keeps its
modules too, under ``helion/``). An empty ``$EQDSL_CACHE_DIR`` turns the disk cache off:
packages are then generated into a temporary directory of this process, removed at exit.

Safe with several processes at once (DDP ranks, test workers): a package directory is
generated under a temporary name and renamed into place, so it appears complete or not
at all and no process ever imports a half-written package; an ``fcntl`` lock per key
lets one process generate while the others wait, and a lost rename race (a file system
without locks) is taken as the other process's success.

``spec_to_toml`` writes ``TensorProductSpec`` objects back as spec text (deterministic:
the same spec always gives the same bytes, hence the same cache key).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from filelock import FileLock

from . import __version__
from .errors import SpecError
from .spec import TensorProductSpec, load_spec, parse_spec

__all__ = ["load", "spec_to_toml", "toml_table", "cache_root", "install_package", "import_package"]

# the generated package's framework modules, imported on first attribute access
_LAZY_SUBMODULES = ("torch_ops", "jax_ops", "torch_conv")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_lock = threading.Lock()
_loaded: dict[str, str] = {}  # package name -> cache key, this process (torch ops are registered per name)


# ---------------------------------------------------------------------------- TOML text


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} in a spec: not a finite number")
        return repr(v)  # shortest text that reads back as the same float; valid TOML
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are TOML basic-string escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write a {type(v).__name__} ({v!r}) in a spec")


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else json.dumps(k)


def toml_table(table: dict, header: str = "tensor_product") -> str:
    """One ``[[header]]`` table as TOML text; nested dicts as inline tables, keys in the
    order given. Raises ``TypeError`` / ``ValueError`` for a value TOML cannot hold."""
    lines = [f"[[{header}]]"]
    for key, value in table.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _spec_table(spec: TensorProductSpec, bare_filter: bool) -> dict:
    t: dict = {
        "name": spec.name,
        "irreps_in1": str(spec.irreps_in1),
        "irreps_in2": str(spec.irreps_in2),
    }
    if spec.mode is not None:
        # a channelwise filter is written bare ("0e+1o"); irreps with multiplicities would
        # be the exact output (``eqdsl.spec``)
        f = spec.irreps_out_filter
        t["irreps_out"] = "+".join(str(mi.ir) for mi in f) if bare_filter else str(f)
        t["mode"] = spec.mode
    else:
        t["irreps_out"] = str(spec.irreps_out)
        t["instructions"] = [[i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight, float(i.path_weight)]
                             for i in spec.instructions]
    done = {"name", "irreps_in1", "irreps_in2", "irreps_out", "irreps_out_filter", "mode", "instructions", "tuning",
            "origin"}
    for f in dataclasses.fields(spec):
        if f.name in done:
            continue
        value = getattr(spec, f.name)
        if f.name in ("reduce", "deterministic") and not spec.conv:
            continue  # the parser refuses them without conv
        if f.name == "radial_features" and value is None:
            continue  # unset: TOML has no null, and the parser's default is None
        if f.name.endswith("_order") and value == "given":
            continue  # uvw and explicit instructions keep their order; the key does not apply
        t[f.name] = list(value) if isinstance(value, tuple) else value
    if spec.tuning:
        tuning: dict = {}
        for key, value in spec.tuning:
            op, _, k = key.rpartition(".")
            (tuning.setdefault(op, {}) if op else tuning)[k] = value
        t["tuning"] = tuning
    return t


def spec_to_toml(specs: TensorProductSpec | Sequence[TensorProductSpec]) -> str:
    """Spec text for ``specs`` (one or several ``TensorProductSpec``), one table each.

    Every field is written explicitly (defaults too), instructions with their
    ``path_weight``; the same specs always give the same text. The text is parsed back and
    must give equal specs, else ``ValueError`` (a field this writer cannot express).
    """
    specs = (specs,) if isinstance(specs, TensorProductSpec) else tuple(specs)
    if not specs or not all(isinstance(s, TensorProductSpec) for s in specs):
        raise TypeError("spec_to_toml: expected a TensorProductSpec or a non-empty sequence of them")
    return "\n".join(_one_table(s) for s in specs)


def _one_table(spec: TensorProductSpec) -> str:
    # a filter of multiplicity-1 irreps reads back the same bare or (if it is the output
    # itself) with multiplicities; the first text that reads back equal is the one
    for bare in (True, False):
        if bare and any(mi.mul != 1 for mi in spec.irreps_out_filter):
            continue
        text = toml_table(_spec_table(spec, bare))
        try:
            back = parse_spec(text, "<spec_to_toml>")
        except SpecError:
            continue
        if back == (spec,):
            return text
    raise ValueError(f"spec_to_toml: {spec.name!r} does not read back the same; cannot serialize it")


# ---------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``cache_dir``, ``$EQDSL_CACHE_DIR``, ``~/.cache/eqdsl``; a
    per-process temporary directory when ``$EQDSL_CACHE_DIR`` is set empty."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("EQDSL_CACHE_DIR")
    if env is None:
        return Path.home() / ".cache" / "eqdsl"
    if env:
        return Path(env)
    return _private_root()


@functools.lru_cache(maxsize=1)
def _private_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="eqdsl-load-"))
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.lru_cache(maxsize=1)
def generator_fingerprint() -> str:
    """SHA-256 over eqdsl's version, its Python sources and its templates (sorted by path)."""
    from .backends.render import template_dir

    h = hashlib.sha256(f"eqdsl {__version__}\n".encode())
    for root, pattern in ((Path(__file__).resolve().parent, "**/*.py"), (Path(template_dir()), "*.j2")):
        for f in sorted(root.glob(pattern)):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _resolve(spec) -> tuple[TensorProductSpec, ...]:
    """Parsed specs from whatever ``load`` accepts."""
    if isinstance(spec, TensorProductSpec):
        return (spec,)
    if isinstance(spec, Sequence) and not isinstance(spec, str) and spec and all(
            isinstance(s, TensorProductSpec) for s in spec):
        names = [s.name for s in spec]
        if len(set(names)) != len(names):
            raise ValueError(f"eqdsl.load: two specs share a name in {names}")
        return tuple(spec)
    if isinstance(spec, str) and ("\n" in spec or "[" in spec):
        return parse_spec(spec, "<eqdsl.load>")
    if isinstance(spec, (str, os.PathLike)):
        return load_spec(spec)
    raise TypeError(
        "eqdsl.load: expected spec TOML text, a spec file path, or TensorProductSpec(s); "
        f"got {type(spec).__name__}"
    )


def _generate(pkg_dir: Path, text: str, specs: tuple[TensorProductSpec, ...], *, triton: bool = True) -> None:
    """Write every package of ``specs`` (and ``spec.toml``) to ``pkg_dir``, atomically
    (``triton``: with the Triton code of the kernels, ``codegen.triton_lowering``)."""
    from .codegen.generate import package_files
    from .lower import lower

    def make_files(header: str) -> dict[str, str]:
        files = {}
        for s in specs:
            for rel, t in package_files(s, lower(s), header, triton=triton).items():
                files[f"{s.name}/{rel}"] = t
        return files

    install_package(pkg_dir, text, make_files)


def install_package(pkg_dir: Path, text: str, make_files) -> None:
    """Create ``pkg_dir`` (``spec.toml`` holding ``text``, and the files ``make_files(header)``
    returns, ``{path relative to pkg_dir: text}``, each starting with ``header``) atomically,
    unless it exists: one process generates under a per-key lock while the others wait, the
    directory is renamed into place complete, and a lost rename race counts as success."""
    from .codegen.generate import Header, write_package

    parent = pkg_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    with FileLock(parent / f".{pkg_dir.name}.lock"):
        if pkg_dir.is_dir():  # another process finished while this one waited
            return
        spec_file = pkg_dir / "spec.toml"
        header = Header(spec_file.as_posix(), hashlib.sha256(text.encode("utf-8")).hexdigest(),
                        f"eqdsl generate {spec_file.as_posix()} -o {pkg_dir.as_posix()}").lines()
        files = make_files(header)
        tmp = Path(tempfile.mkdtemp(prefix=f".{pkg_dir.name}.", suffix=".tmp", dir=parent))
        try:
            (tmp / "spec.toml").write_text(text, encoding="utf-8")
            write_package(tmp, files)
            try:
                os.rename(tmp, pkg_dir)
            except OSError:
                if not pkg_dir.is_dir():  # not a lost race: a real failure
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _lazy_getattr(module: ModuleType, lazy: tuple[str, ...] = _LAZY_SUBMODULES):
    def __getattr__(attr: str):
        if attr in lazy:
            return importlib.import_module(f"{module.__name__}.{attr}")
        raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")

    return __getattr__


def import_package(pkg_dir: Path, name: str, key: str, lazy: tuple[str, ...] = _LAZY_SUBMODULES) -> ModuleType:
    """Import ``pkg_dir/<name>`` as ``eqdsl_<key[:16]>_<name>`` (once per process), its
    submodules ``lazy`` imported on first attribute access, ``SPEC_FILE`` set."""
    modname = f"eqdsl_{key[:16]}_{name}"
    if modname in sys.modules:
        return sys.modules[modname]
    init = pkg_dir / name / "__init__.py"
    spec = importlib.util.spec_from_file_location(modname, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[modname]
        raise
    module.__getattr__ = _lazy_getattr(module, lazy)
    module.SPEC_FILE = str(pkg_dir / "spec.toml")
    return module


def load(spec, *, name: str | None = None, cache_dir: str | os.PathLike | None = None) -> ModuleType:
    """Generate (once, cached on disk) and import the package of one tensor product.

    Args:
        spec: spec TOML text (a ``str`` holding ``[`` or a newline), a spec file path
            (``str`` or ``os.PathLike``), a ``TensorProductSpec`` or a sequence of them.
        name: which ``[[tensor_product]]`` table to return; required when the spec has
            several (all of them are generated, in one cache entry).
        cache_dir: cache directory; default ``$EQDSL_CACHE_DIR`` or ``~/.cache/eqdsl``.

    Returns:
        The generated package module: metadata (``IRREPS_IN1``, ``INSTRUCTIONS``,
        ``WEIGHT_NUMEL``, ...; see a generated ``__init__.py``), ``SPEC_FILE`` (the
        cached spec), and ``torch_ops`` / ``jax_ops`` imported on first access (a JAX-only
        user never imports torch). The same spec returns the same module object.

    Raises:
        SpecError: the spec is invalid or its file unreadable.
        ValueError: ``name`` is missing with several tables, names no table, or another
            spec of the same name was loaded in this process (a package's torch custom
            ops are registered under its name, ``eqdsl_<name>::*``; give it another).
        TypeError: ``spec`` is of no accepted type.
    """
    specs = _resolve(spec)
    # the canonical text (every key explicit, no comments) keys the cache: the same specs
    # written differently, or given as objects, share one package
    text = spec_to_toml(specs)
    names = [s.name for s in specs]
    if name is None:
        if len(specs) > 1:
            raise ValueError(f"eqdsl.load: the spec has {len(specs)} tensor products ({', '.join(names)}); pass name=")
        name = names[0]
    elif name not in names:
        raise ValueError(f"eqdsl.load: no tensor product named {name!r} in the spec (it has {', '.join(names)})")
    # with EQDSL_KERNELS=helion (eqdsl.runtime.triton_launch) the package is generated
    # without its Triton code, which would not be used
    triton = os.environ.get("EQDSL_KERNELS", "triton") != "helion"
    key = hashlib.sha256(
        text.encode("utf-8") + b"\0" + generator_fingerprint().encode() + (b"" if triton else b"\0helion")
    ).hexdigest()
    with _lock:
        if _loaded.get(name, key) != key:
            raise ValueError(
                f"eqdsl.load: another spec named {name!r} is already loaded in this process (its torch ops "
                f"are registered as eqdsl_{name}::*); give this one another name"
            )
        pkg_dir = cache_root(cache_dir) / "packages" / key[:32]
        if not (pkg_dir / name / "__init__.py").is_file():
            _generate(pkg_dir, text, specs, triton=triton)
        if triton:  # cubins for this GPU, once (eqdsl.build.build_for_current_gpu; no-op without CUDA)
            from .build import build_for_current_gpu

            build_for_current_gpu(pkg_dir)
        module = import_package(pkg_dir, name, key)
        _loaded[name] = key
    return module
