"""Ahead-of-time cubins of a generated package: the manifest, and installing them at run time.

``eqdsl build`` (``eqdsl/build.py``) compiles a package's Triton kernels on a CPU machine
with Triton's own compiler and cache, so its output *is* a set of Triton cache entries:
``<package>/cubins/<arch>/<key>/`` holds what Triton writes for one compiled variant (the
``.cubin``, its ``.json`` metadata, the IR stages and the ``__grp__<name>.json`` group
file that lists them), and ``<key>`` is Triton's cache key of that compilation (a hash of
the Triton version, the kernel source, its specialization, the options and the target).
``<package>/cubins/manifest.json`` says what they were built with::

    {"format": 1, "triton": "3.6.0", "archs": ["sm_90"], "dtypes": ["float32", "float64"],
     "toolchain": {"sm_90": "<sha256>"},                # Triton's compiler + ptxas, per arch
     "modules": {"triton_kernels/tp_fwd_0_float32.py": "<sha256>", ...},
     "groups": {"sm_90": {"<key>": {"hash": "<hex>", "metadata": "<kernel>.json",
                                    "module": "triton_kernels/tp_fwd_0_float32.py"}, ...}}}

At run time, :func:`install` (called by the launcher once per package, before the
package's first CUDA launch) copies the entries of the current GPU's arch into Triton's
cache through Triton's public cache manager (``triton.runtime.cache.get_cache_manager``,
the directory ``triton.knobs.cache.dir`` / ``$TRITON_CACHE_DIR``). Triton then finds
them when ``JITFunction.run`` compiles a variant for the first time: the cache key it
computes on the GPU is the one the build computed, so the "compile" is a cache hit that
loads the cubin. Nothing of Triton's is patched. When the cubins cannot match (no build
for this arch, another Triton or ptxas, kernel sources changed since the build), it
warns once per package with a :class:`CubinNotice` and the kernels compile on first use
as without a build.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from pathlib import Path

__all__ = [
    "CubinNotice",
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

_lock = threading.Lock()
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
    """sha256 of what Triton's cache key takes from the installation for this target.

    Triton's key (``triton.compiler.compiler.compile`` -> ``get_cache_key``) starts with
    ``triton_key()`` (Triton's version and the hashes of its compiler, language and
    ``libtriton``) and the backend's hash (the ``ptxas --version`` it will use, and the
    arch). Equal fingerprints at build and run time are what make the keys equal; a
    different Triton build or ``TRITON_PTXAS_PATH`` gives another one (the cubins would
    never be found: the notice says so instead). ``triton_key`` is cached by Triton and
    computed anyway by the first compilation of the process.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.cache import triton_key

    backend = make_backend(GPUTarget("cuda", capability, 32))
    return hashlib.sha256(f"{triton_key()}-{backend.hash()}".encode()).hexdigest()


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
        return "built with another Triton build or ptxas"
    if manifest.get("modules") != module_hashes(package_dir):
        return "kernel sources changed since the build"
    return None


def install(package_dir: Path, capability: int | None = None) -> bool:
    """Put the package's prebuilt cubins for this GPU into Triton's cache; ``True`` if they apply.

    Idempotent and safe with several processes (Triton's cache manager writes each file
    to a temporary name and renames it; the group file, which makes an entry visible,
    last; an entry already present is left as is). Never raises for a missing, corrupt
    or mismatched build: it warns (:class:`CubinNotice`, once per package and process)
    and returns ``False``; the kernels then compile on first use.

    Args:
        package_dir: the generated package directory (``<dir>/<name>``, holding ``cubins/``).
        capability: the GPU's compute capability as Triton numbers it (``90`` for
            ``sm_90``); default: the current CUDA device's (``torch.cuda.get_device_capability``).

    Returns:
        ``True`` when the manifest matches (arch, Triton version and toolchain, kernel
        source hashes) and every entry is in Triton's cache; ``False`` otherwise.
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
            _copy_groups(root / arch_name(capability), manifest["groups"][arch_name(capability)])
    except Exception as e:  # a corrupt build or an unwritable cache: compile instead, never fail the launch
        reason = f"{type(e).__name__}: {e}"
    if reason is not None:
        _notice(package_dir, capability, reason)
        return False
    return True


def _copy_groups(arch_dir: Path, groups: dict) -> None:
    """Each build entry ``arch_dir/<key>/`` into Triton's cache, unless already there."""
    from triton.runtime.cache import get_cache_manager

    for key, entry in sorted(groups.items()):
        src = arch_dir / key
        metadata = entry["metadata"]  # "<kernel>.json": the file name Triton looks the group up by
        manager = get_cache_manager(entry["hash"])
        present = manager.get_group(metadata)
        names = json.loads((src / f"__grp__{metadata}").read_text(encoding="utf-8"))["child_paths"]
        if present is not None and set(present) >= set(names):
            continue
        paths = {name: manager.put((src / name).read_bytes(), name) for name in sorted(names)}
        manager.put_group(metadata, paths)
