"""JAX: a generated tensor product as plain functions, for flax, equinox or bare JAX.

A framework's module keeps the weights as a parameter and calls these pure functions
(``examples/flax_tp.py``, ``examples/equinox_tp.py``)::

    pkg = eqdsl.load(spec)                       # the generated package (static)
    w = eqdsl.jax.init(key, pkg)                 # (weight_numel,), standard normal as e3nn
    out = eqdsl.jax.apply(pkg, w, x1, x2)        # jax_ops.tensor_product, batch dims broadcast
    out = eqdsl.jax.conv(pkg, w_edges, h, sh, src, dst, num_nodes)   # conv = true specs
    out = eqdsl.jax.conv_radial(pkg, w_last, hidden, h, sh, src, dst, num_nodes)  # radial_features = H

``pkg`` is a generated package module (hashable, so it can be a static field of an
equinox module or an attribute of a flax module), or anything ``eqdsl.load`` takes.
Everything is traceable: ``jax.jit``, ``jax.grad`` (reverse mode to any order), ``jax.vmap``.
"""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp

from .loader import load

__all__ = ["init", "apply", "conv", "conv_radial", "package"]


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


def conv_radial(spec_or_module, radial_weight: jax.Array, radial_features: jax.Array, node_features: jax.Array,
                edge_attr: jax.Array, src: jax.Array, dst: jax.Array, num_nodes: int) -> jax.Array:
    """The fused graph convolution with per-edge weights ``radial_features @ radial_weight``
    formed on chip (``jax_ops.conv_radial`` of a spec with ``radial_features = H``).

    Equal to ``conv(spec_or_module, radial_features @ radial_weight, node_features,
    edge_attr, src, dst, num_nodes)``. radial_weight ``(H, weight_numel)``: a radial MLP's
    last, bias-free linear layer as a matrix (its normalization applied by the caller),
    columns in e3nn's weight order; radial_features ``(num_edges, H)``: that MLP's hidden
    features per edge; the rest as :func:`conv`. Differentiable in reverse mode to any
    order with respect to all four arrays.

    Raises:
        ValueError: the spec has no ``radial_features``; bad arrays (from the generated
            function, which names the argument).
    """
    pkg = package(spec_or_module)
    if getattr(pkg, "RADIAL_FEATURES", None) is None:
        raise ValueError(f"eqdsl.jax.conv_radial: the spec of {pkg.__name__} has no radial_features")
    return pkg.jax_ops.conv_radial(node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes)
