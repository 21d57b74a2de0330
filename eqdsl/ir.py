"""Kernel IR: plain, frozen data that both backends are generated from.

Everything a template needs is here, as ints, floats, strings and tuples; nothing in
the IR imports torch or jax. ``to_json`` is deterministic (sorted keys, ``repr`` floats
that round-trip exactly), so the same spec always gives byte-identical serialized IR.

Addressing. A flat operand row (one batch element) holds its irreps blocks one after
the other. Element ``(u, m)`` of a block (channel ``u < mul``, component ``m < 2l+1``)
sits at ``offset + u * stride_mul + m * stride_comp``: ``mul_ir`` (e3nn) has
``stride_mul = 2l+1, stride_comp = 1``; ``ir_mul`` (cuEquivariance) has
``stride_mul = 1, stride_comp = mul``. Weights are always in e3nn's order: path after
path (weighted paths only), each block ``path_shape`` row-major.

Semantics of a path (e3nn ``TensorProduct``, ``z`` the batch index, ``C`` the path's
nonzeros with the normalized path weight folded in, ``W`` its weight block or 1)::

    uvw: out[z, w, k] += sum_{u,v,i,j} W[u, v, w] C[i, j, k] x1[z, u, i] x2[z, v, j]
    uvu: out[z, u, k] += sum_{v,i,j}   W[u, v]    C[i, j, k] x1[z, u, i] x2[z, v, j]
    uvv: out[z, v, k] += sum_{u,i,j}   W[u, v]    C[i, j, k] x1[z, u, i] x2[z, v, j]
    uuu: out[z, u, k] += sum_{i,j}     W[u]       C[i, j, k] x1[z, u, i] x2[z, u, j]

With per-batch weights (``shared_weights = False``) ``W`` gains the index ``z``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["Block", "CGNonzero", "PathIR", "TensorProductIR", "ITEMSIZE"]

ITEMSIZE = {"float32": 4, "float64": 8}


@dataclass(frozen=True)
class Block:
    """One ``mul x (l, parity)`` block of a flat operand and where it lives."""

    index: int
    mul: int
    l: int
    parity: int
    offset: int
    stride_mul: int
    stride_comp: int

    @property
    def dim(self) -> int:
        """Components per channel, ``2l + 1``."""
        return 2 * self.l + 1

    @property
    def size(self) -> int:
        return self.mul * self.dim

    def __str__(self) -> str:
        return f"{self.mul}x{self.l}{'e' if self.parity == 1 else 'o'}@{self.offset}[{self.stride_mul},{self.stride_comp}]"


@dataclass(frozen=True)
class CGNonzero:
    """``coeff = path_weight * wigner_3j(l1, l2, l_out)[i, j, k]``, nonzero."""

    i: int
    j: int
    k: int
    coeff: float

    def __str__(self) -> str:
        return f"({self.i},{self.j},{self.k}):{self.coeff!r}"


@dataclass(frozen=True)
class PathIR:
    """One instruction, lowered.

    ``path_weight`` is e3nn's normalized ``Instruction.path_weight`` (already in every
    ``coeff``); ``weight_offset`` is ``-1`` for an unweighted path. ``flops`` counts a
    direct evaluation per batch element (a multiply-add is 2).
    """

    index: int
    mode: str
    i_in1: int
    i_in2: int
    i_out: int
    has_weight: bool
    path_weight: float
    weight_offset: int
    path_shape: tuple[int, ...]
    nonzeros: tuple[CGNonzero, ...]
    flops: int

    @property
    def weight_numel(self) -> int:
        n = 1
        for s in self.path_shape:
            n *= s
        return n if self.has_weight else 0

    def __str__(self) -> str:
        return (
            f"path {self.index}: ({self.i_in1}, {self.i_in2}, {self.i_out}, {self.mode!r}, {self.has_weight}) "
            f"pw={self.path_weight:.6g} nnz={len(self.nonzeros)} w@{self.weight_offset}{list(self.path_shape)}"
        )


@dataclass(frozen=True)
class TensorProductIR:
    """A whole tensor product, lowered: operand blocks, paths, and cost counts.

    ``bytes_per_batch`` maps each dtype of the spec to the bytes one batch element must
    move at least (x1, x2 and per-batch weights read once, out written once).
    ``conv``: also generate the fused graph convolution ``out[dst[e]] += TP(x[src[e]],
    edge_attr[e], w[e])`` with ``reduce`` (sum | mean over a node's in-edges) and
    ``deterministic`` (dst-sorted segment reduction instead of atomics).
    ``cg_convention``: the ``wigner_3j`` sign convention the nonzeros were lowered in
    (``eqdsl.cg.CG_CONVENTIONS``); already in every ``coeff``, recorded for readers.
    ``radial_features``: ``H`` of ``conv_radial`` (the conv given per-edge hidden features
    ``(E, H)`` and the radial MLP's last-layer matrix ``(H, weight_numel)``), or None.
    """

    name: str
    irreps_in1: str
    irreps_in2: str
    irreps_out: str
    layout: str
    irrep_normalization: str
    path_normalization: str
    shared_weights: bool
    dtypes: tuple[str, ...]
    dim_in1: int
    dim_in2: int
    dim_out: int
    weight_numel: int
    in1: tuple[Block, ...]
    in2: tuple[Block, ...]
    out: tuple[Block, ...]
    paths: tuple[PathIR, ...]
    flops_per_batch: int
    bytes_per_batch: tuple[tuple[str, int], ...]
    conv: bool = False
    reduce: str = "sum"
    deterministic: bool = False
    cg_convention: str = "e3nn-0.5"
    radial_features: int | None = None

    def paths_into(self, i_out: int) -> tuple[PathIR, ...]:
        return tuple(p for p in self.paths if p.i_out == i_out)

    def to_json(self) -> str:
        """Deterministic serialization (sorted keys, exact float ``repr``)."""
        return json.dumps(asdict(self), sort_keys=True, indent=1) + "\n"

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} "
            f"[{self.layout}] {len(self.paths)} paths, {self.weight_numel} weights, "
            f"{self.flops_per_batch} flop/batch"
        )
