"""Row padding and weight operands: the batch padded to the kernels' block (``pad_rows``),
user weights as the kernels' weight operand and back (``kernel_weights``, ``user_weights``),
and bucket sizes for batches and graphs whose size changes every step (``bucket``,
``pad_graph``: few distinct shapes, hence few compilations)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["round_up", "bucket", "pad_rows", "kernel_weights", "user_weights", "PaddedGraph", "pad_graph"]


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def bucket(n: int, minimum: int = 64) -> int:
    """A bucket size >= ``n``: powers of two up to 65536, then multiples of 65536.

    Padding a varying batch (edge count) to ``bucket(n)`` bounds the number of distinct
    shapes, hence compilations, at a cost of less than 2x (small) or 65536 rows (large).
    """
    if n <= minimum:
        return minimum
    if n <= 65536:
        return 1 << (n - 1).bit_length()
    return round_up(n, 65536)


def pad_rows(x, rows: int):
    """``x`` ``(batch, width)`` zero padded to ``rows >= batch`` rows (no copy if equal)."""
    return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def kernel_weights(w, numel: int, shared: bool, rows: int):
    """User weights (e3nn order: ``(numel,)`` shared, ``(batch, numel)`` per row) -> the
    kernels' weight operand ``(1 | rows, max(numel, 1))``: the same columns (the kernels
    read e3nn's order in place), rows padded; one zero column when no path is weighted
    (a Pallas operand cannot be empty)."""
    n = 1 if shared else rows
    if numel == 0:
        return jnp.zeros((n, 1), w.dtype)
    return w.reshape(1, numel) if shared else pad_rows(w, rows)


def user_weights(gw, numel: int, shared: bool, batch: int):
    """Inverse of ``kernel_weights`` for a weight gradient: ``(numel,)`` if shared else
    ``(batch, numel)``."""
    y = gw[: 1 if shared else batch, :numel]
    return y.reshape(numel) if shared else y


class PaddedGraph(NamedTuple):
    """A graph padded to bucket sizes by ``pad_graph`` (see there)."""

    node_features: jax.Array
    edge_attr: jax.Array
    weights: jax.Array
    src: jax.Array
    dst: jax.Array
    num_nodes: int
    num_real_nodes: int
    num_real_edges: int
    node_mask: jax.Array
    edge_mask: jax.Array


def pad_graph(node_features, edge_attr, weights, src, dst, num_nodes: int, *, shared_weights: bool,
              min_nodes: int = 16, min_edges: int = 64) -> PaddedGraph:
    """Pad a graph to bucket sizes so that ``jax.jit``-compiled code sees few shapes.

    Nodes are padded to ``bucket(num_nodes + 1, min_nodes)`` rows (at least one dummy
    node), edges to ``bucket(num_edges, min_edges)`` (powers of two up to 65536, then
    multiples of 65536: less than 2x the work, a handful of distinct shapes over a
    whole MD run). Padded nodes have zero features; padded edges point from and to the
    last (dummy) node and carry zero ``edge_attr`` and zero weights, so the rows of the
    real nodes of ``conv(...)`` and all gradients with respect to real inputs are
    unchanged (also with ``reduce = "mean"``: only the dummy node's degree changes).
    Take ``out[:num_real_nodes]`` or multiply by ``node_mask``. Call it outside ``jit``
    (the sizes are Python ints)."""
    n, e = int(num_nodes), int(np.shape(src)[0])
    n_pad, e_pad = bucket(n + 1, min_nodes), bucket(e, min_edges)
    dummy = n_pad - 1
    arrays = (node_features, edge_attr, weights, src, dst)
    # host arrays are padded with numpy: eager jnp ops would compile once per input shape
    xp = jnp if any(isinstance(a, jax.Array) for a in arrays) else np
    x = xp.pad(xp.asarray(node_features), ((0, n_pad - n), (0, 0)))
    y = xp.pad(xp.asarray(edge_attr), ((0, e_pad - e), (0, 0)))
    w = xp.asarray(weights)
    if not shared_weights:
        w = xp.pad(w, ((0, e_pad - e), (0, 0)))
    s, d = xp.asarray(src), xp.asarray(dst)
    if not np.issubdtype(s.dtype, np.integer) or not np.issubdtype(d.dtype, np.integer):
        raise TypeError(f"src and dst must be integer index arrays, got dtypes {s.dtype}, {d.dtype}")
    s = xp.pad(s, (0, e_pad - e), constant_values=dummy)
    d = xp.pad(d, (0, e_pad - e), constant_values=dummy)
    return PaddedGraph(x, y, w, s, d, n_pad, n, e, np.arange(n_pad) < n, np.arange(e_pad) < e)
