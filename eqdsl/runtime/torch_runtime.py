"""Glue shared by every generated ``torch_ops.py`` (no physics, no kernels).

Input checks with one clear message per mistake, the device checks (CUDA, or CPU
through Triton's interpreter; all operands of a call on one device, which the kernels
run on whatever the current CUDA device: ``triton_launch``), the autograd wiring of the
four kernel-layout ops (``register_autograd``: every derivative of every op is another of
the four, so every order of derivative works), and the ``mul_ir`` <-> ``ir_mul``
conversion done outside the ops as a differentiable gather.

Every entry point calls its operator (``define_op``: ``torch.library.Library``, public
API): torch.compile, make_fx, dispatch modes, functorch and CUDA graphs all see one op. An earlier eager fast
path called the implementations directly, which needed private torch state queries to
know when that was safe; it is gone. Checks are cached per argument metadata
(``CheckCache``, ``check_operands``): what was accepted once is not checked again; what
fails is never cached, so every error is raised as before.
"""

from __future__ import annotations

import os

from .versions import check as _check_versions

_check_versions("torch", "triton")  # Helion only where used: triton_launch._helion_kernels

import torch  # noqa: E402  (after the version check: a clear error first)

__all__ = [
    "check_inputs",
    "check_operands",
    "check_device",
    "check_same_device",
    "register_autograd",
    "LayoutPermutation",
    "permute_columns",
    "DTYPES",
    "CheckCache",
    "register_backward",
    "fused_vjp",
    "define_op",
    "register_fake",
]

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
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {_describe(t)}")
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


def register_autograd(fwd, bwd_x1, bwd_x2, bwd_w, linear=None, fused=None) -> None:
    """Wire the derivatives of ``F(x1, x2, W, g) = sum W C x1 x2 g`` to each other.

    ``fwd(x1, x2, W) = dF/dg``, ``bwd_x1(g, x2, W) = dF/dx1``, ``bwd_x2(x1, g, W) =
    dF/dx2``, ``bwd_w(x1, x2, g) = dF/dW`` (custom ops). ``F`` is linear in ``x1``,
    ``x2`` and ``g``, so the vector-Jacobian product of any of them with a cotangent
    ``h`` is again one of them with ``h`` in place of the argument it replaced; only the
    gradients autograd asks for are computed.

    Unweighted paths (weight 1) make ``F`` affine in ``W``, not linear:
    ``<h, dF/dW> = F_W(x1, x2, h, g)`` with ``F_W`` the weighted paths alone. So the
    derivatives of ``bwd_w`` call ``linear = (fwd_lin, bwd_x1_lin, bwd_x2_lin)``, the
    three operand derivatives of ``F_W`` (themselves wired the same way); without
    unweighted paths ``F_W = F`` and ``linear`` is ``None``.

    ``fused(x1, x2, W, g) = (dF/dx1, dF/dx2, dF/dW)`` (a channelwise product's fused
    backward, ``eqdsl.codegen.helion_fused``), where given, computes the forward's
    gradients whenever two or more are needed: one pass over the cotangent instead of
    one per gradient. Its own derivative is the sum of the three ops' derivatives.

    Each argument is a custom op; the formulas call the arguments.
    """

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def wire(fwd_, bwd_x1_, bwd_x2_, fused_=None):
        def fwd_backward(ctx, h):
            x1, x2, w = ctx.saved_tensors
            n1, n2, nw = ctx.needs_input_grad
            if fused_ is not None and n1 + n2 + nw >= 2:
                gx1, gx2, gw = fused_(x1, x2, w, h)
                return (gx1 if n1 else None, gx2 if n2 else None, gw if nw else None)
            return (
                bwd_x1_(h, x2, w) if n1 else None,
                bwd_x2_(x1, h, w) if n2 else None,
                bwd_w(x1, x2, h) if nw else None,
            )

        def bwd_x1_backward(ctx, h):
            g, x2, w = ctx.saved_tensors
            ng, n2, nw = ctx.needs_input_grad
            return (
                fwd_(h, x2, w) if ng else None,
                bwd_x2_(h, g, w) if n2 else None,
                bwd_w(h, x2, g) if nw else None,
            )

        def bwd_x2_backward(ctx, h):
            x1, g, w = ctx.saved_tensors
            n1, ng, nw = ctx.needs_input_grad
            return (
                bwd_x1_(g, h, w) if n1 else None,
                fwd_(x1, h, w) if ng else None,
                bwd_w(x1, h, g) if nw else None,
            )

        for op, backward in ((fwd_, fwd_backward), (bwd_x1_, bwd_x1_backward), (bwd_x2_, bwd_x2_backward)):
            register_backward(op, backward, setup_context)

    wire(fwd, bwd_x1, bwd_x2, fused)
    if linear is not None:
        wire(*linear)
    fwd_w, bwd_x1_w, bwd_x2_w = linear if linear is not None else (fwd, bwd_x1, bwd_x2)

    if fused is not None:
        def fused_backward(ctx, k1, k2, kw):
            return fused_vjp((fwd, bwd_x1, bwd_x2, bwd_w), (fwd_w, bwd_x1_w, bwd_x2_w),
                             ctx.saved_tensors, (k1, k2, kw), ctx.needs_input_grad)

        register_backward(fused, fused_backward, setup_context)

    def bwd_w_backward(ctx, h):
        x1, x2, g = ctx.saved_tensors
        n1, n2, ng = ctx.needs_input_grad
        return (
            bwd_x1_w(g, x2, h) if n1 else None,
            bwd_x2_w(x1, g, h) if n2 else None,
            fwd_w(x1, x2, h) if ng else None,
        )

    register_backward(bwd_w, bwd_w_backward, setup_context)


def fused_vjp(ops, linear, saved, cotangents, needs, extra=()):
    """Input gradients of a fused backward ``(gx1, gx2, gw) = (bwd_x1(g, x2, W),
    bwd_x2(x1, g, W), bwd_w(x1, x2, g))``: each sums the three ops' formulas.

    ``ops = (fwd, bwd_x1, bwd_x2, bwd_w)``, ``linear``: the ``*_lin`` triple (or the same
    three ops), ``saved = (x1, x2, W, g)``, ``cotangents = (k1, k2, kw)`` (None: not
    flowing), ``needs``: which of the four inputs want a gradient; ``extra``: arguments
    after the three operands of every op call (the convolution's graph and node count).
    """
    fwd, bwd_x1, bwd_x2, bwd_w = ops
    fwd_w, bwd_x1_w, bwd_x2_w = linear
    x1, x2, w, g = saved
    k1, k2, kw = cotangents
    n1, n2, nw, ng = needs[:4]

    def terms(*pairs):
        out = None
        for want, op, args in pairs:
            if want and all(a is not None for a in args):
                value = op(*args, *extra)
                out = value if out is None else out + value
        return out

    return (
        terms((n1, bwd_x1, (g, k2, w)), (n1, bwd_x1_w, (g, x2, kw))),
        terms((n2, bwd_x2, (k1, g, w)), (n2, bwd_x2_w, (x1, g, kw))),
        terms((nw, bwd_w, (k1, x2, g)), (nw, bwd_w, (x1, k2, g))),
        terms((ng, fwd, (k1, x2, w)), (ng, fwd, (x1, k2, w)), (ng, fwd_w, (x1, x2, kw))),
    )


def register_backward(op, backward, setup_context) -> None:
    """``torch.library.register_autograd`` of ``op`` (an operator of ``define_op``)."""
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=_library(op))


_LIBRARIES: dict[str, "torch.library.Library"] = {}


def _library(op) -> "torch.library.Library":
    return _LIBRARIES[op.name().split("::")[0]]


def define_op(qualname: str, impl):
    """The functional operator ``qualname`` (``"namespace::name"``) running ``impl`` on every device.

    Defined with ``torch.library.Library`` (schema inferred from ``impl``'s annotations by
    ``torch.library.infer_schema``, kernel registered as ``CompositeExplicitAutograd``):
    public API like ``torch.library.custom_op`` and seen the same way by ``torch.compile``,
    ``make_fx`` and CUDA graphs, without ``custom_op``'s Python wrappers around every call,
    whose first call in a process imports torch's compiler stack (3.9 s on the development CPU,
    4.0-4.2 s on the H100 machine's host, 2026-11-26). Pair it with ``register_fake`` and
    ``register_backward``.

    Returns:
        The operator overload ``torch.ops.<namespace>.<name>.default``.

    Raises:
        RuntimeError: ``qualname`` is defined already (a package imported twice under two
            names).
    """
    namespace, name = qualname.split("::")
    lib = _LIBRARIES.get(namespace)
    if lib is None:
        lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "DEF")
    lib.define(name + torch.library.infer_schema(impl, mutates_args=()))
    lib.impl(name, impl, "CompositeExplicitAutograd")
    return getattr(getattr(torch.ops, namespace), name).default


def register_fake(op):
    """Decorator: ``fn`` is ``op``'s fake implementation (``torch.library.register_fake``)."""

    def register(fn):
        torch.library.register_fake(op, fn, lib=_library(op))
        return fn

    return register


def check_device(op: str, device: torch.device) -> None:
    """Helion kernels run on CUDA, or on CPU through Triton's interpreter."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        from . import triton_launch  # under launch_override (eqdsl build) launches are recorded, not run

        if os.environ.get("TRITON_INTERPRET") == "1" or triton_launch.overriding():
            return
        raise RuntimeError(
            f"{op}: CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 in the environment "
            "before importing helion and the generated module (slow; meant for tests), or move the "
            "tensors to a CUDA device"
        )
    raise RuntimeError(f"{op}: unsupported device {device}; use CUDA (or CPU with TRITON_INTERPRET=1)")


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
register_fake(permute_columns)(_permute_columns_fake)


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
