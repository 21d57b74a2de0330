"""eqdsl: generate fast O(3)-equivariant tensor-product kernels from a TOML spec.

Layers (see docs/architecture.md): ``spec`` (TOML -> validated ``TensorProductSpec``),
``irreps`` / ``instructions`` (e3nn algebra), ``cg`` (exact Clebsch-Gordan),
``lower`` (-> ``TensorProductIR``), ``reference`` (numpy oracle), ``codegen``
(IR -> files), ``cli``.
"""

__version__ = "0.1.0"

__all__ = ["SpecError", "Irrep", "Irreps", "MulIr", "lower", "TensorProductSpec", "load_spec", "parse_spec", "__version__",
           "load", "spec_to_toml", "spec_from_e3nn", "spec_from_e3nn_jax"]

# Imported on first use: ``import eqdsl`` stays light, and so does every generated
# package's runtime (``eqdsl.runtime.*``), which must not pay for sympy (``cg``, 3.7 s of a
# first call on the H100 machine's host, 2026-11-26). The framework modules ``eqdsl.torch``
# and ``eqdsl.jax`` are imported explicitly (``import eqdsl.torch``).
_LAZY = {"SpecError": "errors", "Irrep": "irreps", "Irreps": "irreps", "MulIr": "irreps", "lower": "lower",
         "TensorProductSpec": "spec", "load_spec": "spec", "parse_spec": "spec",
         "load": "loader", "spec_to_toml": "loader", "spec_from_e3nn": "from_e3nn", "spec_from_e3nn_jax": "from_e3nn"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
