#!/usr/bin/env python3
"""A generated tensor product as an equinox module: weights a leaf, the package static.

The product is the one of an e3nn-jax ``FunctionalTensorProduct`` (a channelwise ``uvu``
product with shared weights); its spec comes from ``eqdsl.spec_from_e3nn_jax``, and
``eqdsl.jax.init`` / ``eqdsl.jax.apply`` do the rest. The output is checked against
e3nn-jax with the same weights, then a few ``eqx.filter_jit`` gradient steps run. On a CPU
in seconds (Pallas in interpret mode)::

    pip install equinox && python examples/equinox_tp.py
"""

from __future__ import annotations

from types import ModuleType

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from e3nn_jax import IrrepsArray
from e3nn_jax.legacy import FunctionalTensorProduct

import eqdsl
import eqdsl.jax


class TensorProduct(eqx.Module):
    """``x1 (..., dim_in1), x2 (..., dim_in2) -> (..., dim_out)`` with learned shared weights."""

    weight: jax.Array
    package: ModuleType = eqx.field(static=True)

    def __init__(self, package: ModuleType, key: jax.Array):
        self.package = package
        self.weight = eqdsl.jax.init(key, package)

    def __call__(self, x1, x2):
        return eqdsl.jax.apply(self.package, self.weight, x1, x2)


def main() -> None:
    e3nn_tp = FunctionalTensorProduct("4x0e+4x1o", "0e+1o", "4x0e+4x1o+4x1o+4x0e",
                                      [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True),
                                       (1, 0, 2, "uvu", True), (1, 1, 3, "uvu", True)])
    pkg = eqdsl.load(eqdsl.spec_from_e3nn_jax(e3nn_tp, "equinox_example_tp", dtypes=["float32"]))

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    x1 = jax.random.normal(k1, (16, pkg.DIM_IN1))
    x2 = jax.random.normal(k2, (16, pkg.DIM_IN2))
    model = TensorProduct(pkg, k3)
    out = eqx.filter_jit(lambda m, a, b: m(a, b))(model, x1, x2)

    ref = jax.vmap(lambda a, b: e3nn_tp.left_right(model.weight, IrrepsArray(e3nn_tp.irreps_in1, a),
                                                   IrrepsArray(e3nn_tp.irreps_in2, b)).array)(x1, x2)
    err = float(jnp.abs(out - ref).max() / jnp.abs(ref).max())
    print(f"output {out.shape}, relative difference to e3nn-jax {err:.1e}")
    assert err < 1e-5, err

    @eqx.filter_jit
    def step(model, x1, x2, target):
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((m(x1, x2) - target) ** 2))(model)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, model, grads), loss

    target = jnp.zeros_like(out)
    losses = []
    for _ in range(3):
        model, loss = step(model, x1, x2, target)
        losses.append(float(loss))
    print("loss over 3 steps:", " ".join(f"{x:.4f}" for x in losses))
    assert np.all(np.diff(losses) < 0), losses


if __name__ == "__main__":
    main()
