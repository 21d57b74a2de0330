"""Backend-neutral facts about a ``TensorProductIR`` that the backends and runtimes read.

Each fact is a pure function of the IR (``eqdsl.ir``), decided once here so that the
Helion and Pallas code generators, the runtimes and the tuner agree on it. FLOPs and
bytes per batch element are IR fields (``TensorProductIR.flops_per_batch``,
``bytes_per_batch``, computed by ``eqdsl.lower``).
"""

from __future__ import annotations

from .ir import TensorProductIR

__all__ = ["fused_bwd_reason", "has_unweighted", "mixed_weighting"]


def fused_bwd_reason(ir: TensorProductIR, modes: frozenset[str] = frozenset({"uvu"})) -> str | None:
    """Why ``ir`` gets no fused backward kernel (one pass over ``g`` computing ``dF/dx1``,
    ``dF/dx2`` and ``dF/dW``), or None when it does.

    Eligible: per-batch weights (a shared weight gradient is a sum over the batch), every
    path weighted, of one of the backend's fused ``modes`` (``uvu``: the channelwise
    products of MACE, NequIP and Nequix, ``docs/problems.md``; the Helion and Pallas
    backends also ``uvw``, the fully connected edge products of DiffDock and e3tools), and every path's
    ``x2`` block of one channel (e.g. spherical harmonics). Then ``g`` (channelwise) or the
    per-row weights (``uvw``), the largest operand, is read once instead of two or three
    times.

    Args:
        ir: the lowered product.
        modes: the path modes the backend's fused kernel implements.

    Returns:
        A one-line reason, or None.
    """
    if ir.shared_weights:
        return "shared weights (the weight gradient is a sum over the batch)"
    for p in ir.paths:
        if p.mode not in modes or not p.has_weight:
            return f"path {p.index} is not a weighted {' or '.join(sorted(modes))} path"
        if ir.in2[p.i_in2].mul != 1:
            return f"path {p.index}'s x2 block has {ir.in2[p.i_in2].mul} channels, not 1"
    return None


def has_unweighted(ir: TensorProductIR) -> bool:
    """Whether some unweighted path contributes (has a CG nonzero): then the four-linear form
    ``F`` is affine, not linear, in ``W``, and the VJP of the weight gradient needs the
    derivatives of the weighted part alone."""
    return any(not p.has_weight and p.nonzeros for p in ir.paths)


def mixed_weighting(ir: TensorProductIR) -> bool:
    """Whether ``ir`` has both weighted and unweighted paths (zero-term paths counted too;
    the Pallas backend then generates its ``*_weighted`` kernels)."""
    return any(p.has_weight for p in ir.paths) and not all(p.has_weight for p in ir.paths)
