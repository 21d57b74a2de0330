"""Folded weights: each element's weights contracted with the U coefficients once per call, not per node.

The contraction (``eqdsl.symmetric.ir``) multiplies every distinct monomial of output component
``(o, m)`` by a weighted sum of coefficients,

    out[b, o, m, c] = sum_monomial  A[elem[b], (o, m, monomial), c] * prod_{i in monomial} x[b, i, c]
    A[e, (o, m, monomial), c] = sum_{t: (t.out, t.m, t.monomial) = (o, m, monomial)} t.coeff * W[e, (o, t.nu, t.k), c]

``A`` depends on the element and the channel only, so it is formed once per call, a
``(P, K)`` matrix times each element's ``(K, mul)`` weights (``K = weight_numel / mul`` weight rows,
``P`` the distinct ``(o, m, monomial)``: MACE-MP's contraction has ``K = 86``, ``P = 410``), and
the kernels that read weights (``fwd`` and ``bwd_x`` of every order) read one ``A`` row per
monomial instead of summing ``coeff * W`` over its terms for every node: MACE-MP's forward
loops over 410 heads instead of 1,909. ``fold_ir`` writes ``A``'s contraction as an IR of the
same kind (every coefficient 1, one "weight" per ``(o, m, monomial)``), so the term tables and
kernels serve both unchanged. The weight gradient stays unfolded (``bwd_w``'s result is per
weight row, ``K`` of them; folding it would write ``P`` per node).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .ir import SymmetricContractionIR, SymmetricTerm

__all__ = ["Fold", "fold_ir", "fold_weights_reference"]


@dataclass(frozen=True)
class Fold:
    """``A = matrix @ W`` per element, and the IR whose weights are ``A``.

    Attributes:
        ir: the folded IR: one term per ``(o, m, monomial)`` with coefficient 1, its ``k`` the
            ``A`` row within ``(o, nu)``; same irreps, layout and derivatives as the original.
        rows, cols: ``(P, K)``: ``A`` rows (``ir.weight_numel / mul``) and weight rows
            (original ``weight_numel / mul``).
        entries: ``(p, kk, value)`` nonzeros of the ``(P, K)`` fold matrix: ``A[e, p] +=
            value * W[e, kk]`` (rows of ``mul`` channels; ``W``'s row ``kk`` is its columns
            ``kk * mul .. kk * mul + mul - 1``).
    """

    ir: SymmetricContractionIR
    rows: int
    cols: int
    entries: tuple[tuple[int, int, float], ...]

    def __str__(self) -> str:
        return f"Fold({self.ir.name}: {self.cols} weight rows -> {self.rows} A rows, {len(self.entries)} nonzeros)"


def fold_ir(ir: SymmetricContractionIR) -> Fold:
    """The fold of ``ir`` (deterministic: ``A`` rows in the order of ``ir.terms``)."""
    mul = ir.mul
    blocks: list[list[list[tuple[int, tuple[int, ...]]]]] = [[[] for _ in ks] for ks in ir.num_params]
    index: dict[tuple[int, int, int, tuple[int, ...]], int] = {}
    for t in ir.terms:
        key = (t.out, t.nu, t.m, t.monomial)
        if key not in index:
            index[key] = len(blocks[t.out][t.nu - 1])
            blocks[t.out][t.nu - 1].append((t.m, t.monomial))
    num_params = tuple(tuple(len(b) for b in bs) for bs in blocks)
    offsets, off = [], 0
    for ks in num_params:
        row = []
        for kk in ks:
            row.append(off)
            off += kk * mul
        offsets.append(tuple(row))
    terms = tuple(SymmetricTerm(out=o, m=m, nu=nu, k=k, monomial=mono, coeff=1.0, coeff_exact="1")
                  for o, bs in enumerate(blocks) for nu, b in enumerate(bs, start=1) for k, (m, mono) in enumerate(b))
    terms = tuple(sorted(terms, key=lambda t: (t.out, t.m, t.nu, t.k, t.monomial)))
    folded = replace(ir, num_params=num_params, weight_numel=off, weight_offsets=tuple(offsets), terms=terms)
    entries: dict[tuple[int, int], float] = {}
    for t in ir.terms:
        p = offsets[t.out][t.nu - 1] // mul + index[(t.out, t.nu, t.m, t.monomial)]
        kk = ir.weight_offsets[t.out][t.nu - 1] // mul + t.k
        entries[(p, kk)] = entries.get((p, kk), 0.0) + t.coeff
    return Fold(ir=folded, rows=off // mul, cols=ir.weight_numel // mul,
                entries=tuple((p, kk, v) for (p, kk), v in sorted(entries.items())))


def fold_weights_reference(fold: Fold, weights):
    """``A``: ``(num_elements, fold.ir.weight_numel)`` from ``weights`` ``(num_elements,
    weight_numel)``, in numpy (the runtimes' fold is one batched matmul of the same matrix)."""
    import numpy as np

    w = np.asarray(weights)
    e = w.shape[0]
    mul = fold.ir.mul
    f = np.zeros((fold.rows, fold.cols), dtype=w.dtype)
    for p, kk, v in fold.entries:
        f[p, kk] += v
    return np.einsum("pk,ekc->epc", f, w.reshape(e, fold.cols, mul)).reshape(e, fold.rows * mul)
