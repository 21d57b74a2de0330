"""Columns of ``mul_ir`` rows in ``ir_mul`` order and back: one differentiable gather.

The fused convolution's kernels run on ``ir_mul`` rows; a ``mul_ir`` spec's ``conv``
converts its operands and its output at the boundary (``LayoutPermutation``), through one
custom op (``eqdsl_runtime::permute_columns``) whose derivative is the inverse gather, to
any order.
"""

from __future__ import annotations

import torch

from .library import define_op, register_backward, register_fake

__all__ = ["LayoutPermutation", "permute_columns"]

_PERMUTATIONS: dict[str, "LayoutPermutation"] = {}


def _permute_columns(x: torch.Tensor, key: str, to_ir_mul: bool) -> torch.Tensor:
    """``x`` with its columns in the other layout (``LayoutPermutation`` ``key``): one gather.

    A custom op (``permute_columns``), so that tracing (``make_fx``, ``torch.compile``)
    records one node and never sees the cached index tensors, which only eager code creates.
    """
    return torch.index_select(x, 1, _PERMUTATIONS[key].index(to_ir_mul, x.device))


def _permute_columns_fake(x: torch.Tensor, key: str, to_ir_mul: bool) -> torch.Tensor:
    return x.new_empty(x.shape)


permute_columns = define_op("eqdsl_runtime::permute_columns", _permute_columns)
register_fake(permute_columns, _permute_columns_fake)


def _permute_columns_setup(ctx, inputs, output):
    ctx.key, ctx.to_ir_mul = inputs[1], inputs[2]


def _permute_columns_backward(ctx, grad):
    # the derivative of a gather by a permutation is the inverse gather (not an index_add)
    return permute_columns(grad, ctx.key, not ctx.to_ir_mul), None, None


register_backward(permute_columns, _permute_columns_backward, _permute_columns_setup)


class LayoutPermutation:
    """Column permutations between ``mul_ir`` and ``ir_mul`` rows of one irreps.

    ``key`` names it (unique per generated operand, e.g. ``"eqdsl_foo.in1"``);
    ``blocks`` is ``((mul, 2l+1), ...)``. Each conversion is one gather (read and write
    the whole operand once), the ``eqdsl_runtime::permute_columns`` op, and so is its
    derivative (the inverse gather), to any order. Index tensors are built in eager
    code only and cached per device.
    """

    def __init__(self, key: str, blocks: tuple[tuple[int, int], ...]):
        gather = []  # ir_mul position -> mul_ir position
        off = 0
        for mul, dim in blocks:
            gather += [off + u * dim + m for m in range(dim) for u in range(mul)]
            off += mul * dim
        inverse = [0] * len(gather)
        for dst, src in enumerate(gather):
            inverse[src] = dst
        self.key = key
        self.blocks = tuple(blocks)
        self._lists = {True: gather, False: inverse}
        self._cache: dict[tuple[bool, torch.device], torch.Tensor] = {}
        _PERMUTATIONS[key] = self

    def index(self, to_ir_mul: bool, device: torch.device) -> torch.Tensor:
        """Gather index (``ir_mul`` column -> ``mul_ir`` column when ``to_ir_mul``, else the inverse)."""
        idx = self._cache.get((to_ir_mul, device))
        if idx is None:
            idx = torch.tensor(self._lists[to_ir_mul], dtype=torch.long, device=device)
            self._cache[(to_ir_mul, device)] = idx
        return idx

    def to_ir_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s rows in ``ir_mul``."""
        return permute_columns(x, self.key, True)

    def to_mul_ir(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s rows in ``mul_ir``."""
        return permute_columns(x, self.key, False)
