"""IR of a symmetric contraction (MACE's product basis): plain, frozen data.

Both backends are generated from this IR; nothing here imports torch or jax.

Function (``b`` a node, ``o`` an output block of ``irreps_out``, ``m`` its component
``0..2L``, ``c`` a channel ``0..mul-1``, ``x[b, i, c]`` component ``i`` (``0..dim_in-1``,
irreps_in's blocks one after the other) of channel ``c`` of node ``b``'s input)::

    out[b, o, m, c] = sum_nu sum_k W[elem[b], weight_offsets[o][nu-1] + k*mul + c]
                      * sum_{t in terms, (t.out, t.m, t.nu, t.k) == (o, m, nu, k)}
                        t.coeff * prod_{i in t.monomial} x[b, i, c]

This is exactly mace-torch 0.3.16's ``SymmetricContraction`` (``U_matrix_real`` in the
e3nn basis) with its parameters flattened per element by
``eqdsl.symmetric.lower.weights_from_mace`` (and back by ``weights_to_mace``).

Layouts of the node arrays (one row per node): ``x`` is ``(num_nodes, dim_in * mul)`` and
``out`` ``(num_nodes, sum(out_dims) * mul)``. ``mul_ir`` (e3nn, MACE): each irrep block
``mul x (2l+1)`` row-major, channel-major inside the block, i.e. component ``i`` of block
``j`` (offset ``s_j`` in dim_in, dim ``d_j``) and channel ``c`` sit at
``mul * s_j + c * d_j + (i - s_j)``. ``ir_mul`` (cuEquivariance): ``mul * s_j +
(i - s_j) * mul + c``. The output blocks likewise with ``out_dims``.
Weights: ``(num_elements, weight_numel)`` (row ``elem[b]``), ``elem`` int indices
``(num_nodes,)``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["SymmetricTerm", "SymmetricContractionIR"]


@dataclass(frozen=True)
class SymmetricTerm:
    """One nonzero of a symmetrized U tensor.

    Attributes:
        out: index of the output irrep block in ``irreps_out``.
        m: component in that irrep, ``0..2L``.
        nu: correlation order, ``len(monomial)``.
        k: weight (parameter) index within ``(out, nu)``, ``0..num_params[out][nu-1]-1``.
        monomial: nondecreasing indices of A-basis components (``0..dim_in-1``), length ``nu``.
        coeff: float of the exact value: the sum of U over the monomial's distinct
            permutations, rounded to float64 once (from 50 significant digits).
        coeff_exact: the exact value as text ``sympy.sympify`` reads, e.g.
            ``'1/3*sqrt(3)'`` (a sum of rationals times square roots of squarefree ints).
    """

    out: int
    m: int
    nu: int
    k: int
    monomial: tuple[int, ...]
    coeff: float
    coeff_exact: str = ""


@dataclass(frozen=True)
class SymmetricContractionIR:
    """A symmetric contraction: everything a kernel template needs.

    Attributes:
        name: the spec's name (a Python identifier).
        irreps_in: the A basis, one multiplicity, e.g. ``"128x0e+128x1o+128x2e+128x3o"``.
        irreps_out: e.g. ``"128x0e+128x1o"`` (same multiplicity).
        mul: channels.
        dim_in: sum of ``2l+1`` over irreps_in.
        out_dims: ``2L+1`` per output block.
        correlation: max ``nu`` per output block.
        num_elements: rows of the weight table.
        num_params: ``[out][nu-1]``: number of weights ``K`` per ``(out, nu)``, mace's
            U tensor's last axis; 0 where no path reaches ``out`` at order ``nu`` (mace
            keeps a one-weight placeholder there, multiplying a zero U).
        weight_numel: per element: sum over out, nu of ``K * mul``.
        weight_offsets: ``[out][nu-1]``: column offset of ``(out, nu)``'s ``(K, mul)`` block.
        layout: ``"mul_ir"`` | ``"ir_mul"`` of x and out (see the module docstring).
        dtypes: e.g. ``("float32", "float64")``.
        terms: the nonzeros, sorted by ``(out, m, nu, k, monomial)``; a weight ``k`` may
            have no term (an antisymmetric path, e.g. ``1o x 1o -> 1e``, symmetrizes to 0:
            mace keeps its weight, which then multiplies nothing).
        basis: ``"e3nn"`` (mace's ``U_matrix_real``).
        cg_convention: ``"e3nn-0.4"`` or ``"e3nn-0.5"`` (the wigner_3j signs).
    """

    name: str
    irreps_in: str
    irreps_out: str
    mul: int
    dim_in: int
    out_dims: tuple[int, ...]
    correlation: tuple[int, ...]
    num_elements: int
    num_params: tuple[tuple[int, ...], ...]
    weight_numel: int
    weight_offsets: tuple[tuple[int, ...], ...]
    layout: str
    dtypes: tuple[str, ...]
    terms: tuple[SymmetricTerm, ...]
    basis: str = "e3nn"
    cg_convention: str = "e3nn-0.4"

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys; floats via ``repr`` round-trip exactly)."""
        return json.dumps(asdict(self), sort_keys=True)
