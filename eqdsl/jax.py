"""JAX: a generated tensor product as plain functions, for flax, equinox or bare JAX.

A framework's module keeps the weights as a parameter and calls these pure functions
(``examples/flax_tp.py``, ``examples/equinox_tp.py``)::

    pkg = eqdsl.load(spec)                       # the generated package (static)
    w = eqdsl.jax.init(key, pkg)                 # (weight_numel,), standard normal as e3nn
    out = eqdsl.jax.apply(pkg, w, x1, x2)        # jax_ops.tensor_product, batch dims broadcast
    out = eqdsl.jax.conv(pkg, w_edges, h, sh, src, dst, num_nodes)   # conv = true specs

``pkg`` is a generated package module (hashable, so it can be a static field of an
equinox module or an attribute of a flax module), or anything ``eqdsl.load`` takes.
Everything is traceable: ``jax.jit``, ``jax.grad`` (reverse mode to any order), ``jax.vmap``.
"""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp

from .loader import load

__all__ = ["init", "apply", "conv", "package"]


def package(spec_or_module) -> ModuleType:
    """The generated package: ``spec_or_module`` itself if it is one, else ``eqdsl.load`` of it."""
    if isinstance(spec_or_module, ModuleType):
        if not hasattr(spec_or_module, "WEIGHT_NUMEL"):
            raise TypeError(f"{spec_or_module.__name__} is not a generated eqdsl package (no WEIGHT_NUMEL)")
        return spec_or_module
    return load(spec_or_module)


def init(key: jax.Array, spec_or_module, *, dtype=jnp.float32) -> jax.Array:
    """Shared weights ``(weight_numel,)`` drawn from the standard normal (e3nn's init).

    Raises ``ValueError`` for a spec with per-row weights (``shared_weights = false``):
    those come from the model (e.g. a radial network per edge), not from an init.
    """
    pkg = package(spec_or_module)
    if not pkg.SHARED_WEIGHTS:
        raise ValueError(f"eqdsl.jax.init: {pkg.__name__} has per-row weights (shared_weights = false); "
                         "they are computed by the model, not initialized here")
    return jax.random.normal(key, (pkg.WEIGHT_NUMEL,), dtype=dtype)


def apply(spec_or_module, weights: jax.Array, x1: jax.Array, x2: jax.Array) -> jax.Array:
    """``TP(x1, x2, weights)`` with the package's Pallas kernels.

    Args:
        spec_or_module: the generated package (or what ``eqdsl.load`` takes).
        weights: ``(weight_numel,)`` if shared, else ``(..., weight_numel)``.
        x1: ``(..., dim_in1)``; x2: ``(..., dim_in2)``, in the spec's layout. Leading
            dimensions broadcast (as ``e3nn.o3.TensorProduct``).

    Returns:
        ``(..., dim_out)`` in the inputs' dtype (one of the spec's dtypes).
    """
    pkg = package(spec_or_module)
    shapes = [x1.shape[:-1], x2.shape[:-1]] + ([] if pkg.SHARED_WEIGHTS else [weights.shape[:-1]])
    lead = jnp.broadcast_shapes(*shapes)

    def flat(t, dim):
        return jnp.broadcast_to(t, (*lead, dim)).reshape(-1, dim)

    w = weights if pkg.SHARED_WEIGHTS else flat(weights, pkg.WEIGHT_NUMEL)
    out = pkg.jax_ops.tensor_product(flat(x1, pkg.DIM_IN1), flat(x2, pkg.DIM_IN2), w)
    return out.reshape(*lead, pkg.DIM_OUT)


def conv(spec_or_module, weights: jax.Array, node_features: jax.Array, edge_attr: jax.Array, src: jax.Array,
         dst: jax.Array, num_nodes: int) -> jax.Array:
    """The fused graph convolution of a ``conv = true`` spec (``jax_ops.conv``):
    ``out[dst[e]] += TP(node_features[src[e]], edge_attr[e], weights[e])``.

    Shapes: node_features ``(num_nodes, dim_in1)``, edge_attr ``(num_edges, dim_in2)``,
    weights ``(weight_numel,)`` or ``(num_edges, weight_numel)``, src / dst integer
    ``(num_edges,)``, ``num_nodes`` a Python int (static). Returns ``(num_nodes, dim_out)``.
    Raises ``ValueError`` if the spec has no ``conv = true``.
    """
    pkg = package(spec_or_module)
    if not pkg.CONV:
        raise ValueError(f"eqdsl.jax.conv: the spec of {pkg.__name__} has no conv = true")
    return pkg.jax_ops.conv(node_features, edge_attr, weights, src, dst, num_nodes)
