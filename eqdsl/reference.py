"""Numpy reference: evaluates a ``TensorProductIR`` with dense einsums.

This is the oracle every backend is compared with (and it is itself compared with
``e3nn.o3.TensorProduct`` in the tests). It reads only the IR, so it checks the
lowering as well as the kernels. The coefficients are the IR's nonzeros, so the oracle
follows the spec's ``cg_convention`` (``TensorProductIR.cg_convention``: the signs of
e3nn >= 0.5's or e3nn 0.4's ``wigner_3j``) exactly as the kernels do.
"""

from __future__ import annotations

import numpy as np

from .ir import Block, PathIR, TensorProductIR

__all__ = [
    "tensor_product_reference", "tensor_product_vjp_reference", "conv_reference", "conv_vjp_reference",
    "dense_cg", "block_view", "to_layout",
]


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


# Einsum subscripts of each mode's four-linear form
#   F = sum W[z, ...] C[i, j, k] x1[z, u, i] x2[z, v, j] g[z, ., k]
# (e3nn's TensorProduct codegen): the forward is dF/dg, the gradients are dF/dx1,
# dF/dx2 and dF/dW. Order: (weights, x1, x2, out).
_SUBSCRIPTS = {
    "uvw": ("zuvw", "zui", "zvj", "zwk"),
    "uvu": ("zuv", "zui", "zvj", "zuk"),
    "uvv": ("zuv", "zui", "zvj", "zvk"),
    "uuu": ("zu", "zui", "zuj", "zuk"),
}
SUBSCRIPTS = _SUBSCRIPTS  # the public name (the code generators read it)


def _check(ir: TensorProductIR, x1, x2, weights, out=None):
    x1 = np.asarray(x1, dtype=np.float64)
    x2 = np.asarray(x2, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    batch = x1.shape[0] if x1.ndim == 2 else -1
    if x1.shape != (batch, ir.dim_in1) or x2.shape != (batch, ir.dim_in2):
        raise ValueError(f"expected x1 (batch, {ir.dim_in1}) and x2 (batch, {ir.dim_in2}), got {x1.shape}, {x2.shape}")
    wshape = (ir.weight_numel,) if ir.shared_weights else (batch, ir.weight_numel)
    if w.shape != wshape:
        raise ValueError(f"expected weights {wshape}, got {w.shape}")
    if out is not None:
        out = np.asarray(out, dtype=np.float64)
        if out.shape != (batch, ir.dim_out):
            raise ValueError(f"expected grad_out ({batch}, {ir.dim_out}), got {out.shape}")
    return x1, x2, np.broadcast_to(w, (batch, ir.weight_numel)), out


def _path_weights(p: PathIR, w: np.ndarray) -> np.ndarray:
    batch = w.shape[0]
    if p.has_weight:
        return w[:, p.weight_offset : p.weight_offset + p.weight_numel].reshape(batch, *p.path_shape)
    return np.ones((batch, *p.path_shape))


def _write_blocks(blocks: tuple[Block, ...], values: list[np.ndarray], batch: int, dim: int) -> np.ndarray:
    out = np.zeros((batch, dim))
    for b, v in zip(blocks, values):
        seg = v if b.stride_comp == 1 else v.transpose(0, 2, 1)
        out[:, b.offset : b.offset + b.size] = seg.reshape(batch, b.size)
    return out


def tensor_product_reference(ir: TensorProductIR, x1, x2, weights) -> np.ndarray:
    """Evaluate the IR in float64.

    ``x1`` ``(batch, dim_in1)``, ``x2`` ``(batch, dim_in2)`` in the IR's layout;
    ``weights`` ``(weight_numel,)`` if shared else ``(batch, weight_numel)``.
    Returns ``(batch, dim_out)`` float64 in the IR's layout. Raises ``ValueError`` on
    shape mismatch.
    """
    x1, x2, w, _ = _check(ir, x1, x2, weights)
    batch = x1.shape[0]
    out_blocks = [np.zeros((batch, b.mul, b.dim)) for b in ir.out]
    for p in ir.paths:
        b1, b2, bo = ir.in1[p.i_in1], ir.in2[p.i_in2], ir.out[p.i_out]
        sw, s1, s2, so = _SUBSCRIPTS[p.mode]
        c = dense_cg(p, b1.dim, b2.dim, bo.dim)
        out_blocks[p.i_out] += np.einsum(
            f"{sw},ijk,{s1},{s2}->{so}", _path_weights(p, w), c, block_view(x1, b1), block_view(x2, b2)
        )
    return _write_blocks(ir.out, out_blocks, batch, ir.dim_out)


def tensor_product_vjp_reference(ir: TensorProductIR, x1, x2, weights, grad_out):
    """Gradients of ``sum(grad_out * tensor_product(x1, x2, weights))``, float64.

    Returns ``(grad_x1, grad_x2, grad_weights)`` with the shapes and layout of the
    inputs (``grad_weights`` summed over the batch when weights are shared).
    """
    x1, x2, w, g = _check(ir, x1, x2, weights, grad_out)
    batch = x1.shape[0]
    g1 = [np.zeros((batch, b.mul, b.dim)) for b in ir.in1]
    g2 = [np.zeros((batch, b.mul, b.dim)) for b in ir.in2]
    gw = np.zeros((batch, ir.weight_numel))
    for p in ir.paths:
        b1, b2, bo = ir.in1[p.i_in1], ir.in2[p.i_in2], ir.out[p.i_out]
        sw, s1, s2, so = _SUBSCRIPTS[p.mode]
        c = dense_cg(p, b1.dim, b2.dim, bo.dim)
        pw, a, b, gg = _path_weights(p, w), block_view(x1, b1), block_view(x2, b2), block_view(g, bo)
        g1[p.i_in1] += np.einsum(f"{sw},ijk,{s2},{so}->{s1}", pw, c, b, gg)
        g2[p.i_in2] += np.einsum(f"{sw},ijk,{s1},{so}->{s2}", pw, c, a, gg)
        if p.has_weight:
            gw[:, p.weight_offset : p.weight_offset + p.weight_numel] = np.einsum(
                f"ijk,{s1},{s2},{so}->{sw}", c, a, b, gg
            ).reshape(batch, -1)
    gx1 = _write_blocks(ir.in1, g1, batch, ir.dim_in1)
    gx2 = _write_blocks(ir.in2, g2, batch, ir.dim_in2)
    return gx1, gx2, (gw.sum(0) if ir.shared_weights else gw)


def _degree_scale(ir: TensorProductIR, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Per-node factor of the reduction: 1 (sum) or 1 / max(in-degree, 1) (mean)."""
    if ir.reduce == "sum":
        return np.ones(num_nodes)
    return 1.0 / np.maximum(np.bincount(dst, minlength=num_nodes), 1)


def conv_reference(ir: TensorProductIR, node_features, edge_attr, weights, src, dst, num_nodes: int) -> np.ndarray:
    """Fused graph convolution, float64: ``out[dst[e]] += TP(x[src[e]], edge_attr[e], w[e])``.

    ``node_features`` ``(num_nodes, dim_in1)``, ``edge_attr`` ``(num_edges, dim_in2)``,
    ``weights`` ``(weight_numel,)`` or ``(num_edges, weight_numel)``, ``src``/``dst``
    integer ``(num_edges,)``. With ``ir.reduce == "mean"`` each node's sum is divided by
    its in-degree (nodes without in-edges get 0). Returns ``(num_nodes, dim_out)``.
    """
    x = np.asarray(node_features, dtype=np.float64)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    msgs = tensor_product_reference(ir, x[src], edge_attr, weights)
    out = np.zeros((num_nodes, ir.dim_out))
    np.add.at(out, dst, msgs)
    return out * _degree_scale(ir, dst, num_nodes)[:, None]


def conv_vjp_reference(ir: TensorProductIR, node_features, edge_attr, weights, src, dst, num_nodes: int, grad_out):
    """Gradients of ``sum(grad_out * conv(...))``: ``(grad_nodes, grad_edge_attr, grad_weights)``."""
    x = np.asarray(node_features, dtype=np.float64)
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    g = np.asarray(grad_out, dtype=np.float64) * _degree_scale(ir, dst, num_nodes)[:, None]
    gx1, gx2, gw = tensor_product_vjp_reference(ir, x[src], edge_attr, weights, g[dst])
    gx = np.zeros_like(x)
    np.add.at(gx, src, gx1)
    return gx, gx2, gw
