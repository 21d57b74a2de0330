"""Argument checks of the generated JAX entry points: one ``TypeError`` / ``ValueError``
naming the argument per mistake, at trace time under ``jax.jit`` (static shapes and dtypes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["as_array", "check_inputs", "check_grad_out", "check_block_batch", "check_conv_inputs",
           "check_conv_radial_inputs"]


def as_array(x, name: str):
    if isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "shape") and hasattr(x, "dtype"):
        return x if isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) else jnp.asarray(x)
    raise TypeError(f"{name} must be an array, got {type(x).__name__}")


def check_inputs(x1, x2, weights, *, dim_in1: int, dim_in2: int, weight_numel: int, shared_weights: bool,
                 dtypes: tuple[str, ...]):
    """Check shapes and dtypes (``ValueError`` / ``TypeError`` naming the argument)."""
    x1, x2, weights = as_array(x1, "x1"), as_array(x2, "x2"), as_array(weights, "weights")
    for name, x, dim in (("x1", x1, dim_in1), ("x2", x2, dim_in2)):
        if x.ndim != 2 or x.shape[1] != dim:
            raise ValueError(f"{name} must have shape (batch, {dim}), got {tuple(x.shape)}")
    batch = x1.shape[0]
    if x2.shape[0] != batch:
        raise ValueError(f"x2 has batch size {x2.shape[0]} but x1 has {batch}")
    want = (weight_numel,) if shared_weights else (batch, weight_numel)
    if tuple(weights.shape) != want:
        kind = "shared weights" if shared_weights else "per-batch weights"
        raise ValueError(f"weights ({kind}) must have shape {want}, got {tuple(weights.shape)}")
    for name, x in (("x1", x1), ("x2", x2), ("weights", weights)):
        if str(x.dtype) not in dtypes:
            raise TypeError(f"{name} has dtype {x.dtype}; this tensor product supports {', '.join(dtypes)}")
    if not x1.dtype == x2.dtype == weights.dtype:
        raise TypeError(f"x1, x2 and weights must have one dtype, got {x1.dtype}, {x2.dtype}, {weights.dtype}")
    return x1, x2, weights


def check_grad_out(grad_out, *, batch: int, dim_out: int, dtype):
    """Check the output cotangent of an explicit ``tensor_product_vjp`` call."""
    grad_out = as_array(grad_out, "grad_out")
    if tuple(grad_out.shape) != (batch, dim_out):
        raise ValueError(f"grad_out must have shape ({batch}, {dim_out}), got {tuple(grad_out.shape)}")
    if grad_out.dtype != dtype:
        raise TypeError(f"grad_out has dtype {grad_out.dtype} but x1 has {dtype}")
    return grad_out


def check_block_batch(block_batch: int | None, default: int) -> int:
    if block_batch is None:
        return default
    if not isinstance(block_batch, int) or block_batch < 1 or block_batch & (block_batch - 1):
        raise ValueError(f"block_batch must be a positive power of two, got {block_batch!r}")
    return block_batch


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_conv_inputs(node_features, edge_attr, weights, src, dst, num_nodes, *, dim_in1: int, dim_in2: int,
                      weight_numel: int, shared_weights: bool, dtypes: tuple[str, ...], check: bool = True):
    """Check a conv call; ``ValueError`` / ``TypeError`` naming the argument.

    Always (also under ``jax.jit``, at trace time): ``num_nodes`` a non-negative Python
    int equal to ``node_features.shape[0]``; shapes ``(num_nodes, dim_in1)``,
    ``(num_edges, dim_in2)``, weights ``(num_edges, numel)`` or ``(numel,)`` if shared;
    ``src``/``dst`` integer ``(num_edges,)``; float dtypes of the spec, one dtype.
    With ``check`` and concrete (non-traced) ``src``/``dst``: every index in
    ``[0, num_nodes)`` (one device-to-host copy of the indices; pass ``check=False`` in
    hot loops). Traced indices cannot be checked: out-of-range edges are dropped.
    """
    num_nodes, x, y, src, dst = _check_graph(node_features, edge_attr, src, dst, num_nodes, dim_in1, dim_in2)
    w = as_array(weights, "weights")
    num_edges = y.shape[0]
    want = (weight_numel,) if shared_weights else (num_edges, weight_numel)
    if tuple(w.shape) != want:
        kind = "shared weights" if shared_weights else "per-edge weights"
        raise ValueError(f"weights ({kind}) must have shape {want}, got {tuple(w.shape)}")
    _check_dtypes((("node_features", x), ("edge_attr", y), ("weights", w)), dtypes)
    _check_indices(src, dst, num_nodes, num_edges, check)
    return x, y, w, src, dst, num_nodes


def check_conv_radial_inputs(node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes, *,
                             dim_in1: int, dim_in2: int, weight_numel: int, radial: int, dtypes: tuple[str, ...],
                             check: bool = True):
    """Check a ``conv_radial`` call: as ``check_conv_inputs``, with ``radial_features``
    ``(num_edges, radial)`` and ``radial_weight`` ``(radial, weight_numel)`` in place of the
    weights (``radial`` = H, the spec's ``radial_features``), every array of one float dtype
    of the spec. ``ValueError`` / ``TypeError`` naming the argument."""
    num_nodes, x, y, src, dst = _check_graph(node_features, edge_attr, src, dst, num_nodes, dim_in1, dim_in2)
    rf, wr = as_array(radial_features, "radial_features"), as_array(radial_weight, "radial_weight")
    num_edges = y.shape[0]
    if tuple(rf.shape) != (num_edges, radial):
        raise ValueError(f"radial_features must have shape (num_edges, H) = ({num_edges}, {radial}), "
                         f"got {tuple(rf.shape)}")
    if tuple(wr.shape) != (radial, weight_numel):
        raise ValueError(f"radial_weight must have shape (H, weight_numel) = ({radial}, {weight_numel}), "
                         f"got {tuple(wr.shape)}")
    _check_dtypes((("node_features", x), ("edge_attr", y), ("radial_features", rf), ("radial_weight", wr)), dtypes)
    _check_indices(src, dst, num_nodes, num_edges, check)
    return x, y, rf, wr, src, dst, num_nodes


def _check_graph(node_features, edge_attr, src, dst, num_nodes, dim_in1: int, dim_in2: int):
    """``num_nodes``, the node and edge rows and the index arrays of a conv call (shapes)."""
    if isinstance(num_nodes, (bool, np.bool_)) or not isinstance(num_nodes, (int, np.integer)):
        raise TypeError(f"num_nodes must be a Python int (static), got {type(num_nodes).__name__}")
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    x = as_array(node_features, "node_features")
    y = as_array(edge_attr, "edge_attr")
    src, dst = as_array(src, "src"), as_array(dst, "dst")
    if x.ndim != 2 or x.shape[1] != dim_in1:
        raise ValueError(f"node_features must have shape (num_nodes, {dim_in1}), got {tuple(x.shape)}")
    if x.shape[0] != num_nodes:
        raise ValueError(f"num_nodes={num_nodes} but node_features has {x.shape[0]} rows; they must match")
    if y.ndim != 2 or y.shape[1] != dim_in2:
        raise ValueError(f"edge_attr must have shape (num_edges, {dim_in2}), got {tuple(y.shape)}")
    num_edges = y.shape[0]
    for name, idx in (("src", src), ("dst", dst)):
        if not jnp.issubdtype(idx.dtype, jnp.integer):
            raise TypeError(f"{name} must be an integer index array, got dtype {idx.dtype}")
        if tuple(idx.shape) != (num_edges,):
            raise ValueError(f"{name} must have shape (num_edges,) = ({num_edges},) like edge_attr, "
                             f"got {tuple(idx.shape)}")
    return num_nodes, x, y, src, dst


def _check_dtypes(named, dtypes: tuple[str, ...]) -> None:
    """Every array of ``named`` (``(name, array)`` pairs) of one dtype of ``dtypes``."""
    for name, a in named:
        if str(a.dtype) not in dtypes:
            raise TypeError(f"{name} has dtype {a.dtype}; this tensor product supports {', '.join(dtypes)}")
    if len({a.dtype for _, a in named}) > 1:
        names = ", ".join(n for n, _ in named[:-1]) + " and " + named[-1][0]
        raise TypeError(f"{names} must have one dtype, got {', '.join(str(a.dtype) for _, a in named)}")


def _check_indices(src, dst, num_nodes: int, num_edges: int, check: bool) -> None:
    """With ``check``: every concrete index in ``[0, num_nodes)``."""
    if check and num_edges:
        for name, idx in (("src", src), ("dst", dst)):
            if _is_concrete(idx):
                v = np.asarray(idx)
                lo, hi = int(v.min()), int(v.max())
                if lo < 0 or hi >= num_nodes:
                    bad = lo if lo < 0 else hi
                    raise ValueError(f"{name} holds index {bad}, out of range for num_nodes={num_nodes}")
