"""Glue shared by every generated ``torch_ops.py`` (no physics, no kernels).

Input checks with one clear message per mistake, the device check (CUDA, or CPU
through Triton's interpreter), and the ``mul_ir`` <-> ``ir_mul`` conversion done at the
op boundary.
"""

from __future__ import annotations

import os

import torch

__all__ = ["check_inputs", "check_device", "LayoutPermutation", "DTYPES"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"tensor of shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"
    return f"{type(t).__name__}"


def check_inputs(
    op: str,
    x1,
    x2,
    weights,
    *,
    dim_in1: int,
    dim_in2: int,
    weight_numel: int,
    shared_weights: bool,
    dtypes: tuple[torch.dtype, ...],
) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming the argument, expected and got."""
    args = (("x1", x1), ("x2", x2), ("weights", weights))
    for name, t in args:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {_describe(t)}")
    allowed = ", ".join(str(d) for d in dtypes)
    for name, t in args:
        if t.dtype not in dtypes:
            raise TypeError(f"{op}: {name} must have dtype in ({allowed}), got {t.dtype}")
    if not (x1.dtype == x2.dtype == weights.dtype):
        raise TypeError(
            f"{op}: x1, x2 and weights must share one dtype, got {x1.dtype}, {x2.dtype}, {weights.dtype}"
        )
    if x1.dim() != 2 or x1.shape[1] != dim_in1:
        raise ValueError(f"{op}: x1 must have shape (batch, {dim_in1}), got {tuple(x1.shape)}")
    batch = x1.shape[0]
    if x2.dim() != 2 or x2.shape[1] != dim_in2 or x2.shape[0] != batch:
        raise ValueError(f"{op}: x2 must have shape ({batch}, {dim_in2}) like x1's batch, got {tuple(x2.shape)}")
    if shared_weights:
        if weights.dim() != 1 or weights.shape[0] != weight_numel:
            raise ValueError(
                f"{op}: weights are shared: expected shape ({weight_numel},), got {tuple(weights.shape)}"
            )
    elif weights.dim() != 2 or weights.shape[1] != weight_numel or weights.shape[0] != batch:
        raise ValueError(
            f"{op}: weights are per batch element: expected shape ({batch}, {weight_numel}), "
            f"got {tuple(weights.shape)}"
        )
    if not (x1.device == x2.device == weights.device):
        raise ValueError(
            f"{op}: x1, x2 and weights must be on one device, got {x1.device}, {x2.device}, {weights.device}"
        )


def check_device(op: str, device: torch.device) -> None:
    """Helion kernels run on CUDA, or on CPU through Triton's interpreter."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return
        raise RuntimeError(
            f"{op}: CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 in the environment "
            "before importing helion and the generated module (slow; meant for tests), or move the "
            "tensors to a CUDA device"
        )
    raise RuntimeError(f"{op}: unsupported device {device}; use CUDA (or CPU with TRITON_INTERPRET=1)")


class LayoutPermutation:
    """Column permutations between ``mul_ir`` and ``ir_mul`` rows of one irreps.

    ``blocks`` is ``((mul, 2l+1), ...)``. Each conversion is one ``index_select``
    (a gather: read and write the whole operand once); index tensors are cached per
    device.
    """

    def __init__(self, blocks: tuple[tuple[int, int], ...]):
        gather = []  # ir_mul position -> mul_ir position
        off = 0
        for mul, dim in blocks:
            gather += [off + u * dim + m for m in range(dim) for u in range(mul)]
            off += mul * dim
        inverse = [0] * len(gather)
        for dst, src in enumerate(gather):
            inverse[src] = dst
        self._to_ir_mul = gather
        self._to_mul_ir = inverse
        self._cache: dict[tuple[str, torch.device], torch.Tensor] = {}

    def _index(self, which: str, device: torch.device) -> torch.Tensor:
        key = (which, device)
        idx = self._cache.get(key)
        if idx is None:
            idx = torch.tensor(getattr(self, "_" + which), dtype=torch.long, device=device)
            self._cache[key] = idx
        return idx

    def to_ir_mul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 1, self._index("to_ir_mul", x.device))

    def to_mul_ir(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 1, self._index("to_mul_ir", x.device))
