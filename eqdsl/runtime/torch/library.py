"""Custom operators of the generated packages, defined with ``torch.library.Library`` (public API).

Every entry point of a generated module calls its operator: ``torch.compile``, ``make_fx``,
dispatch modes, functorch and CUDA graphs all see one op. One ``Library`` per namespace
(``eqdsl_<name>``, one per generated package) holds the definitions, their fake
implementations and their autograd formulas.
"""

from __future__ import annotations

import torch

__all__ = ["define_op", "register_fake", "register_backward"]

_LIBRARIES: dict[str, "torch.library.Library"] = {}


def _library(op) -> "torch.library.Library":
    return _LIBRARIES[op.name().split("::")[0]]


def define_op(qualname: str, impl, *, schema: str | None = None):
    """The functional operator ``qualname`` (``"namespace::name"``) running ``impl`` on every device.

    Defined with ``torch.library.Library`` (kernel registered as ``CompositeExplicitAutograd``):
    public API like ``torch.library.custom_op`` and seen the same way by ``torch.compile``,
    ``make_fx`` and CUDA graphs, without ``custom_op``'s Python wrappers around every call,
    whose first call in a process imports torch's compiler stack (3.9 s on the development CPU,
    4.0-4.2 s on the H100 machine's host, 2026-11-26). Pair it with ``register_fake`` and
    ``register_backward``.

    Args:
        qualname: ``"namespace::name"``.
        impl: the implementation, called with the operator's arguments in schema order.
        schema: the argument list and return, e.g. ``"(Tensor x1, Tensor x2) -> Tensor"``;
            default: inferred from ``impl``'s annotations (``torch.library.infer_schema``).

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
    lib.define(name + (schema if schema is not None else torch.library.infer_schema(impl, mutates_args=())))
    lib.impl(name, impl, "CompositeExplicitAutograd")
    return getattr(getattr(torch.ops, namespace), name).default


def register_fake(op, fn) -> None:
    """``fn`` is ``op``'s fake implementation (``torch.library.register_fake``): output
    shapes and dtypes from input metadata, for tracing (``op`` from ``define_op``)."""
    torch.library.register_fake(op, fn, lib=_library(op))


def register_backward(op, backward, setup_context) -> None:
    """``torch.library.register_autograd`` of ``op`` (an operator of ``define_op``)."""
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=_library(op))
