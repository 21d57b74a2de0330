"""Symmetric contraction (MACE's product basis, issue 27): spec, exact U tensors, IR, references.

Modules: ``spec`` (``[[symmetric_contraction]]`` tables -> ``SymmetricContractionSpec``),
``u_tensors`` (exact U tensors, equal to mace-torch's ``U_matrix_real``), ``lower``
(spec -> ``ir.SymmetricContractionIR``; mace's weights to and from the IR's layout),
``reference`` (numpy float64 evaluations), ``tables`` (the kernels' term tables), ``fold``
(each element's weights contracted with the coefficients, the IR the runtimes' tables come
from), ``loader`` (``load``: generate a package into the
cache and import it, as ``eqdsl.load`` does for tensor products). ``docs/symmetric_contraction.md`` describes
the function, the keys and the weight layout.
"""

from .ir import SymmetricContractionIR, SymmetricTerm
from .lower import lower, mace_weight_blocks, spec_from_mace, weights_from_mace, weights_to_mace
from .reference import dense_reference, symmetric_contraction_reference
from .spec import SymmetricContractionSpec, load_symmetric_specs, parse_symmetric_specs

__all__ = [
    "SymmetricContractionIR", "SymmetricTerm", "SymmetricContractionSpec", "load_symmetric_specs",
    "parse_symmetric_specs", "lower", "weights_from_mace", "weights_to_mace", "mace_weight_blocks",
    "spec_from_mace", "load", "symmetric_spec_to_toml",
    "dense_reference", "symmetric_contraction_reference",
]


def __getattr__(name: str):
    # The run-time loader (cache, file locks, imports of generated packages) is imported on
    # first use: generating and checking packages (``eqdsl generate`` / ``eqdsl check``) import
    # this package and need none of it.
    if name in ("load", "symmetric_spec_to_toml"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
