"""Column orders of irreps rows, for the convolutions' kernels that run on ``ir_mul`` rows.

A block ``mul x (2l+1)`` at column ``offset`` holds channel ``u``, component ``m`` at
``offset + u * (2l+1) + m`` in ``mul_ir`` (e3nn's order) and at ``offset + m * mul + u`` in
``ir_mul`` (cuEquivariance's). Pure Python: the torch and JAX runtimes build their index
arrays from these, and the generators ask ``layouts_differ`` whether an operand needs one.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["ir_mul_order", "inverse_order", "layouts_differ"]


def ir_mul_order(blocks: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The ``mul_ir`` column of each ``ir_mul`` column of rows of ``blocks``.

    Args:
        blocks: ``((mul, 2l+1), ...)`` per irreps block, in row order.

    Returns:
        ``order`` with ``rows_ir_mul = rows_mul_ir[:, order]`` (a permutation of
        ``range(sum(mul * dim))``).
    """
    order: list[int] = []
    off = 0
    for mul, dim in blocks:
        order += [off + u * dim + m for m in range(dim) for u in range(mul)]
        off += mul * dim
    return tuple(order)


def inverse_order(order: Sequence[int]) -> tuple[int, ...]:
    """``inv`` with ``rows[:, order][:, inv] == rows``."""
    inv = [0] * len(order)
    for dst, src in enumerate(order):
        inv[src] = dst
    return tuple(inv)


def layouts_differ(blocks: Sequence[tuple[int, int]]) -> bool:
    """Whether ``mul_ir`` and ``ir_mul`` rows of ``blocks`` differ: some block has several
    channels and several components."""
    return any(mul > 1 and dim > 1 for mul, dim in blocks)
