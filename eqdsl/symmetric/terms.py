"""A generated package's ``terms.py`` (the IR's nonzeros as literals) and the IR read back from it.

Both halves of a symmetric-contraction package (torch and JAX) build their kernels' tables
(``eqdsl.symmetric.tables``) from the same ``terms.py`` and the metadata of the package's
``__init__.py``: the package alone reproduces the IR, without sympy or the spec.
"""

from __future__ import annotations

from types import ModuleType

from ..backends.render import render
from ..irreps import Irreps
from .ir import SymmetricContractionIR, SymmetricTerm

__all__ = ["terms_file", "ir_from_package"]


def _literal(t: SymmetricTerm) -> str:
    return repr((t.out, t.m, t.nu, t.k, tuple(t.monomial), float(t.coeff)))


def terms_file(ir: SymmetricContractionIR, header: str) -> str:
    """The text of ``<name>/terms.py``."""
    return render("symmetric_terms.py.j2", header=header, name=ir.name, n_terms=len(ir.terms),
                  terms=[_literal(t) for t in ir.terms])


def ir_from_package(meta: ModuleType, terms: ModuleType) -> SymmetricContractionIR:
    """The IR of a generated package from its ``__init__`` metadata and ``terms`` module (the
    terms' exact texts are not kept: ``coeff_exact`` is empty)."""
    out_dims = tuple(mi.ir.dim for mi in Irreps(meta.IRREPS_OUT))
    return SymmetricContractionIR(
        name=meta.NAME,
        irreps_in=meta.IRREPS_IN, irreps_out=meta.IRREPS_OUT, mul=meta.MUL,
        dim_in=sum(mi.ir.dim for mi in Irreps(meta.IRREPS_IN)), out_dims=out_dims,
        correlation=tuple(meta.CORRELATION), num_elements=meta.NUM_ELEMENTS,
        num_params=tuple(tuple(p) for p in meta.NUM_PARAMS), weight_numel=meta.WEIGHT_NUMEL,
        weight_offsets=tuple(tuple(w) for w in meta.WEIGHT_OFFSETS), layout=meta.LAYOUT,
        dtypes=tuple(meta.DTYPES),
        terms=tuple(SymmetricTerm(out=o, m=m, nu=nu, k=k, monomial=tuple(mono), coeff=c)
                    for o, m, nu, k, mono, c in terms.TERMS),
        basis=meta.BASIS, cg_convention=meta.CG_CONVENTION)
