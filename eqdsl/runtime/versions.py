"""Supported versions of the frameworks the generated modules run on, checked at import.

The ranges are the versions eqdsl was tested with (CPU CI: torch 2.13, jax 0.10.2; the GPU
machine: torch 2.11, jax 0.11.2; helion 1.4.0 and triton 3.6.0 on both). Upper bounds are
exclusive and deliberate: JAX 0.11 deprecated the Triton lowering of Pallas, and the Helion
launcher depends on Helion's and Triton's generated code, so a newer release must fail with
a clear message at import, not with a wrong result at run time. ``pyproject.toml`` states the
same ranges for pip.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["SUPPORTED", "check", "in_range"]

# distribution -> (lowest supported, first unsupported)
SUPPORTED = {
    "torch": ("2.11", "2.14"),
    "triton": ("3.6", "3.7"),
    "helion": ("1.4", "1.5"),
    "jax": ("0.10.2", "0.12"),
    "jaxlib": ("0.10.2", "0.12"),
}


def _release(version: str) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> ``(2, 11, 0)``: the leading numeric release segments."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):  # "0rc1": a pre-release of this segment's number
            break
    return tuple(out)


def in_range(version: str, low: str, high: str) -> bool:
    """``low <= version < high``, comparing release numbers (local tags ignored)."""
    return _release(low) <= _release(version) < _release(high)


def check(*distributions: str) -> None:
    """Raise ``ImportError`` naming the package, its installed version and the supported
    range if an installed distribution of ``distributions`` is outside ``SUPPORTED``.
    Distributions that are not installed are skipped (importing them fails on its own)."""
    for name in distributions:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        low, high = SUPPORTED[name]
        if not in_range(version, low, high):
            raise ImportError(f"eqdsl supports {name} >= {low}, < {high}; {version} is installed "
                              f"(pip install '{name}>={low},<{high}')")
