"""Spec files: ``[[symmetric_contraction]]`` tables (MACE's product basis, issue 27).

Parsing validates everything and raises one ``SpecError`` naming the file, the table, the
key and the reason (as ``eqdsl.spec`` does for ``[[tensor_product]]``). A file may hold
both kinds of table: ``eqdsl.spec.load_spec`` reads the tensor products and
``load_symmetric_specs`` the symmetric contractions; any other top-level key is refused.

Keys of a ``[[symmetric_contraction]]`` table (``docs/symmetric_contraction.md``):

==============  =============================================  ======================
key             type / values                                  default
==============  =============================================  ======================
name            Python identifier, unique among the file's     required
                symmetric contractions
irreps_in       e3nn irreps, one multiplicity, each irrep      required
                once: the A basis, e.g. "8x0e+8x1o+8x2e"
irreps_out      e3nn irreps, the same multiplicity             required
correlation     int 1..4 (every output), or a table            required
                {irrep = int 1..4} naming each output irrep
num_elements    int >= 1: rows of the per-element weights      required
layout          mul_ir | ir_mul (of x and out)                 mul_ir
dtypes          list of float32 | float64                      [float32, float64]
basis           e3nn (mace's ``U_matrix_real``); cuequivariance  e3nn
                (``use_reduced_cg=True``) is refused for now
cg_convention   e3nn-0.5 | e3nn-0.4 (wigner_3j signs; mace-    e3nn-0.5
                torch 0.3.16 pins e3nn 0.4.4)
==============  =============================================  ======================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cg import CG_CONVENTIONS, DEFAULT_CG_CONVENTION, E3NN_04_LMAX
from ..irreps import Irrep, Irreps
from ..spec_reader import TableReader, parse_document, parse_tables, read_spec_text

__all__ = [
    "SymmetricContractionSpec", "load_symmetric_specs", "parse_symmetric_specs", "BASES", "MAX_CORRELATION",
]

LAYOUTS = ("mul_ir", "ir_mul")
DTYPES = ("float32", "float64")
BASES = ("e3nn",)
MAX_CORRELATION = 4
TABLE = "symmetric_contraction"
_KNOWN = {
    "name", "irreps_in", "irreps_out", "correlation", "num_elements", "layout", "dtypes", "basis",
    "cg_convention",
}


@dataclass(frozen=True)
class SymmetricContractionSpec:
    """One validated symmetric contraction.

    ``irreps_in`` and ``irreps_out`` keep their multiplicities (all equal to ``mul``);
    ``correlation`` holds one int per output block, in ``irreps_out``'s order.
    """

    name: str
    irreps_in: Irreps
    irreps_out: Irreps
    mul: int
    correlation: tuple[int, ...]
    num_elements: int
    layout: str = "mul_ir"
    dtypes: tuple[str, ...] = DTYPES
    basis: str = "e3nn"
    cg_convention: str = DEFAULT_CG_CONVENTION
    origin: tuple[str, str] = field(default=("<spec>", f"{TABLE}.0"), compare=False)

    @property
    def coupling_irreps(self) -> tuple[Irrep, ...]:
        """The input irreps without multiplicity, in order (mace's ``coupling_irreps``)."""
        return tuple(mi.ir for mi in self.irreps_in)

    def __str__(self) -> str:
        return (f"{self.name}: sym^{max(self.correlation)}({self.irreps_in}) -> {self.irreps_out} "
                f"({self.num_elements} elements, {self.layout})")


def load_symmetric_specs(path: str | Path) -> tuple[SymmetricContractionSpec, ...]:
    """Read and validate the ``[[symmetric_contraction]]`` tables of a spec file.

    Returns an empty tuple if the file has none (it may hold only tensor products).

    Raises:
        SpecError: unreadable file, invalid TOML, an unknown top-level key, or a bad table.
    """
    return parse_symmetric_specs(read_spec_text(path), str(path))


def parse_symmetric_specs(text: str, filename: str = "<spec>") -> tuple[SymmetricContractionSpec, ...]:
    """Validate spec text (``filename`` is for error messages only); see ``load_symmetric_specs``."""
    return parse_tables(parse_document(text, filename).get(TABLE, []), filename, TABLE, _parse_table)


def _parse_table(t: dict, filename: str, idx: int) -> SymmetricContractionSpec:
    r = TableReader(t, filename, TABLE, idx, _KNOWN)
    fail, get, choice, irreps = r.fail, r.get, r.choice, r.irreps
    name = r.name()
    irreps_in, irreps_out = irreps("irreps_in"), irreps("irreps_out")
    muls = sorted({mi.mul for mi in irreps_in})
    if len(muls) != 1:
        fail("irreps_in", f"every irrep must have the same multiplicity (the channels), got '{irreps_in}'")
    mul = muls[0]
    irs_in = [str(mi.ir) for mi in irreps_in]
    dup = next((ir for k, ir in enumerate(irs_in) if ir in irs_in[:k]), None)
    if dup is not None:
        # mace couples each irrep of the A basis once (coupling_irreps) and counts its channels
        # as the multiplicity of 0e: a repeated irrep has no meaning there
        fail("irreps_in", f"'{dup}' appears twice; the A basis lists each irrep once")
    bad_out = next((mi for mi in irreps_out if mi.mul != mul), None)
    if bad_out is not None:
        fail("irreps_out", f"'{bad_out}': every output irrep has the input's multiplicity {mul} "
                           "(the contraction is channelwise)")

    corr = t.get("correlation")
    if "correlation" not in t:
        fail("correlation", "missing required key")
    irs_out = [str(mi.ir) for mi in irreps_out]

    def one_correlation(key: str, v) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_CORRELATION:
            fail(key, f"expected an integer 1..{MAX_CORRELATION}, got {v!r}")
        return v

    if isinstance(corr, dict):
        dup = next((ir for k, ir in enumerate(irs_out) if ir in irs_out[:k]), None)
        if dup is not None:
            fail("correlation", f"a table needs each output irrep once, but '{dup}' appears twice in irreps_out; "
                                "give one integer")
        for key in corr:
            if key not in irs_out:
                fail(f"correlation.{key}", f"not an irrep of irreps_out ({', '.join(irs_out)})")
        missing = [ir for ir in irs_out if ir not in corr]
        if missing:
            fail("correlation", f"the table names no correlation for output irrep '{missing[0]}'")
        correlation = tuple(one_correlation(f"correlation.{ir}", corr[ir]) for ir in irs_out)
    else:
        c = one_correlation("correlation", corr)
        correlation = (c,) * len(irreps_out)

    num_elements = get("num_elements", int, required=True)
    if num_elements < 1:
        fail("num_elements", f"must be >= 1, got {num_elements}")

    layout = choice("layout", LAYOUTS, "mul_ir")
    dtypes = r.dtypes(DTYPES)
    if t.get("basis") == "cuequivariance":
        fail("basis", "'cuequivariance' (mace's use_reduced_cg=True: cuequivariance's "
                      "reduced_symmetric_tensor_product_basis) is not implemented; use 'e3nn' (mace's default)")
    basis = choice("basis", BASES, "e3nn")
    cg_convention = choice("cg_convention", CG_CONVENTIONS, DEFAULT_CG_CONVENTION)
    if cg_convention == "e3nn-0.4":
        # mace's _wigner_nj asks e3nn for wigner_3j of every product irrep at every order
        # (orders 1..3 unfiltered: degree up to nu * lmax_in; order 4 filtered to l < 12)
        lmax_in = irreps_in.lmax
        need = max(nu * lmax_in for c in correlation for nu in range(1, min(c, 3) + 1))
        if need > E3NN_04_LMAX:
            fail("cg_convention", f"e3nn 0.4 has wigner_3j up to l = {E3NN_04_LMAX} only, mace's construction "
                                  f"here needs l = {need}; use 'e3nn-0.5'")
    return SymmetricContractionSpec(
        name=name, irreps_in=irreps_in, irreps_out=irreps_out, mul=mul, correlation=correlation,
        num_elements=num_elements, layout=layout, dtypes=dtypes, basis=basis, cg_convention=cg_convention,
        origin=(filename, r.where),
    )
