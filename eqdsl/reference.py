"""Numpy reference: evaluates a ``TensorProductIR`` with dense einsums.

This is the oracle every backend is compared with (and it is itself compared with
``e3nn.o3.TensorProduct`` in the tests). It reads only the IR, so it checks the
lowering as well as the kernels.
"""

from __future__ import annotations

import numpy as np

from .ir import Block, PathIR, TensorProductIR

__all__ = ["tensor_product_reference", "dense_cg", "block_view", "to_layout"]


def dense_cg(path: PathIR, d1: int, d2: int, do: int) -> np.ndarray:
    """The path's coefficients (normalization included) as a dense ``(d1, d2, do)`` array."""
    c = np.zeros((d1, d2, do))
    for n in path.nonzeros:
        c[n.i, n.j, n.k] = n.coeff
    return c


def block_view(x: np.ndarray, b: Block) -> np.ndarray:
    """``(batch, mul, 2l+1)`` view of block ``b`` of ``x`` (batch, dim), any layout."""
    seg = x[:, b.offset : b.offset + b.size]
    if b.stride_comp == 1:
        return seg.reshape(-1, b.mul, b.dim)
    return seg.reshape(-1, b.dim, b.mul).transpose(0, 2, 1)


def to_layout(x: np.ndarray, irreps_blocks: tuple[Block, ...], src: str, dst: str) -> np.ndarray:
    """Convert rows of ``x`` (batch, dim) between ``mul_ir`` and ``ir_mul``."""
    if src == dst:
        return x.copy()
    parts = []
    for b in irreps_blocks:
        seg = x[:, b.offset : b.offset + b.size]
        shape = (b.mul, b.dim) if src == "mul_ir" else (b.dim, b.mul)
        parts.append(seg.reshape(-1, *shape).transpose(0, 2, 1).reshape(-1, b.size))
    return np.concatenate(parts, axis=1) if parts else x.copy()


def tensor_product_reference(ir: TensorProductIR, x1, x2, weights) -> np.ndarray:
    """Evaluate the IR in float64.

    ``x1`` ``(batch, dim_in1)``, ``x2`` ``(batch, dim_in2)`` in the IR's layout;
    ``weights`` ``(weight_numel,)`` if shared else ``(batch, weight_numel)``.
    Returns ``(batch, dim_out)`` float64 in the IR's layout.
    """
    x1 = np.asarray(x1, dtype=np.float64)
    x2 = np.asarray(x2, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    batch = x1.shape[0]
    if x1.shape != (batch, ir.dim_in1) or x2.shape != (batch, ir.dim_in2):
        raise ValueError(f"expected x1 ({batch}, {ir.dim_in1}) and x2 ({batch}, {ir.dim_in2}), got {x1.shape}, {x2.shape}")
    wshape = (ir.weight_numel,) if ir.shared_weights else (batch, ir.weight_numel)
    if w.shape != wshape:
        raise ValueError(f"expected weights {wshape}, got {w.shape}")
    if ir.shared_weights:
        w = np.broadcast_to(w, (batch, ir.weight_numel))
    out_blocks = [np.zeros((batch, b.mul, b.dim)) for b in ir.out]
    for p in ir.paths:
        b1, b2, bo = ir.in1[p.i_in1], ir.in2[p.i_in2], ir.out[p.i_out]
        a, b = block_view(x1, b1), block_view(x2, b2)
        c = dense_cg(p, b1.dim, b2.dim, bo.dim)
        if p.has_weight:
            pw = w[:, p.weight_offset : p.weight_offset + p.weight_numel].reshape(batch, *p.path_shape)
        else:
            pw = np.ones((batch, *p.path_shape))
        if p.mode == "uvw":
            r = np.einsum("zuvw,ijk,zui,zvj->zwk", pw, c, a, b)
        elif p.mode == "uvu":
            r = np.einsum("zuv,ijk,zui,zvj->zuk", pw, c, a, b)
        elif p.mode == "uvv":
            r = np.einsum("zuv,ijk,zui,zvj->zvk", pw, c, a, b)
        elif p.mode == "uuu":
            r = np.einsum("zu,ijk,zui,zuj->zuk", pw, c, a, b)
        else:
            raise ValueError(f"unknown mode {p.mode!r}")
        out_blocks[p.i_out] += r
    out = np.zeros((batch, ir.dim_out))
    for b, ob in zip(ir.out, out_blocks):
        seg = ob if b.stride_comp == 1 else ob.transpose(0, 2, 1)
        out[:, b.offset : b.offset + b.size] = seg.reshape(batch, b.size)
    return out
