"""Ahead-of-time cubins of a generated package: the manifest, and installing them at run time.

``eqdsl build`` (``eqdsl/build.py``) compiles a package's Triton kernels on a CPU machine
with Triton's own compiler and cache, so its output *is* a set of Triton cache entries:
``<package>/cubins/<arch>/<key>/`` holds what Triton writes for one compiled variant (the
``.cubin``, its ``.json`` metadata and the ``__grp__<name>.json`` group file that lists
them; the IR stages with ``--keep-ir``), and ``<key>`` is Triton's cache key of that
compilation on the build machine (a hash of the Triton install, the kernel source, its
specialization, the options and the target). Triton's launchers (small C extensions, one
per argument signature, which Triton compiles with the system's C compiler before a
signature's first launch) are not shipped: building them would take Triton's CUDA backend
internals, and they are cached by Triton after the first process.
``<package>/cubins/manifest.json`` says what they were built with::

    {"format": 1, "triton": "3.6.0", "archs": ["sm_90"], "dtypes": ["float32", "float64"],
     "toolchain": {"sm_90": "<sha256>"},                # Triton's version + ptxas, per arch
     "modules": {"triton_kernels/tp_fwd_0_float32.py": "<sha256>", ...},
     "groups": {"sm_90": {"<key>": {"hash": "<hex>", "metadata": "<kernel>.json",
                                    "module": "triton_kernels/tp_fwd_0_float32.py",
                                    "function": "<jit function>", "options": {launch options},
                                    "specialization": {Triton's signature, constants, attrs}},
                          ...}}}

At run time, :func:`install` (called by the launcher once per package, before the
package's first CUDA launch) checks the manifest; then, before each kernel's first
compilation in the process, the kernel's entries for the current GPU's arch are put into
Triton's cache through Triton's public cache manager (``triton.runtime.cache.get_cache_manager``,
the directory ``triton.knobs.cache.dir`` / ``$TRITON_CACHE_DIR``), each under the key
*this* process's Triton computes for that variant (:func:`variant_hash`: Triton's own
``get_cache_key`` of the kernel, its specialization and options, as ``JITFunction.run``
-> ``triton.compile`` compute it). That key also hashes ``libtriton`` and Triton's Python
files, which differ between the wheels of one Triton release for different Python
versions (a build on a Python 3.11 CI machine, a GPU on Python 3.12): recomputing it
here lets one build serve every wheel of the release, while the manifest requires the
same Triton version and ptxas, which make the binary. Triton then finds each entry when
``JITFunction.run`` compiles that variant for the first time: a cache hit that loads the
cubin. Nothing of Triton's is patched. When the cubins cannot apply (no build for this
arch, another Triton version or ptxas, kernel sources changed since the build), it warns
once per package with a :class:`CubinNotice` and the kernels compile on first use as
without a build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
import warnings
from pathlib import Path

__all__ = [
    "CubinNotice",
    "variant_hash",
    "kernel_module",
    "FORMAT",
    "DIR",
    "MANIFEST",
    "KERNELS_DIR",
    "arch_name",
    "parse_arch",
    "toolchain_fingerprint",
    "module_hashes",
    "install",
]

FORMAT = 1  # manifest format
DIR = "cubins"  # package subdirectory of the build output
MANIFEST = "manifest.json"
KERNELS_DIR = "triton_kernels"  # the package's Triton modules (contract A of issue 22)

_lock = threading.RLock()
_noticed: set[str] = set()  # package dirs already warned about in this process


class CubinNotice(UserWarning):
    """A package's prebuilt cubins do not apply here; its kernels compile on first use.

    One per package and process, one line, naming the package, the reason and the
    ``eqdsl build`` command that fixes it. Silence it with
    ``warnings.filterwarnings("ignore", category=CubinNotice)``.
    """


def parse_arch(arch: str) -> int:
    """``"sm_90"`` (or ``"sm90"``, ``"90"``) -> ``90``, Triton's ``GPUTarget.arch`` number.

    Raises:
        ValueError: not of that form.
    """
    s = arch.strip().lower()
    s = s.removeprefix("sm_").removeprefix("sm")
    if not s.isdigit() or not 30 <= int(s) < 1000:
        raise ValueError(f"bad GPU arch {arch!r}: expected sm_<major><minor>, e.g. sm_90 (H100), sm_80 (A100)")
    return int(s)


def arch_name(capability: int) -> str:
    """``90`` -> ``"sm_90"``."""
    return f"sm_{capability}"


def toolchain_fingerprint(capability: int) -> str:
    """sha256 of the Triton version and the ptxas (``ptxas --version``, and the arch) that
    Triton uses for ``capability``: what makes the binary, besides the kernel and its
    specialization. Another ptxas (``TRITON_PTXAS_PATH``) gives another fingerprint."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", capability, 32))
    return hashlib.sha256(f"{triton.__version__}-{backend.hash()}".encode()).hexdigest()


_modules: dict[str, object] = {}


def kernel_module(path: Path):
    """The Triton module at ``path`` (imports torch and triton only), imported once per process."""
    import importlib.util

    key = str(path.resolve())
    module = _modules.get(key)
    if module is None:
        name = f"_eqdsl_cubins_{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[key] = module
    return module


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def variant_hash(fn, entry: dict, capability: int) -> str:
    """Triton's cache key (hex) in this process for one built variant of ``fn``.

    What ``JITFunction.run`` -> ``triton.compile`` compute for a launch of that
    specialization: ``get_cache_key(ASTSource(fn, signature, constants, attrs), backend,
    options, env_vars)``, the options parsed from the launch options as ``run`` does
    (with this process's ``knobs.runtime.debug`` and instrumentation mode), then again as
    ``compile`` does. ``env_vars`` are taken empty: a process that sets one of Triton's
    cache-invalidating variables (debugging flags) computes other keys and compiles.

    Args:
        fn: the ``triton.JITFunction``.
        entry: the manifest's entry (``specialization`` in Triton's
            ``serialize_specialization_data`` format, which ``JITFunction.preload`` reads;
            ``options``: the launch's ``num_warps``, ``num_stages``, ...).
        capability: the target arch (``90``).
    """
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, get_cache_key, make_backend

    spec = entry["specialization"]
    constants = {
        tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
        tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
        for k, v in zip(spec["constant_keys"], spec["constant_vals"])
    }
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {k: _tuples(v) for k, v in spec["signature"].items()}
    backend = make_backend(GPUTarget("cuda", capability, 32))
    kwargs = dict(entry["options"])
    kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    options = backend.parse_options(kwargs)  # JITFunction.run (_pack_args)
    options = backend.parse_options({f.name: getattr(options, f.name) for f in dataclasses.fields(options)})  # triton.compile
    key = get_cache_key(ASTSource(fn, signature, constants, attrs), backend, options, env_vars={})
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def module_hashes(package_dir: Path) -> dict[str, str]:
    """``{"triton_kernels/<module>.py": sha256 of its bytes}`` for every Triton module of the package."""
    d = Path(package_dir) / KERNELS_DIR
    if not d.is_dir():
        return {}
    return {f"{KERNELS_DIR}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.py"))}


def _notice(package_dir: Path, capability: int | None, reason: str) -> None:
    key = str(Path(package_dir).resolve())
    with _lock:
        if key in _noticed:
            return
        _noticed.add(key)
    import triton

    arch = arch_name(capability) if capability is not None else "this GPU"
    fix = f"eqdsl build {package_dir} --arch {arch}" if capability is not None else f"eqdsl build {package_dir}"
    warnings.warn(
        f"eqdsl: {Path(package_dir).name} has no cubins for {arch} / triton {triton.__version__} ({reason}); "
        f"its kernels compile on first use ({fix})",
        CubinNotice,
        stacklevel=3,
    )


def _mismatch(manifest: dict, package_dir: Path, capability: int) -> str | None:
    """Why the manifest's cubins cannot be this process's cache entries (``None``: they can)."""
    import triton

    if manifest.get("format") != FORMAT:
        return f"manifest format {manifest.get('format')!r}, expected {FORMAT}"
    if manifest.get("triton") != triton.__version__:
        return f"built with triton {manifest.get('triton')}"
    arch = arch_name(capability)
    if arch not in manifest.get("archs", ()):
        return f"built for {', '.join(manifest.get('archs', ())) or 'no arch'}"
    if manifest.get("toolchain", {}).get(arch) != toolchain_fingerprint(capability):
        return "built with another ptxas"
    if manifest.get("modules") != module_hashes(package_dir):
        return "kernel sources changed since the build"
    return None


def install(package_dir: Path, capability: int | None = None, *, eager: bool = False) -> bool:
    """Make the package's prebuilt cubins for this GPU Triton's cache entries; ``True`` if they apply.

    Checks the manifest (arch, Triton version and ptxas, kernel source hashes), then, by
    default, installs each kernel's variants *lazily*: right before Triton would compile
    a kernel of the package for the first time (Triton's ``knobs.runtime.jit_cache_hook``,
    chained to a hook set before), its entries are written into Triton's cache under the
    keys computed with that very ``JITFunction`` (:func:`variant_hash`), so Triton's
    compilation is a cache hit and nothing is computed twice: a process pays only for the
    kernels it launches. ``eager=True`` writes every entry now (tools, tests; it imports
    each kernel module by file).

    Writing is idempotent and safe with several processes (Triton's cache manager writes
    each file to a temporary name and renames it; the group file, which makes an entry
    visible, last; an entry already present is left as is). Never raises for a missing,
    corrupt or mismatched build: it warns (:class:`CubinNotice`, once per package and
    process) and returns ``False``; the kernels then compile on first use.

    Args:
        package_dir: the generated package directory (``<dir>/<name>``, holding ``cubins/``).
        capability: the GPU's compute capability as Triton numbers it (``90`` for
            ``sm_90``); default: the current CUDA device's (``torch.cuda.get_device_capability``).
        eager: write every entry now instead of before each kernel's first compilation.

    Returns:
        ``True`` when the manifest matches (and, with ``eager``, every entry is in
        Triton's cache); ``False`` otherwise.
    """
    package_dir = Path(package_dir)
    if capability is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        capability = major * 10 + minor
    root = package_dir / DIR
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        _notice(package_dir, capability, "not built")
        return False
    except (OSError, ValueError) as e:
        _notice(package_dir, capability, f"unreadable {DIR}/{MANIFEST}: {e}")
        return False
    try:
        reason = _mismatch(manifest, package_dir, capability)
        if reason is None:
            arch_dir = root / arch_name(capability)
            by_kernel: dict[tuple[str, str], list] = {}
            for key, entry in sorted(manifest["groups"][arch_name(capability)].items()):
                module = str((package_dir / entry["module"]).resolve())
                by_kernel.setdefault((module, entry["function"]), []).append((arch_dir / key, entry, capability))
            if eager:
                for (module, function), items in by_kernel.items():
                    _put(getattr(kernel_module(Path(module)), function), items)
            else:
                with _lock:
                    if (str(package_dir.resolve()), capability) not in _registered:  # once per process
                        _registered.add((str(package_dir.resolve()), capability))
                        for k, items in by_kernel.items():
                            _pending.setdefault(k, []).extend(items)
                    _chain_hook()
    except Exception as e:  # a corrupt build or an unwritable cache: compile instead, never fail the launch
        reason = f"{type(e).__name__}: {e}"
    if reason is not None:
        _notice(package_dir, capability, reason)
        return False
    return True


# (kernel module file, jit function name) -> [(build entry dir, manifest entry, capability)]: the
# entries install() accepted, written before that kernel's first compilation in this process
_pending: dict[tuple[str, str], list] = {}
_previous_hook: list = []  # the jit_cache_hook that was set before ours (called after ours)
_registered: set[tuple[str, int]] = set()  # (package dir, capability) whose entries went into _pending


def _chain_hook() -> None:
    import triton

    current = triton.knobs.runtime.jit_cache_hook
    if current is not _jit_cache_hook:
        _previous_hook[:] = [current] if current is not None else []
        triton.knobs.runtime.jit_cache_hook = _jit_cache_hook


def _jit_cache_hook(**kwargs):
    """Triton calls this right before compiling a kernel variant (``triton.knobs.runtime.jit_cache_hook``);
    a truthy result would skip the compilation: only the previous hook's result is returned."""
    jit_fn = kwargs["fn"].jit_function
    path = getattr(sys.modules.get(jit_fn.module), "__file__", None)
    if path is not None and _pending:
        with _lock:
            items = _pending.pop((str(Path(path).resolve()), jit_fn.__name__), None)
        if items:
            try:
                _put(jit_fn, items)
            except Exception as e:  # never fail the launch: the variant compiles
                _notice(items[0][0].parents[2], items[0][2], f"installing {jit_fn.__name__} failed: "
                                                            f"{type(e).__name__}: {e}")
    return _previous_hook[0](**kwargs) if _previous_hook else None


def _put(fn, items) -> None:
    """Write the build entries ``items`` of ``fn`` into Triton's cache under this process's
    keys, unless already there (the metadata's ``hash`` field set to that key, as Triton
    writes it)."""
    from triton.runtime.cache import get_cache_manager

    for src, entry, capability in items:
        h = variant_hash(fn, entry, capability)
        metadata = entry["metadata"]  # "<kernel>.json": the file name Triton looks the group up by
        manager = get_cache_manager(h)
        present = manager.get_group(metadata)
        names = json.loads((src / f"__grp__{metadata}").read_text(encoding="utf-8"))["child_paths"]
        if present is not None and set(present) >= set(names):
            continue
        paths = {}
        for name in sorted(names):
            data = (src / name).read_bytes()
            if name == metadata and h != entry["hash"]:
                meta = json.loads(data)
                meta["hash"] = h
                data = json.dumps(meta).encode("utf-8")
            paths[name] = manager.put(data, name)
        manager.put_group(metadata, paths)

