"""The conv's ``mul_ir`` <-> ``ir_mul`` column permutations (``eqdsl.runtime.layout``,
``eqdsl.runtime.jax.columns``) and the generated conv kernels that rely on them."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from eqdsl.runtime.jax.columns import ConvColumns, permute_columns
from eqdsl.runtime.layout import inverse_order, ir_mul_order, layouts_differ

jax.config.update("jax_enable_x64", True)

BLOCKS = ((3, 1), (2, 3), (1, 5), (4, 5))


def _ir_mul_by_reshape(rows: np.ndarray, blocks) -> np.ndarray:
    """e3nn's definition: a ``mul_ir`` block is ``(mul, 2l+1)`` row-major, ``ir_mul`` its transpose."""
    out, off = [], 0
    for mul, dim in blocks:
        out.append(rows[:, off:off + mul * dim].reshape(-1, mul, dim).transpose(0, 2, 1).reshape(-1, mul * dim))
        off += mul * dim
    return np.concatenate(out, axis=1)


def test_ir_mul_order_is_the_blockwise_transpose():
    rows = np.random.default_rng(0).standard_normal((5, sum(m * d for m, d in BLOCKS)))
    order = ir_mul_order(BLOCKS)
    np.testing.assert_array_equal(rows[:, list(order)], _ir_mul_by_reshape(rows, BLOCKS))
    np.testing.assert_array_equal(rows[:, list(order)][:, list(inverse_order(order))], rows)
    cols = ConvColumns.of(BLOCKS, BLOCKS, BLOCKS)
    there = np.asarray(cols.to_kernels(jnp.asarray(rows), jnp.asarray(rows))[0])
    np.testing.assert_array_equal(there, _ir_mul_by_reshape(rows, BLOCKS))
    np.testing.assert_array_equal(np.asarray(cols.from_kernels(jnp.asarray(there))), rows)
    assert layouts_differ(BLOCKS) and not layouts_differ(((1, 3), (4, 1)))


def test_conv_columns_skip_operands_whose_layouts_agree():
    cols = ConvColumns.of(BLOCKS, ((1, 1), (1, 3)), ((2, 3),))
    assert cols.in1 == ir_mul_order(BLOCKS) and cols.in2 is None and cols.out == ir_mul_order(((2, 3),))
    x, y = jnp.ones((2, 34)), jnp.arange(8.0).reshape(2, 4)
    assert cols.to_kernels(x, y)[1] is y
    with pytest.raises(ValueError, match=r"expected \(n, 34\)"):
        cols.to_kernels(jnp.ones((2, 30)), y)


def test_permute_columns_gradients_to_second_order():
    order = ir_mul_order(BLOCKS)
    rows = jax.random.normal(jax.random.key(1), (4, len(order)), jnp.float64)
    weights = jax.random.normal(jax.random.key(2), (4, len(order)), jnp.float64)

    def f(r):  # nonlinear, so the second derivative goes through the permutation's VJP again
        return jnp.sum(jnp.sin(permute_columns(r, order, inverse_order(order))) * weights)

    check_grads(f, (rows,), order=2, modes=["rev"])
    g = jax.grad(f)(rows)
    np.testing.assert_allclose(np.asarray(g)[:, list(order)], np.cos(np.asarray(rows)[:, list(order)]) * weights)


@pytest.mark.parametrize("package", ["nequip_water", "nequip_toluene", "mace_large"])
def test_mul_ir_conv_kernels_read_ir_mul_rows(package):
    """The committed mul_ir conv packages: the conv's Pallas kernels load no mul_ir tile (no
    on-chip split), and the module hands the runtime its blocks to permute."""
    import importlib

    ops = importlib.import_module(f"generated.{package}.jax_ops")
    k = ops._kernels
    sets = [v for name, v in vars(k).items() if name.startswith("CONV_") and name.endswith("_KERNELS")]
    assert sets
    for kernels in sets:
        for entry in kernels:
            src = inspect.getsource(entry[0])
            assert "rt.load_tile" not in src and "rt.store_tile" not in src, entry[0].__name__
    assert ops._FUNCTIONS._conv_columns is not None and ops._FUNCTIONS._conv_columns.in1 is not None
