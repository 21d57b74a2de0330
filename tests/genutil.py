"""Generate a package from spec text into a temporary directory and import it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from eqdsl.codegen.generate import generate_files, write_package


def build_package(root: Path, name: str, spec_text: str, *, triton: bool = False) -> ModuleType:
    """Write ``spec_text`` to ``root/<name>.toml``, generate into ``root/pkg_<name>``, import it.

    ``triton``: with the kernels' Triton code (``triton_kernels/``; seconds per kernel to
    lower); without it the torch ops run the Helion kernels. Returns the generated package
    module; import its ``torch_ops`` / ``jax_ops`` yourself.
    """
    root.mkdir(parents=True, exist_ok=True)
    spec = root / f"{name}.toml"
    spec.write_text(spec_text)
    out = root / f"pkg_{name}"
    write_package(out, generate_files(spec, out, triton=triton))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"pkg_{name}.{name}")
