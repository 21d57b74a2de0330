"""``TensorProductOps``: the custom ops of one generated tensor product, bound to its kernels.

A generated ``torch_ops.py`` defines its kernel launchers (``_launch_fwd(x1, x2, weights,
out)``, ...: each calls the generated kernels of one op on contiguous rows) and hands its
metadata and its namespace to ``TensorProductOps``, which defines the ops, their fake
implementations and their autograd formulas, and checks the arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .autograd import register_autograd
from .checks import CheckCache, check_device, check_inputs, check_operands
from .library import define_op, register_fake

__all__ = ["TensorProductOps", "FusedBackward"]


@dataclass(frozen=True)
class FusedBackward:
    """What the outputs of a channelwise product's fused backward kernels need.

    Attributes:
        partials: rows of ``dF/dx2`` partial sums the kernels write per batch row (one per
            kernel or channel tile, summed by the op; 1: written directly).
        zero_gx1: some ``x1`` columns are written by no kernel (zero-filled first).
        zero_gx2: some ``x2`` columns are written by no kernel (zero-filled first).
    """

    partials: int = 1
    zero_gx1: bool = False
    zero_gx2: bool = False


# op -> (argument names, the operand each one is: its row width key, None for the weights),
# output width key; the operand letters as in F(x1, x2, W, g)
_BLOCK_OPS = {
    "fwd": (("x1", "x2", "weights"), "dim_out"),
    "bwd_x1": (("g", "x2", "weights"), "dim_in1"),
    "bwd_x2": (("x1", "g", "weights"), "dim_in2"),
}
_WIDTH = {"x1": "dim_in1", "x2": "dim_in2", "g": "dim_out", "weights": None}


class TensorProductOps:
    """The kernel-layout custom ops of one generated tensor product and its ``tensor_product``.

    Defines, in namespace ``namespace`` (``torch.ops.<namespace>``), the ops ``fwd(x1, x2,
    weights) -> out``, ``bwd_x1(g, x2, weights) -> dF/dx1``, ``bwd_x2(x1, g, weights) ->
    dF/dx2``, ``bwd_w(x1, x2, g) -> dF/dW`` (summed over the batch if the weights are
    shared), with ``linear`` also ``fwd_lin``, ``bwd_x1_lin``, ``bwd_x2_lin`` (the weighted
    paths only), with ``fused`` also ``bwd(x1, x2, weights, g) -> (dF/dx1, dF/dx2, dF/dW)``;
    each with a fake implementation and an autograd formula made of the others
    (``autograd.register_autograd``). Rows are ``(batch, width)`` in the kernels' layout.

    Args:
        namespace: the ops' namespace (``eqdsl_<name>``).
        launchers: where ``_launch_<op>`` is looked up at every call (the generated module's
            ``globals()``, so that tools and tests can replace a launcher): ``_launch_<op>(
            *operands, *outputs)`` runs the op's kernels on contiguous rows of a non-empty
            batch. An op without one (``bwd_w`` when no path has a weight) returns zeros.
        dim_in1, dim_in2, dim_out, weight_numel: row widths of ``x1``, ``x2``, ``out``, weights.
        shared_weights: weights ``(weight_numel,)`` (True) or ``(batch, weight_numel)``.
        dtypes: the float dtypes the kernels were generated for.
        linear: the ``*_lin`` ops exist (some paths are unweighted).
        fused: the fused backward's outputs, or None when there is none.
        wsum_rows: with shared weights, batch rows per partial-sum row of ``bwd_w``.
        zero_fill_w: some weight columns are written by no kernel (a path whose
            coefficients are all zero): its gradient outputs are zero-filled first.

    Attributes:
        impls: ``{op name: implementation}``, what each operator runs (tests call them directly).
        ops: ``{op name: operator}`` (``torch.ops.<namespace>.<op>.default``).
    """

    def __init__(self, namespace: str, launchers: Mapping[str, Callable], *, dim_in1: int, dim_in2: int,
                 dim_out: int, weight_numel: int, shared_weights: bool, dtypes: tuple[torch.dtype, ...],
                 linear: bool = False, fused: FusedBackward | None = None, wsum_rows: int | None = None,
                 zero_fill_w: bool = False):
        if shared_weights and wsum_rows is None:
            raise ValueError(f"{namespace}: shared weights need wsum_rows")
        self.namespace = namespace
        self._launchers = launchers
        self.dims = {"dim_in1": dim_in1, "dim_in2": dim_in2, "dim_out": dim_out}
        self.weight_numel = weight_numel
        self.shared_weights = shared_weights
        self.dtypes = tuple(dtypes)
        self.wsum_rows = wsum_rows
        self.zero_fill_w = zero_fill_w
        self.fused = fused
        names = ["fwd", "bwd_x1", "bwd_x2"]
        self.ops, self.impls = {}, {}
        for name in names + ([n + "_lin" for n in names] if linear else []):
            self.ops[name] = self._define_block_op(name)
        self.ops["bwd_w"] = self._define("bwd_w", ("x1", "x2", "g"), "Tensor", self._bwd_w, self._bwd_w_fake)
        if fused is not None:
            self.ops["bwd"] = self._define("bwd", ("x1", "x2", "weights", "g"), "(Tensor, Tensor, Tensor)", self._bwd,
                                           self._bwd_fake)
        lin = tuple(self.ops[n + "_lin"] for n in names) if linear else None
        register_autograd(*(self.ops[n] for n in names), self.ops["bwd_w"], linear=lin, fused=self.ops.get("bwd"))
        self._fwd = self.ops["fwd"]
        self._checked = CheckCache(self.check)  # check once per accepted argument metadata

    # ------------------------------------------------------------------ entry point

    def check(self, x1, x2, weights) -> None:
        """Check a ``tensor_product`` call (``checks.check_inputs``): ``TypeError`` /
        ``ValueError`` naming the argument."""
        check_inputs(self.namespace + ".tensor_product", x1, x2, weights, dim_in1=self.dims["dim_in1"],
                     dim_in2=self.dims["dim_in2"], weight_numel=self.weight_numel,
                     shared_weights=self.shared_weights, dtypes=self.dtypes)

    def tensor_product(self, x1: torch.Tensor, x2: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``out = TP(x1, x2, weights)``: the checked ``fwd`` op (the generated module's
        ``tensor_product`` documents shapes and errors)."""
        # the cached check under torch.compile would trace its set lookups: the plain one there
        (self.check if torch.compiler.is_compiling() else self._checked)(x1, x2, weights)
        return self._fwd(x1, x2, weights)

    # ------------------------------------------------------------------ the ops

    def _define(self, name, args, returns, impl, fake):
        op = define_op(f"{self.namespace}::{name}", impl,
                       schema="(" + ", ".join(f"Tensor {a}" for a in args) + ") -> " + returns)
        register_fake(op, fake)
        self.impls[name] = impl
        return op

    def _operands(self, names, tensors):
        return tuple((n, t, None if _WIDTH[n] is None else self.dims[_WIDTH[n]]) for n, t in zip(names, tensors))

    def _check(self, name, names, tensors) -> None:
        check_operands(f"{self.namespace}::{name}", self._operands(names, tensors), weight_numel=self.weight_numel,
                       shared_weights=self.shared_weights, dtypes=self.dtypes)

    def _check_run(self, name, names, tensors) -> None:
        """The operands' checks, then a device the kernels run on."""
        self._check(name, names, tensors)
        check_device(f"{self.namespace}::{name}", tensors[0].device)

    def _alloc(self, like: torch.Tensor, zero: bool, shape) -> torch.Tensor:
        return like.new_zeros(shape) if zero else like.new_empty(shape)

    def _define_block_op(self, name: str):
        """``fwd``, ``bwd_x1``, ``bwd_x2`` or a ``*_lin`` op: one output row per batch row."""
        names, out = _BLOCK_OPS[name.removesuffix("_lin")]
        width = self.dims[out]
        launcher, qual = "_launch_" + name, f"{self.namespace}::{name}"
        (n0, w0), (n1, w1), (n2, w2) = ((n, None if _WIDTH[n] is None else self.dims[_WIDTH[n]]) for n in names)
        launchers, meta = self._launchers, {"weight_numel": self.weight_numel,
                                            "shared_weights": self.shared_weights, "dtypes": self.dtypes}

        # the hot path of every call: the operand tuples spelled out, no helper frames
        def impl(a, b, c):
            check_operands(qual, ((n0, a, w0), (n1, b, w1), (n2, c, w2)), **meta)
            check_device(qual, a.device)
            result = a.new_empty((a.shape[0], width))
            if a.shape[0] > 0:
                launchers[launcher](a.contiguous(), b.contiguous(), c.contiguous(), result)
            return result

        def fake(a, b, c):
            check_operands(qual, ((n0, a, w0), (n1, b, w1), (n2, c, w2)), **meta)
            return a.new_empty((a.shape[0], width))

        return self._define(name, names, "Tensor", impl, fake)

    def _gw_shape(self, x1):
        return (self.weight_numel,) if self.shared_weights else (x1.shape[0], self.weight_numel)

    def _bwd_w(self, x1, x2, g):
        """``dF/dW (x1, x2, g)``: summed over the batch if the weights are shared (per-program
        partial sums, then their sum: deterministic), else one row per batch element."""
        self._check_run("bwd_w", ("x1", "x2", "g"), (x1, x2, g))
        launch = self._launchers.get("_launch_bwd_w")
        batch = x1.shape[0]
        if launch is None or batch == 0:  # no weight has a nonzero coefficient, or no rows
            return x1.new_zeros(self._gw_shape(x1))
        if self.shared_weights:
            gw = self._alloc(x1, self.zero_fill_w, ((batch + self.wsum_rows - 1) // self.wsum_rows, self.weight_numel))
            launch(x1.contiguous(), x2.contiguous(), g.contiguous(), gw)
            return gw.sum(0)
        gw = self._alloc(x1, self.zero_fill_w, (batch, self.weight_numel))
        launch(x1.contiguous(), x2.contiguous(), g.contiguous(), gw)
        return gw

    def _bwd_w_fake(self, x1, x2, g):
        self._check("bwd_w", ("x1", "x2", "g"), (x1, x2, g))
        return x1.new_empty(self._gw_shape(x1))

    def _bwd(self, x1, x2, weights, g):
        """``(dF/dx1, dF/dx2, dF/dW)`` at ``(x1, x2, weights, g)`` from the fused kernels (one
        read of ``g``): what ``bwd_x1``, ``bwd_x2`` and ``bwd_w`` return."""
        self._check_run("bwd", ("x1", "x2", "weights", "g"), (x1, x2, weights, g))
        f, batch = self.fused, x1.shape[0]
        dim_in2 = self.dims["dim_in2"]
        gx1 = self._alloc(x1, f.zero_gx1, (batch, self.dims["dim_in1"]))
        gw = self._alloc(x1, self.zero_fill_w, (batch, self.weight_numel))
        # with partials: dF/dx2 partial sums, one row per kernel or channel tile, summed here (no atomics)
        gx2 = self._alloc(x1, f.zero_gx2, (batch, f.partials * dim_in2))
        if batch > 0:
            self._launchers["_launch_bwd"](x1.contiguous(), x2.contiguous(), weights.contiguous(), g.contiguous(),
                                           gx1, gx2, gw)
        if f.partials > 1:
            gx2 = gx2.view(batch, f.partials, dim_in2).sum(1)
        return gx1, gx2, gw

    def _bwd_fake(self, x1, x2, weights, g):
        self._check("bwd", ("x1", "x2", "weights", "g"), (x1, x2, weights, g))
        batch = x1.shape[0]
        return (x1.new_empty((batch, self.dims["dim_in1"])), x1.new_empty((batch, self.dims["dim_in2"])),
                x1.new_empty((batch, self.weight_numel)))
