"""numpy float64 references of the symmetric contraction (no torch, no jax).

Two independent evaluations of the same function (``eqdsl.symmetric.ir``'s docstring):

* ``dense_reference(spec, x, weights, element)`` contracts the dense U tensors
  (``u_tensor_dense``, mace's ``U_matrix_real``) with ``x`` once per input axis, as mace's
  einsums do; it never reads the IR's symmetrized terms.
* ``symmetric_contraction_reference(x, weights, element, ir)`` sums the IR's terms
  (monomials of ``x``), the computation the generated kernels perform.

Shapes (``N`` nodes): ``x`` ``(N, dim_in * mul)`` and the result ``(N, sum(out_dims) * mul)``
in the spec's layout (``mul_ir`` | ``ir_mul``), ``weights`` ``(num_elements, weight_numel)``
in the IR's weight layout (``eqdsl.symmetric.lower``), ``element`` ``(N,)`` integers in
``0..num_elements-1``. Inputs of any float dtype are read as float64; the result is float64.
"""

from __future__ import annotations


import numpy as np

from .ir import SymmetricContractionIR
from .spec import SymmetricContractionSpec
from .u_tensors import u_tensor_dense

__all__ = ["dense_reference", "symmetric_contraction_reference", "to_channels", "from_channels"]


def to_channels(x: np.ndarray, dims: tuple[int, ...], mul: int, layout: str) -> np.ndarray:
    """``(N, sum(dims) * mul)`` in ``layout`` -> ``(N, sum(dims), mul)`` (component, channel)."""
    blocks, start = [], 0
    for d in dims:
        b = x[:, start:start + d * mul]
        blocks.append(b.reshape(-1, mul, d).transpose(0, 2, 1) if layout == "mul_ir" else b.reshape(-1, d, mul))
        start += d * mul
    return np.concatenate(blocks, axis=1)


def from_channels(y: np.ndarray, dims: tuple[int, ...], layout: str) -> np.ndarray:
    """The inverse of ``to_channels``: ``(N, sum(dims), mul)`` -> ``(N, sum(dims) * mul)``."""
    n, _, mul = y.shape
    blocks, start = [], 0
    for d in dims:
        b = y[:, start:start + d, :]
        blocks.append((b.transpose(0, 2, 1) if layout == "mul_ir" else b).reshape(n, d * mul))
        start += d
    return np.concatenate(blocks, axis=1)


def _check(x, weights, element, dim_in, mul, num_elements, weight_numel):
    x = np.asarray(x, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    element = np.asarray(element)
    if x.ndim != 2 or x.shape[1] != dim_in * mul:
        raise ValueError(f"x has shape {x.shape}, expected (num_nodes, {dim_in * mul})")
    if weights.shape != (num_elements, weight_numel):
        raise ValueError(f"weights have shape {weights.shape}, expected ({num_elements}, {weight_numel})")
    if element.shape != (x.shape[0],) or not np.issubdtype(element.dtype, np.integer):
        raise ValueError(f"element must be integers of shape ({x.shape[0]},), got {element.dtype} {element.shape}")
    if element.size and (element.min() < 0 or element.max() >= num_elements):
        raise ValueError(f"element indices must lie in 0..{num_elements - 1}")
    return x, weights, element


def symmetric_contraction_reference(x, weights, element, ir: SymmetricContractionIR) -> np.ndarray:
    """The contraction from the IR's terms, float64.

    Raises:
        ValueError: an input of the wrong shape, or an element index out of range.
    """
    x, weights, element = _check(x, weights, element, ir.dim_in, ir.mul, ir.num_elements, ir.weight_numel)
    xc = to_channels(x, _in_dims(ir.irreps_in), ir.mul, ir.layout)  # (N, dim_in, mul)
    w = weights[element]  # (N, weight_numel)
    out_starts = np.cumsum((0,) + ir.out_dims)
    out = np.zeros((x.shape[0], int(out_starts[-1]), ir.mul))
    for t in ir.terms:
        off = ir.weight_offsets[t.out][t.nu - 1] + t.k * ir.mul
        p = t.coeff * w[:, off:off + ir.mul]
        for i in t.monomial:
            p = p * xc[:, i, :]
        out[:, out_starts[t.out] + t.m, :] += p
    return from_channels(out, ir.out_dims, ir.layout)


def dense_reference(spec: SymmetricContractionSpec, x, weights, element) -> np.ndarray:
    """The contraction from the dense U tensors (mace's einsum order), float64.

    ``weights`` in the IR's weight layout: the offsets are recomputed here from the U
    tensors' ``K`` (mace's order: per output block, ``nu = N, N-1, ..., 1``).

    Raises:
        ValueError: an input of the wrong shape, or an element index out of range.
    """
    mul = spec.mul
    dim_in = spec.irreps_in.dim // mul
    us = [[u_tensor_dense(spec.coupling_irreps, mi.ir, nu, spec.cg_convention)
           for nu in range(1, spec.correlation[o] + 1)] for o, mi in enumerate(spec.irreps_out)]
    numel = sum(u.shape[-1] * mul for per in us for u in per)
    x, weights, element = _check(x, weights, element, dim_in, mul, spec.num_elements, numel)
    xc = to_channels(x, tuple(mi.ir.dim for mi in spec.irreps_in), mul, spec.layout)  # (N, i, c)
    w = weights[element]
    outs, col = [], 0
    for o, mi in enumerate(spec.irreps_out):
        acc = np.zeros((x.shape[0], mi.ir.dim, mul))
        for nu in range(spec.correlation[o], 0, -1):
            u = us[o][nu - 1]  # (m, i_1, ..., i_nu, k)
            k = u.shape[-1]
            wk = w[:, col:col + k * mul].reshape(x.shape[0], k, mul)  # (N, k, c)
            col += k * mul
            # T[n, c, m, i_1..i_j, k]: contract the last input axis with x, nu times
            t = np.einsum("nkc,m...k->ncm...k", wk, u)
            for j in range(nu, 0, -1):
                ax = "pqrs"[:j - 1]  # letters unused by n, c, m, i, k
                t = np.einsum(f"ncm{ax}ik,nic->ncm{ax}k", t, xc)
            acc += t.sum(axis=-1).transpose(0, 2, 1)
        outs.append(acc)
    return from_channels(np.concatenate(outs, axis=1), tuple(mi.ir.dim for mi in spec.irreps_out), spec.layout)


def _in_dims(irreps: str) -> tuple[int, ...]:
    from ..irreps import Irreps
    return tuple(mi.ir.dim for mi in Irreps(irreps))
