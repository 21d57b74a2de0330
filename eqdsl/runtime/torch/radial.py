"""``RadialConvOps``: ``conv_radial``, the fused graph convolution given the radial MLP's last layer.

``conv_radial(x, y, rf, Wr, src, dst, num_nodes) = conv(x, y, rf @ Wr, src, dst, num_nodes)``
with ``rf`` (num_edges, H) the radial MLP's last hidden features and ``Wr`` (H,
weight_numel) its last (bias-free) linear layer: the generated kernels form each tile of
per-edge weights on chip (``rf_tile @ Wr[:, cols]``), so the (num_edges, weight_numel)
weights never reach memory (``eqdsl/backends/helion/conv.py``).

Four custom ops beside the convolution's (``ConvOps``), each the conv op of the same name
at ``W = rf @ Wr``::

    conv_radial_fwd(x, y, rf, Wr, graph..., num_nodes)   = conv_fwd(x, y, W, ...)
    conv_radial_bwd_x(G, y, rf, Wr, graph..., num_nodes) = conv_bwd_x(G, y, W, ...)
    conv_radial_bwd_y(x, G, rf, Wr, graph..., num_nodes) = conv_bwd_y(x, G, W, ...)
    conv_radial_bwd(x, y, rf, Wr, G, graph..., num_nodes) = conv_bwd(x, y, W, G, ...)  (fused backward, if any)

Autodiff. Their derivatives with respect to ``x``, ``y`` and ``G`` are the other radial ops
(as for the conv, ``autograd``); with respect to ``(rf, Wr)`` they go through the weight
cotangent, which is always ``gw = conv_bwd_w(...)`` (it does not read ``W``: fwd
``bwd_w(x, y, G)``, bwd_x with cotangent ``h``: ``bwd_w(h, y, G)``, bwd_y: ``bwd_w(x, h, G)``),
then ``d rf = gw @ Wr.T`` and ``d Wr = rf.T @ gw``. Every formula is made of these ops,
``conv_bwd_w`` and matmuls, all differentiable, so gradients of every order work.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from .checks import CheckCache
from .conv import ConvFusedBackward, ConvOps, graph_args
from .library import define_op, register_backward, register_fake

__all__ = ["RadialConvOps", "register_radial_autograd"]

# op -> (argument names before radial_features / radial_weight, "node" or "edge" rows, output width key)
_OPS = {
    "fwd": (("x", "y"), "node", "dim_out"),
    "bwd_x": (("g", "y"), "node", "dim_in1"),
    "bwd_y": (("x", "g"), "edge", "dim_in2"),
}
_RADIAL = ("radial_features", "radial_weight")


class RadialConvOps:
    """The ``conv_radial`` ops of one generated convolution and ``conv_radial`` itself.

    Args:
        conv: the convolution's ``ConvOps`` (its ops, graph tensors, checks and layouts).
        launchers: where ``_launch_radial_<op>`` is looked up at every call (the generated
            module's ``globals()``): ``(*operands, radial_features, radial_weight, *outputs,
            src, dst[, order, ptr])`` on contiguous ``ir_mul`` rows (each op converts a ``mul_ir``
            spec's operands and results: ``ConvOps.to_kernel`` / ``from_kernel``). An op without one forms
            ``W = rf @ Wr`` with a matmul and runs the conv op (its kernels read weight tiles
            of several channel axes, which one on-chip product cannot form:
            ``eqdsl.backends.helion.conv.radial_kernel_context``).
        radial_features: H, the width of ``radial_features``.
        segment: ``{op: position of its sort order in the graph}`` of the radial ops whose
            node scatter is a segment reduction (``deterministic = true``, or tuned ``segment
            = 1``: on a graph of fewer than ``segment_min_edges`` edges, which is not sorted,
            their launchers run atomic kernels).
        fused: the fused radial backward's outputs, or None.
        materialize_bwd: without ``fused``, the ``bwd`` op is the conv's fused backward at
            ``W = rf @ Wr`` (spec ``materialize = 1`` in ``conv_radial_bwd``'s sub-table).

    Attributes:
        ops: ``{op name: operator}`` (``"fwd"`` is ``torch.ops.<namespace>.conv_radial_fwd.default``).
        impls: ``{op name: implementation}``.
        fused_ops: the names of the ops with kernels of their own (the others materialize ``W``).
        composed: no op has kernels of its own (``materialize = 1`` in every radial op's
            sub-table, or weight tiles no on-chip product forms): ``conv_radial`` is
            ``conv(x, y, rf @ Wr)`` itself, so that autograd keeps ``W`` for the backward as the
            unfused path does instead of forming it again (one matmul: mace_large's forward +
            backward on bulk Si took 6,710 µs through the radial ops against 5,641 for the
            composition, H100, 2026-11-27).
    """

    def __init__(self, conv: ConvOps, launchers: Mapping[str, Callable], *, radial_features: int,
                 segment: Mapping[str, int] | None = None, fused: ConvFusedBackward | None = None,
                 materialize_bwd: bool = False):
        self.conv = conv
        self.namespace = conv.namespace
        self.h = radial_features
        self._launchers = launchers
        self.segment = dict(segment or {})
        self.fused = fused
        self.fused_ops = tuple(n for n in ("fwd", "bwd_x", "bwd_y", "bwd") if "_launch_radial_" + n in launchers)
        self.composed = not self.fused_ops
        self.ops, self.impls = {}, {}
        for name in _OPS:
            self.ops[name] = self._define_operand_op(name)
        if materialize_bwd and (fused is not None or "bwd" not in conv.impls):
            raise ValueError(f"{self.namespace}: materialize_bwd needs the conv's fused backward and no radial one")
        if fused is not None or materialize_bwd:
            impl = self._bwd if fused is not None else self._bwd_materialized
            self.ops["bwd"] = self._define("bwd", ("x", "y", *_RADIAL, "g"), "(Tensor, Tensor, Tensor)",
                                           impl, self._bwd_fake)
        register_radial_autograd(self.ops, conv.ops, graph=len(conv.graph_names))
        self._checked = CheckCache(self.check)

    # ------------------------------------------------------------------ entry point

    def check(self, node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes) -> None:
        """One clear ``TypeError`` / ``ValueError`` per mistake, naming the argument (no device sync)."""
        weights = (("radial_features", radial_features), ("radial_weight", radial_weight))
        edges = self.conv.check_arguments("conv_radial", node_features, edge_attr, weights, src, dst, num_nodes)
        h, numel = self.h, self.conv.weight_numel
        if radial_features.dim() != 2 or tuple(radial_features.shape) != (edges, h):
            raise ValueError(f"{self.namespace}.conv_radial: radial_features must have shape ({edges}, {h}) "
                             f"(num_edges, radial_features of the spec), got {tuple(radial_features.shape)}")
        if radial_weight.dim() != 2 or tuple(radial_weight.shape) != (h, numel):
            raise ValueError(f"{self.namespace}.conv_radial: radial_weight must have shape ({h}, {numel}) "
                             f"(radial_features, weight_numel), got {tuple(radial_weight.shape)}")

    def conv_radial(self, node_features: torch.Tensor, edge_attr: torch.Tensor, radial_features: torch.Tensor,
                    radial_weight: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_nodes: int, *,
                    check: bool = True) -> torch.Tensor:
        """``conv(node_features, edge_attr, radial_features @ radial_weight, src, dst, num_nodes)``.

        Differentiable to any order with respect to all four tensors. ``check``, devices,
        layouts and the ``mean`` reduce: as ``ConvOps.conv``.

        Raises:
            TypeError, ValueError: a bad argument (named).
            RuntimeError: a device the kernels cannot run on.
        """
        (self.check if torch.compiler.is_compiling() else self._checked)(
            node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes)
        if self.composed:
            return self.conv.conv(node_features, edge_attr, radial_features @ radial_weight, src, dst, num_nodes,
                                  check=check)
        graph = self.conv.prepare(src, dst, num_nodes, check)
        out = self.ops["fwd"](node_features, edge_attr, radial_features, radial_weight, *graph, num_nodes)
        return self.conv.finish(out, graph, num_nodes)

    # ------------------------------------------------------------------ the ops

    def _define(self, name, args, returns, impl, fake):
        arglist = ", ".join(f"Tensor {a}" for a in args + self.conv.graph_names)
        op = define_op(f"{self.namespace}::conv_radial_{name}", impl,
                       schema=f"({arglist}, SymInt num_nodes) -> {returns}")
        register_fake(op, fake)
        self.impls[name] = impl
        return op

    def _define_operand_op(self, name: str):
        first, kind, out = _OPS[name]
        names = first + _RADIAL
        width = self.conv.dims[out]
        order = self.segment.get(name)
        conv_impl = self.conv.impls[name]

        def impl(a, b, rf, wr, *rest):
            *graph, num_nodes = rest
            launch = self._launchers.get("_launch_radial_" + name)
            if launch is None:  # no kernels of its own: the weights materialized, the conv op
                self.conv.check_op("radial_" + name, names, (a, b, rf, wr, *graph), run=False)
                return conv_impl(a, b, rf @ wr, *graph, num_nodes)
            self.conv.check_op("radial_" + name, names, (a, b, rf, wr, *graph))
            edges = graph[0].shape[0]
            # atomics add into zeros; a segment op on a sorted graph writes every node row itself
            # (a graph of fewer than segment_min_edges edges is not sorted: its atomic kernels)
            segment = order is not None and graph[order].numel() > 0
            if kind == "edge":
                result = a.new_empty((edges, width))
            else:
                result = a.new_empty((num_nodes, width)) if segment else a.new_zeros((num_nodes, width))
            if edges > 0 and (kind == "edge" or num_nodes > 0):
                launch(self.conv.to_kernel(first[0], a).contiguous(), self.conv.to_kernel(first[1], b).contiguous(),
                       rf.contiguous(), wr.contiguous(), result, *graph_args(graph, order))
            elif kind == "node" and segment:
                result.zero_()
            return self.conv.from_kernel(out, result)

        def fake(a, b, rf, wr, *rest):
            *graph, num_nodes = rest
            self.conv.check_op("radial_" + name, names, (a, b, rf, wr, *graph), run=False)
            return a.new_empty((num_nodes if kind == "node" else graph[0].shape[0], width))

        return self._define(name, names, "Tensor", impl, fake)

    def _bwd(self, x, y, rf, wr, g, *rest):
        """``(dF/dx, dF/dy, dF/dW)`` at ``W = rf @ wr`` from the fused radial kernels: what
        ``conv_radial_bwd_x``, ``conv_radial_bwd_y`` and ``conv_bwd_w`` return."""
        *graph, num_nodes = rest
        self.conv.check_op("radial_bwd", ("x", "y", *_RADIAL, "g"), (x, y, rf, wr, g, *graph))
        f, edges, dim_in2 = self.fused, graph[0].shape[0], self.conv.dims["dim_in2"]
        gx = x.new_zeros((num_nodes, self.conv.dims["dim_in1"]))  # scattered into with atomics
        gw = x.new_zeros((edges, self.conv.weight_numel)) if self.conv.zero_fill_w else \
            x.new_empty((edges, self.conv.weight_numel))
        gy = x.new_zeros((edges, f.partials * dim_in2)) if f.zero_gy else x.new_empty((edges, f.partials * dim_in2))
        if edges > 0:
            self._launchers["_launch_radial_bwd"](self.conv.to_kernel("x", x).contiguous(),
                                                  self.conv.to_kernel("y", y).contiguous(), rf.contiguous(),
                                                  wr.contiguous(), self.conv.to_kernel("g", g).contiguous(), gx, gy, gw,
                                                  *graph_args(graph, None))
        if f.partials > 1:
            gy = gy.view(edges, f.partials, dim_in2).sum(1)
        return self.conv.from_kernel("dim_in1", gx), self.conv.from_kernel("dim_in2", gy), gw

    def _bwd_materialized(self, x, y, rf, wr, g, *rest):
        """``(dF/dx, dF/dy, dF/dW)`` at ``W = rf @ wr``: the matmul, then the conv's fused backward."""
        *graph, num_nodes = rest
        self.conv.check_op("radial_bwd", ("x", "y", *_RADIAL, "g"), (x, y, rf, wr, g, *graph), run=False)
        return self.conv.impls["bwd"](x, y, rf @ wr, g, *graph, num_nodes)

    def _bwd_fake(self, x, y, rf, wr, g, *rest):
        *graph, num_nodes = rest
        self.conv.check_op("radial_bwd", ("x", "y", *_RADIAL, "g"), (x, y, rf, wr, g, *graph), run=False)
        edges = graph[0].shape[0]
        return (x.new_empty((num_nodes, self.conv.dims["dim_in1"])), x.new_empty((edges, self.conv.dims["dim_in2"])),
                x.new_empty((edges, self.conv.weight_numel)))


def register_radial_autograd(radial: Mapping, conv: Mapping, *, graph: int) -> None:
    """Wire the derivatives of the radial ops (module docstring).

    ``radial``: ``{"fwd", "bwd_x", "bwd_y"[, "bwd"]}`` radial operators, ``conv``: the
    convolution's (``"fwd"``, ``"bwd_x"``, ``"bwd_y"``, ``"bwd_w"``: a weight cotangent of
    the fused backward's ``dF/dW`` output takes the weights' place in the conv ops; every
    path is weighted, so ``F`` is linear in ``W``). ``graph``: the graph tensors every op
    takes after its operands, then ``num_nodes``. Only the gradients autograd asks for are
    computed; ``(rf, Wr)`` share one ``conv_bwd_w`` call.
    """
    fwd, bwd_x, bwd_y, fused = radial["fwd"], radial["bwd_x"], radial["bwd_y"], radial.get("bwd")
    bwd_w = conv["bwd_w"]
    tail = (None,) * (graph + 1)

    def setup(n_operands):
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs[:n_operands + graph])
            ctx.num_nodes = inputs[n_operands + graph]
            ctx.n_operands = n_operands

        return setup_context

    def unpack(ctx):
        saved = ctx.saved_tensors
        return saved[:ctx.n_operands], (*saved[ctx.n_operands:], ctx.num_nodes)

    def radial_grads(gw, rf, wr, needs):
        """``(d rf, d Wr)`` from the weight cotangent ``gw`` (E, weight_numel)."""
        if gw is None:
            return None, None
        return (gw @ wr.transpose(0, 1) if needs[0] else None, rf.transpose(0, 1) @ gw if needs[1] else None)

    def fwd_backward(ctx, h):
        (x, y, rf, wr), ex = unpack(ctx)
        n1, n2, nrf, nwr = ctx.needs_input_grad[:4]
        nw = nrf or nwr
        if fused is not None and n1 + n2 + nw >= 2:
            gx, gy, gw = fused(x, y, rf, wr, h, *ex)
        else:
            gx = bwd_x(h, y, rf, wr, *ex) if n1 else None
            gy = bwd_y(x, h, rf, wr, *ex) if n2 else None
            gw = bwd_w(x, y, h, *ex) if nw else None
        return (gx if n1 else None, gy if n2 else None, *radial_grads(gw, rf, wr, (nrf, nwr))) + tail

    def bwd_x_backward(ctx, h):
        (g, y, rf, wr), ex = unpack(ctx)
        ng, n2, nrf, nwr = ctx.needs_input_grad[:4]
        gw = bwd_w(h, y, g, *ex) if nrf or nwr else None
        return (fwd(h, y, rf, wr, *ex) if ng else None, bwd_y(h, g, rf, wr, *ex) if n2 else None,
                *radial_grads(gw, rf, wr, (nrf, nwr))) + tail

    def bwd_y_backward(ctx, h):
        (x, g, rf, wr), ex = unpack(ctx)
        n1, ng, nrf, nwr = ctx.needs_input_grad[:4]
        gw = bwd_w(x, h, g, *ex) if nrf or nwr else None
        return (bwd_x(g, h, rf, wr, *ex) if n1 else None, fwd(x, h, rf, wr, *ex) if ng else None,
                *radial_grads(gw, rf, wr, (nrf, nwr))) + tail

    for op, backward in ((fwd, fwd_backward), (bwd_x, bwd_x_backward), (bwd_y, bwd_y_backward)):
        register_backward(op, backward, setup(4))
    if fused is None:
        return

    def add(*terms):
        out = None
        for t in terms:
            if t is not None:
                out = t if out is None else out + t
        return out

    def fused_backward(ctx, k1, k2, kw):
        # outputs (gx, gy, gw) = (conv_bwd_x(G, y, W), conv_bwd_y(x, G, W), conv_bwd_w(x, y, G)),
        # W = rf @ Wr; k1, k2, kw their cotangents (None: not flowing)
        (x, y, rf, wr, g), ex = unpack(ctx)
        n1, n2, nrf, nwr, ng = ctx.needs_input_grad[:5]
        dx = add(bwd_x(g, k2, rf, wr, *ex) if n1 and k2 is not None else None,
                 conv["bwd_x"](g, y, kw, *ex) if n1 and kw is not None else None)
        dy = add(bwd_y(k1, g, rf, wr, *ex) if n2 and k1 is not None else None,
                 conv["bwd_y"](x, g, kw, *ex) if n2 and kw is not None else None)
        dg = add(fwd(k1, y, rf, wr, *ex) if ng and k1 is not None else None,
                 fwd(x, k2, rf, wr, *ex) if ng and k2 is not None else None,
                 conv["fwd"](x, y, kw, *ex) if ng and kw is not None else None)
        gw = add(bwd_w(k1, y, g, *ex) if (nrf or nwr) and k1 is not None else None,
                 bwd_w(x, k2, g, *ex) if (nrf or nwr) and k2 is not None else None)
        return (dx, dy, *radial_grads(gw, rf, wr, (nrf, nwr)), dg) + tail

    register_backward(fused, fused_backward, setup(5))
