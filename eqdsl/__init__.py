"""eqdsl: generate fast O(3)-equivariant tensor-product kernels from a TOML spec.

Layers (see docs/architecture.md): ``spec`` (TOML -> validated ``TensorProductSpec``),
``irreps`` / ``instructions`` (e3nn algebra), ``cg`` (exact Clebsch-Gordan),
``lower`` (-> ``TensorProductIR``), ``reference`` (numpy oracle), ``codegen``
(IR -> files), ``cli``.
"""

__version__ = "0.1.0"

from .errors import SpecError
from .irreps import Irrep, Irreps, MulIr
from .lower import lower
from .spec import TensorProductSpec, load_spec, parse_spec

__all__ = ["SpecError", "Irrep", "Irreps", "MulIr", "lower", "TensorProductSpec", "load_spec", "parse_spec", "__version__",
           "load", "spec_to_toml", "spec_from_e3nn", "spec_from_e3nn_jax"]

# imported on first use (``eqdsl.load``, ...): ``import eqdsl`` stays light (and so does the
# runtime of every generated package, which imports it: ``cg`` imports sympy only when it
# computes coefficients, 3.7 s of a first call on the H100 machine's host, 2026-11-26). The framework
# modules ``eqdsl.torch`` and ``eqdsl.jax`` are imported explicitly (``import eqdsl.torch``).
_LAZY = {"load": "loader", "spec_to_toml": "loader", "spec_from_e3nn": "from_e3nn", "spec_from_e3nn_jax": "from_e3nn"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
