"""Generate a package from spec text into a temporary directory and import it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from eqdsl.codegen.generate import generate


def build_package(root: Path, name: str, spec_text: str) -> ModuleType:
    """Write ``spec_text`` to ``root/<name>.toml``, generate into ``root/pkg_<name>``, import it.

    Returns the generated package module; import its ``torch_ops`` / ``jax_ops`` yourself.
    """
    root.mkdir(parents=True, exist_ok=True)
    spec = root / f"{name}.toml"
    spec.write_text(spec_text)
    out = root / f"pkg_{name}"
    generate(spec, out)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"pkg_{name}.{name}")
