"""eqdsl: generate fast O(3)-equivariant tensor-product kernels from a TOML spec.

Layers (see DESIGN.md): ``spec`` (TOML -> validated ``TensorProductSpec``),
``irreps`` / ``instructions`` (e3nn algebra), ``cg`` (exact Clebsch-Gordan),
``lower`` (-> ``TensorProductIR``), ``reference`` (numpy oracle), ``codegen``
(IR -> files), ``cli``.
"""

__version__ = "0.1.0"

from .errors import SpecError
from .irreps import Irrep, Irreps, MulIr
from .lower import lower
from .spec import TensorProductSpec, load_spec, parse_spec

__all__ = ["SpecError", "Irrep", "Irreps", "MulIr", "lower", "TensorProductSpec", "load_spec", "parse_spec", "__version__"]
