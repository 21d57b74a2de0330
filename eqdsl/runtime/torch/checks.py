"""Argument checks of the generated torch ops: one clear message per mistake.

``check_inputs`` checks a ``tensor_product`` call, ``check_operands`` the operands of one
kernel-layout op (``fwd``, ``bwd_x1``, ...), ``check_same_device`` that a call's tensors
share one device (the kernels run on their tensors' device whatever the current CUDA
device: ``eqdsl.runtime.triton_launch``), ``check_device`` that the kernels can run there
(CUDA, or CPU through Triton's interpreter). Checks are cached per argument metadata
(``CheckCache``, ``check_operands``): what was accepted once is not checked again; what
fails is never cached, so every error is raised as before.
"""

from __future__ import annotations

import os

import torch

from .. import triton_launch

__all__ = ["check_inputs", "check_operands", "check_device", "check_same_device", "CheckCache", "describe"]


def describe(t) -> str:
    """What ``t`` is, for an error message: a tensor's shape, dtype and device, else its type."""
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
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {describe(t)}")
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
    check_same_device(op, ("x1", "x2", "weights"), (x1, x2, weights))


def check_same_device(op: str, names: tuple[str, ...], tensors: tuple) -> None:
    """Raise ``ValueError`` unless ``tensors`` (named ``names``, one name each) are on one
    device; the message names each argument and its device.

    The kernels run on their tensors' device whatever the current CUDA device
    (``eqdsl.runtime.triton_launch``), so all operands of one call must be there: x1 on
    ``cuda:0`` with weights on ``cuda:1``, or CPU tensors with CUDA ones, are refused
    before any launch, as torch's own ops refuse them. ~0.1 us per tensor.
    """
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            listed = ", ".join(names[:-1]) + " and " + names[-1]
            got = ", ".join(f"{name} on {t.device}" for name, t in zip(names, tensors))
            raise ValueError(f"{op}: {listed} must be on one device, got {got}")


# operand metadata check_operands accepted, per op (the op name fixes the widths: torch
# registers one definition per name)
_OPERANDS_OK: set = set()
_CACHE_LIMIT = 1024  # MD sees a new batch size every step: emptied past this size


def check_operands(
    op: str,
    operands: tuple[tuple[str, object, int | None], ...],
    *,
    weight_numel: int,
    shared_weights: bool,
    dtypes: tuple[torch.dtype, ...],
) -> None:
    """Checks of a kernel-layout op's arguments (``ir_mul`` rows, one dtype, one device).

    ``operands`` is ``((name, tensor, width), ...)`` with ``width`` the row length of a
    ``(batch, width)`` operand, or ``None`` for weights (``(weight_numel,)`` when
    shared, else ``(batch, weight_numel)``). Raises ``TypeError`` / ``ValueError``.
    ``op`` names one op (fixed widths, weight_numel, dtypes): accepted metadata of plain
    tensors is remembered and not checked again.
    """
    key = _meta_key((op, *[t for _, t, _ in operands]))
    if key is not None and key in _OPERANDS_OK:
        return
    _check_operands(op, operands, weight_numel=weight_numel, shared_weights=shared_weights, dtypes=dtypes)
    if key is not None:
        if len(_OPERANDS_OK) >= _CACHE_LIMIT:
            _OPERANDS_OK.clear()
        _OPERANDS_OK.add(key)


def _check_operands(op, operands, *, weight_numel, shared_weights, dtypes) -> None:
    for name, t, _ in operands:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {describe(t)}")
    first = operands[0][1]
    for name, t, _ in operands:
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d) for d in dtypes)
            raise TypeError(f"{op}: {name} must have dtype in ({allowed}), got {t.dtype}")
        if t.dtype != first.dtype:
            raise TypeError(f"{op}: all operands must share one dtype, got {name} {t.dtype} and {first.dtype}")
    check_same_device(op, tuple([name for name, _, _ in operands]), tuple([t for _, t, _ in operands]))
    batch = first.shape[0] if first.dim() >= 1 else None
    for name, t, width in operands:
        if width is None:
            want = (weight_numel,) if shared_weights else (batch, weight_numel)
        else:
            want = (batch, width)
        if tuple(t.shape) != want:
            raise ValueError(f"{op}: {name} must have shape {want}, got {tuple(t.shape)}")


_PLAIN = (torch.Tensor, torch.nn.Parameter)

_NOT_CACHEABLE = object()
_SCALARS = (int, str)  # not bool: a check may reject it


def _meta_key(args: tuple):
    """What a check of ``args`` depends on (shape, dtype, device of plain tensors; the
    value of strings and ints), or None when an argument is anything else (a tensor
    subclass, a fake tensor with symbolic sizes, a wrong type): checked every time."""
    key = tuple(
        [
            (a.shape, a.dtype, a.device)
            if type(a) in _PLAIN
            else (a if type(a) in _SCALARS else _NOT_CACHEABLE)
            for a in args
        ]
    )
    return None if _NOT_CACHEABLE in key else key


class CheckCache:
    """``check(*args)`` (raises on bad arguments) run once per argument metadata it accepted.

    The check must depend only on what ``_meta_key`` records; arguments it cannot record
    are checked on every call, and a failing check is never remembered.
    """

    def __init__(self, check):
        self.check = check
        self._ok: set = set()

    def __call__(self, *args) -> None:
        key = _meta_key(args)
        if key is not None and key in self._ok:
            return
        self.check(*args)
        if key is not None:
            if len(self._ok) >= _CACHE_LIMIT:
                self._ok.clear()
            self._ok.add(key)


def check_device(op: str, device: torch.device) -> None:
    """Helion kernels run on CUDA, or on CPU through Triton's interpreter."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        # under triton_launch.launch_override (eqdsl build) launches are recorded, not run
        if os.environ.get("TRITON_INTERPRET") == "1" or triton_launch.overriding():
            return
        raise RuntimeError(
            f"{op}: CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 in the environment "
            "before importing helion and the generated module (slow; meant for tests), or move the "
            "tensors to a CUDA device"
        )
    raise RuntimeError(f"{op}: unsupported device {device}; use CUDA (or CPU with TRITON_INTERPRET=1)")


