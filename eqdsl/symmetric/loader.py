"""``eqdsl.symmetric.load``: generate a symmetric contraction's package into the cache and import it.

The counterpart of ``eqdsl.load`` (``eqdsl/loader.py``) for ``[[symmetric_contraction]]``
specs, with the same cache: ``<cache>/packages/<key>/<name>/`` beside the canonical
``spec.toml``, ``<cache>`` from ``eqdsl.loader.cache_root`` (``cache_dir``, else
``$EQDSL_CACHE_DIR``, else ``~/.cache/eqdsl``; ``EQDSL_CACHE_DIR=""``: a temporary directory
of this process). The key is the SHA-256 of the canonical spec text (``symmetric_spec_to_toml``:
every key explicit) and of ``eqdsl.loader.generator_fingerprint()`` (eqdsl's version, sources
and templates), so a changed generator never serves stale kernels. Generation is atomic and
safe with several processes (``eqdsl.loader.install_package``: a per-key lock, a complete
directory renamed into place).

The package is what ``eqdsl generate`` writes for the spec (``symmetric_package_files``): the
metadata ``__init__.py``, ``torch_symmetric.py`` (Helion kernels behind torch custom ops,
``torch.ops.eqdsl_sc_<name>``), ``triton_kernels/`` (the Triton code of those kernels, which
the torch ops launch: no Helion at run time; lowered once per machine, the lowering cache is
keyed by the kernels' code, which does not depend on the irreps) and ``jax_ops.py`` (Pallas
kernels). With ``EQDSL_KERNELS=helion`` (``eqdsl.runtime.triton_launch``) it is generated
without ``triton_kernels/``, under another key, as ``eqdsl.load`` does.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from types import ModuleType

from ..loader import cache_root, generator_fingerprint, import_package, install_package, toml_table
from .spec import SymmetricContractionSpec, load_symmetric_specs, parse_symmetric_specs

__all__ = ["load", "symmetric_spec_to_toml"]

# the package's framework modules, imported on first attribute access
_LAZY_SUBMODULES = ("torch_symmetric", "jax_ops")
_lock = threading.Lock()
_loaded: dict[str, str] = {}  # package name -> cache key, this process (torch ops: eqdsl_sc_<name>)


def symmetric_spec_to_toml(spec: SymmetricContractionSpec) -> str:
    """The ``[[symmetric_contraction]]`` table of ``spec``, every key explicit (deterministic:
    the same spec always gives the same text). Raises ``ValueError`` if the text does not
    read back as an equal spec."""
    irs = [str(mi.ir) for mi in spec.irreps_out]
    if len(set(spec.correlation)) == 1:
        correlation = spec.correlation[0]
    else:  # per output irrep: the parser allows a table only where each output irrep appears once
        correlation = dict(zip(irs, spec.correlation))
    table = {
        "name": spec.name, "irreps_in": str(spec.irreps_in), "irreps_out": str(spec.irreps_out),
        "correlation": correlation, "num_elements": spec.num_elements, "layout": spec.layout,
        "dtypes": list(spec.dtypes), "basis": spec.basis, "cg_convention": spec.cg_convention,
    }
    text = toml_table(table, header="symmetric_contraction")
    if parse_symmetric_specs(text, "<symmetric_spec_to_toml>") != (spec,):
        raise ValueError(f"symmetric_spec_to_toml: {spec.name!r} does not read back the same; cannot serialize it")
    return text


def _resolve(spec, name: str | None) -> SymmetricContractionSpec:
    if isinstance(spec, SymmetricContractionSpec):
        specs = (spec,)
    elif isinstance(spec, str) and ("\n" in spec or "[" in spec):
        specs = parse_symmetric_specs(spec, "<eqdsl.symmetric.load>")
    elif isinstance(spec, (str, os.PathLike)):
        specs = load_symmetric_specs(spec)
    else:
        raise TypeError("eqdsl.symmetric.load: expected spec TOML text, a spec file path, or a "
                        f"SymmetricContractionSpec; got {type(spec).__name__}")
    names = [s.name for s in specs]
    if not specs:
        raise ValueError("eqdsl.symmetric.load: the spec has no [[symmetric_contraction]] table")
    if name is None:
        if len(specs) > 1:
            raise ValueError(f"eqdsl.symmetric.load: the spec has {len(specs)} symmetric contractions "
                             f"({', '.join(names)}); pass name=")
        return specs[0]
    if name not in names:
        raise ValueError(f"eqdsl.symmetric.load: no symmetric contraction named {name!r} in the spec "
                         f"(it has {', '.join(names)})")
    return specs[names.index(name)]


def load(spec, *, name: str | None = None, cache_dir: str | os.PathLike | None = None) -> ModuleType:
    """Generate (once, cached on disk) and import the package of one symmetric contraction.

    Args:
        spec: a ``SymmetricContractionSpec``, spec TOML text (a ``str`` holding ``[`` or a
            newline) or a spec file path (``str`` or ``os.PathLike``).
        name: which ``[[symmetric_contraction]]`` table; required when the text or file has
            several (only the one named is generated).
        cache_dir: cache directory; default ``$EQDSL_CACHE_DIR`` or ``~/.cache/eqdsl``.

    Returns:
        The package module: metadata (``IRREPS_IN``, ``CORRELATION``, ``WEIGHT_NUMEL``,
        ``WEIGHT_OFFSETS``, ``LAYOUT``, ... as in a generated ``__init__.py``), ``SPEC_FILE``
        (the cached spec) and, imported on first access, ``torch_symmetric``
        (``torch_symmetric.symmetric_contraction(x, weights, elem, *, check=True)``: x
        ``(num_nodes, dim_in * mul)`` in the spec's layout, weights ``(num_elements,
        weight_numel)`` in ``weights_from_mace``'s layout, elem int32/int64 ``(num_nodes,)``,
        out ``(num_nodes, dim_out * mul)``) and ``jax_ops``. The same spec returns the same
        module object.

    Raises:
        SpecError: the spec is invalid or its file unreadable.
        ValueError: no symmetric contraction in the spec, ``name`` missing with several or
            naming none, or another spec of the same name already loaded in this process (its
            torch ops are registered as ``eqdsl_sc_<name>::*``; give it another name).
        TypeError: ``spec`` is of no accepted type.
    """
    sc = _resolve(spec, name)
    text = symmetric_spec_to_toml(sc)
    triton = os.environ.get("EQDSL_KERNELS", "triton") != "helion"
    key = hashlib.sha256(b"symmetric_contraction\0" + text.encode("utf-8") + b"\0"
                         + generator_fingerprint().encode() + (b"" if triton else b"\0helion")).hexdigest()
    with _lock:
        if _loaded.get(sc.name, key) != key:
            raise ValueError(
                f"eqdsl.symmetric.load: another symmetric contraction named {sc.name!r} is already loaded in this "
                f"process (its torch ops are registered as eqdsl_sc_{sc.name}::*); give this one another name")
        pkg_dir = Path(cache_root(cache_dir)) / "packages" / key[:32]
        if not (pkg_dir / sc.name / "__init__.py").is_file():
            install_package(pkg_dir, text, lambda header: _files(sc, header, triton))
        module = import_package(pkg_dir, sc.name, key, lazy=_LAZY_SUBMODULES)
        _loaded[sc.name] = key
    return module


def _files(sc: SymmetricContractionSpec, header: str, triton: bool) -> dict[str, str]:
    from ..codegen.generate import symmetric_package_files
    from .lower import lower

    return symmetric_package_files(lower(sc), header, triton=triton)
