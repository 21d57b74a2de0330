#!/usr/bin/env python3
"""A generated tensor product inside a flax (linen) model: init, jit, a gradient step.

The product is the one of an e3nn-jax ``FunctionalFullyConnectedTensorProduct``; its spec
comes from ``eqdsl.spec_from_e3nn_jax``, ``eqdsl.load`` generates and imports it (cached in
``~/.cache/eqdsl``), and ``eqdsl.jax.init`` / ``eqdsl.jax.apply`` are the parameter init and
the call. The output is checked against e3nn-jax with the same weights. Runs on a CPU in
seconds (Pallas in interpret mode)::

    pip install flax && python examples/flax_tp.py
"""

from __future__ import annotations

from types import ModuleType

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from e3nn_jax import IrrepsArray
from e3nn_jax.legacy import FunctionalFullyConnectedTensorProduct

import eqdsl
import eqdsl.jax


class TensorProduct(nn.Module):
    """``x1 (batch, dim_in1), x2 (batch, dim_in2) -> (batch, dim_out)`` with learned shared weights."""

    package: ModuleType  # the generated package: static, hashable

    @nn.compact
    def __call__(self, x1, x2):
        w = self.param("weight", lambda key: eqdsl.jax.init(key, self.package, dtype=x1.dtype))
        return eqdsl.jax.apply(self.package, w, x1, x2)


def main() -> None:
    e3nn_tp = FunctionalFullyConnectedTensorProduct("4x0e+2x1o", "0e+1o", "4x0e+2x1o")
    pkg = eqdsl.load(eqdsl.spec_from_e3nn_jax(e3nn_tp, "flax_example_tp", dtypes=["float32"]))

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    x1 = jax.random.normal(k1, (16, pkg.DIM_IN1))
    x2 = jax.random.normal(k2, (16, pkg.DIM_IN2))
    model = TensorProduct(pkg)
    params = model.init(k3, x1, x2)
    out = jax.jit(model.apply)(params, x1, x2)

    w = params["params"]["weight"]
    ref = jax.vmap(lambda a, b: e3nn_tp.left_right(w, IrrepsArray(e3nn_tp.irreps_in1, a),
                                                   IrrepsArray(e3nn_tp.irreps_in2, b)).array)(x1, x2)
    err = float(jnp.abs(out - ref).max() / jnp.abs(ref).max())
    print(f"output {out.shape}, relative difference to e3nn-jax {err:.1e}")
    assert err < 1e-5, err

    @jax.jit
    def step(params, x1, x2, target):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x1, x2) - target) ** 2))(params)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss

    target = jnp.zeros_like(out)
    losses = []
    for _ in range(3):
        params, loss = step(params, x1, x2, target)
        losses.append(float(loss))
    print("loss over 3 steps:", " ".join(f"{x:.4f}" for x in losses))
    assert np.all(np.diff(losses) < 0), losses


if __name__ == "__main__":
    main()
