"""``ConvColumns``: the ``mul_ir`` <-> ``ir_mul`` column permutations around the conv's kernels.

The generated conv kernels of a ``mul_ir`` product run on ``ir_mul`` rows, as the torch
conv's do (``eqdsl.runtime.torch.conv.ColumnPermutation``): read in place, a ``mul_ir``
block is one tile split into its components on chip, and in a segment program that split
is a layout conversion through shared memory per component and loop step (84 per step in
nequip_toluene's float64 forward, counted in the Triton GPU IR). The conv permutes its node
features (and edge attributes where their layouts differ) once, and its output back: a
gather of node rows each, against every edge's tiles split in the kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..layout import inverse_order, ir_mul_order, layouts_differ

__all__ = ["ConvColumns", "permute_columns"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def permute_columns(rows, order: tuple[int, ...], inverse: tuple[int, ...]):
    """``rows[:, order]`` for ``rows`` ``(n, len(order))``; ``inverse``: ``order``'s inverse, the
    VJP's permutation (a gather again, not the scatter-add JAX would transpose a gather into).
    Differentiable to any order in reverse mode. One gather of the rows: measured faster than
    per-block reshapes and transposes (H200, 2026-11-29, bulk Si float64 conv fwd / fwd+bwd:
    nequip_toluene 1,533 / 4,357 against 1,700 / 4,723 µs, mace_large 1,993 / 6,269 against
    2,216 / 6,717; the kernels alone 1,370 / 4,151 and 1,783 / 5,791).

    Raises:
        ValueError: ``rows`` is not ``(n, len(order))``.
    """
    if rows.ndim != 2 or rows.shape[1] != len(order):
        raise ValueError(f"permute_columns: rows of shape {tuple(rows.shape)}, expected (n, {len(order)})")
    return jnp.take(rows, np.asarray(order, np.int32), axis=1)


def _permute_fwd(rows, order, inverse):
    return permute_columns(rows, order, inverse), None


def _permute_bwd(order, inverse, _, g):
    return (permute_columns(g, inverse, order),)


permute_columns.defvjp(_permute_fwd, _permute_bwd)


@dataclass(frozen=True)
class ConvColumns:
    """The column orders of the conv's operands, ``None`` where ``mul_ir`` and ``ir_mul`` agree.

    Attributes:
        in1, in2, out: ``layout.ir_mul_order`` of the node features (``x1``), the edge
            attributes (``x2``) and the output (``out``, ``g``) blocks.
    """

    in1: tuple[int, ...] | None
    in2: tuple[int, ...] | None
    out: tuple[int, ...] | None

    @classmethod
    def of(cls, in1: Sequence[tuple[int, int]], in2: Sequence[tuple[int, int]],
           out: Sequence[tuple[int, int]]) -> "ConvColumns":
        """From the ``(mul, 2l+1)`` blocks of ``x1``, ``x2`` and the output."""
        return cls(*(ir_mul_order(b) if layouts_differ(b) else None for b in (in1, in2, out)))

    def to_kernels(self, x, y):
        """``x`` ``(nodes, dim_in1)`` and ``y`` ``(edges, dim_in2)`` from ``mul_ir`` to ``ir_mul`` columns."""
        return _apply(x, self.in1), _apply(y, self.in2)

    def from_kernels(self, out):
        """The kernels' ``ir_mul`` output ``(nodes, dim_out)`` in ``mul_ir`` columns."""
        return _apply(out, self.out, inverse=True)


def _apply(rows, order, inverse: bool = False):
    """``rows`` permuted by ``order`` (by its inverse with ``inverse``); as they are for None."""
    if order is None:
        return rows
    inv = inverse_order(order)
    return permute_columns(rows, inv, order) if inverse else permute_columns(rows, order, inv)
