"""``ConvOps``: the custom ops of one generated fused graph convolution, bound to its kernels.

``conv(x, y, W, src, dst, num_nodes)[n] = sum_{e: dst[e] = n} TP(x[src[e]], y[e], W[e])``
(or the mean over a node's in-edges). A generated ``torch_conv.py`` defines its kernel
launchers (``_launch_fwd(x, y, weights, out, src, dst[, order, ptr])``, ...: each calls the
generated conv kernels of one op) and hands its metadata to ``ConvOps``, which defines the
four ops (the derivatives of ``F(x, y, W, G) = sum_e W C x[src[e]] y[e] G[dst[e]]`` on
rows in the spec's layout; the kernels run on ``ir_mul`` rows, which each op converts to and
from inside its implementation: ``ColumnPermutation``), their fake implementations and
autograd formulas, the graph tensors, the checks, and ``conv`` itself (``mean`` reduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..layout import inverse_order, ir_mul_order
from .autograd import register_autograd
from .checks import CheckCache, check_device, check_same_device
from .library import define_op, register_fake

__all__ = ["ConvOps", "ConvFusedBackward", "ColumnPermutation", "graph_args"]


def graph_args(graph, order: int | None) -> list[torch.Tensor]:
    """The graph arguments of a kernel launcher: ``src``, ``dst``, and for a segment op
    (``order``: the position of its sort order in ``graph``) its order and row pointers."""
    picked = graph[:2] if order is None else (*graph[:2], graph[order], graph[order + 1])
    return [t.contiguous() for t in picked]


class ColumnPermutation:
    """The columns of one operand's ``mul_ir`` rows in ``ir_mul`` order and back: one gather each.

    The conv kernels run on ``ir_mul`` rows (each component contiguous over the channels).
    Reading ``mul_ir`` rows in place measured slower (H100, 2026-11-28, bulk Si: mace_large's
    fused backward 5,297 against 2,689 µs, the float64 forward 1,916 against 1,477; the
    float32 forward 797 against 882), so each op of a ``mul_ir`` conv converts its operands
    and its output inside its implementation: no operator or autograd node of their own
    (before 2026-11-28 ``conv`` converted at its boundary through a custom op each, whose
    dispatch and autograd nodes cost the eager forward 255 against 130 µs of host time on 512
    edges). Index tensors are built once per device, in eager code (a CUDA graph capture
    reuses those of the warm-up calls).

    Args:
        blocks: ``((mul, 2l+1), ...)`` of the operand's irreps.
    """

    def __init__(self, blocks: tuple[tuple[int, int], ...]):
        to_ir_mul = ir_mul_order(blocks)  # ir_mul position -> mul_ir position
        to_mul_ir = inverse_order(to_ir_mul)
        self.blocks = tuple(blocks)
        self._lists = {True: to_ir_mul, False: to_mul_ir}
        self._cache: dict[tuple[bool, torch.device], torch.Tensor] = {}

    def _gather(self, rows: torch.Tensor, to_ir_mul: bool) -> torch.Tensor:
        key = (to_ir_mul, rows.device)
        idx = self._cache.get(key)
        if idx is None:
            idx = self._cache[key] = torch.tensor(self._lists[to_ir_mul], dtype=torch.long, device=rows.device)
        return torch.index_select(rows, 1, idx)

    def to_ir_mul(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (``(n, dim)``, ``mul_ir`` columns) in ``ir_mul`` order."""
        return self._gather(rows, True)

    def to_mul_ir(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (``(n, dim)``, ``ir_mul`` columns) in ``mul_ir`` order."""
        return self._gather(rows, False)


@dataclass(frozen=True)
class ConvFusedBackward:
    """What the outputs of an atomic convolution's fused backward kernels need.

    Attributes:
        partials: rows of ``dF/dy`` partial sums the kernels write per edge (summed by the
            op; 1: written directly).
        zero_gy: some ``y`` columns are written by no kernel (zero-filled first).
    """

    partials: int = 1
    zero_gy: bool = False


# op -> (argument names, "node" (scattered into nodes) or "edge" (one row per edge), output width key)
_OPS = {
    "fwd": (("x", "y", "weights"), "node", "dim_out"),
    "bwd_x": (("g", "y", "weights"), "node", "dim_in1"),
    "bwd_y": (("x", "g", "weights"), "edge", "dim_in2"),
}


class ConvOps:
    """The custom ops of one generated fused graph convolution and its ``conv``.

    Defines, in namespace ``namespace``, ``conv_fwd(x, y, W, graph..., num_nodes) -> (num_nodes,
    dim_out)``, ``conv_bwd_x(G, y, W, graph..., num_nodes) -> dF/dx (num_nodes, dim_in1)``,
    ``conv_bwd_y(x, G, W, graph..., num_nodes) -> dF/dy (num_edges, dim_in2)``,
    ``conv_bwd_w(x, y, G, graph..., num_nodes) -> dF/dW`` (summed over the edges if the weights
    are shared), with ``linear`` the ``*_lin`` ops (weighted paths only), with ``fused``
    ``conv_bwd(x, y, W, G, graph..., num_nodes) -> (dF/dx, dF/dy, dF/dW)``; ``graph...`` is
    ``graph_names`` (built by ``graph_tensors``). Each op is differentiable with the others
    (``autograd.register_autograd``), so gradients of any order work.

    Args:
        namespace: the ops' namespace (``eqdsl_<name>``).
        launchers: where ``_launch_<op>`` is looked up at every call (the generated module's
            ``globals()``): ``_launch_<op>(*operands, *outputs, src, dst)`` on contiguous
            ``ir_mul`` rows and a non-empty graph, and for a segment op ``(..., src, dst,
            order, ptr)``, the sort order and CSR row pointers of its scatter index (empty
            when the graph was not sorted: then its atomic kernels). An op without one
            returns zeros (no path contributes).
        dim_in1, dim_in2, dim_out, weight_numel, shared_weights, dtypes: as the spec's product.
        reduce: ``"sum"`` or ``"mean"`` (each node's sum divided by its in-degree; 0 for
            isolated nodes).
        graph_names: the graph tensors every op takes after its operands: ``src``, ``dst``,
            then ``<index>_order``, ``<index>_ptr`` of each segment op.
        segment: ``{op: position of its order in graph_names}`` for the segment ops.
        segment_min_edges: graphs with fewer edges are not sorted (the segment ops launch
            their atomic kernels); 0: always sorted.
        linear: the ``*_lin`` ops exist (some paths are unweighted).
        fused: the fused backward's outputs, or None.
        wsum_rows: with shared weights, edges per partial-sum row of ``conv_bwd_w``.
        zero_fill_w: some weight columns are written by no kernel: zero-filled first.
        in1_blocks, in2_blocks, out_blocks: ``((mul, 2l+1), ...)`` of an operand whose
            ``mul_ir`` rows the ops convert to ``ir_mul`` for the kernels (and their results
            back: ``ColumnPermutation``), or None.

    Attributes:
        impls: ``{op name: implementation}``, what each operator runs (tests call them directly).
        ops: ``{op name: operator}`` (``"fwd"`` is ``torch.ops.<namespace>.conv_fwd.default``).
    """

    def __init__(self, namespace: str, launchers: Mapping[str, Callable], *, dim_in1: int, dim_in2: int,
                 dim_out: int, weight_numel: int, shared_weights: bool, dtypes: tuple[torch.dtype, ...],
                 reduce: str, graph_names: tuple[str, ...], segment: Mapping[str, int] | None = None,
                 segment_min_edges: int = 0, linear: bool = False, fused: ConvFusedBackward | None = None,
                 wsum_rows: int | None = None, zero_fill_w: bool = False, in1_blocks=None, in2_blocks=None,
                 out_blocks=None):
        if reduce not in ("sum", "mean"):
            raise ValueError(f"{namespace}: reduce must be 'sum' or 'mean', got {reduce!r}")
        if shared_weights and wsum_rows is None:
            raise ValueError(f"{namespace}: shared weights need wsum_rows")
        self.namespace = namespace
        self._launchers = launchers
        self.dims = {"dim_in1": dim_in1, "dim_in2": dim_in2, "dim_out": dim_out}
        self.weight_numel = weight_numel
        self.shared_weights = shared_weights
        self.dtypes = tuple(dtypes)
        self.reduce = reduce
        self.graph_names = tuple(graph_names)
        self.segment = dict(segment or {})
        self.segment_min_edges = segment_min_edges
        self.fused = fused
        self.wsum_rows = wsum_rows
        self.zero_fill_w = zero_fill_w
        # the indices sorted for the segment ops (graph order), and where the in-degree's row pointers are
        self._sort_keys = tuple(n.removesuffix("_order") for n in self.graph_names[2::2])
        self._dst_ptr = self.graph_names.index("dst_ptr") if "dst_ptr" in self.graph_names else None
        # operand name or output width -> its permutation (operands and outputs in the spec's layout)
        perms = {key: ColumnPermutation(blocks) for key, blocks in (("in1", in1_blocks), ("in2", in2_blocks),
                                                                    ("out", out_blocks)) if blocks is not None}
        self._perms = {name: perms[key] for name, key in (("x", "in1"), ("y", "in2"), ("g", "out"),
                                                          ("dim_in1", "in1"), ("dim_in2", "in2"),
                                                          ("dim_out", "out")) if key in perms}

        names = ["fwd", "bwd_x", "bwd_y"]
        self.ops, self.impls = {}, {}
        for name in names + ([n + "_lin" for n in names] if linear else []):
            self.ops[name] = self._define_operand_op(name)
        self.ops["bwd_w"] = self._define("bwd_w", ("x", "y", "g"), "Tensor", self._bwd_w, self._bwd_w_fake)
        if fused is not None:
            self.ops["bwd"] = self._define("bwd", ("x", "y", "weights", "g"), "(Tensor, Tensor, Tensor)",
                                           self._bwd, self._bwd_fake)
        lin = tuple(self.ops[n + "_lin"] for n in names) if linear else None
        register_autograd(*(self.ops[n] for n in names), self.ops["bwd_w"], linear=lin, fused=self.ops.get("bwd"),
                          graph=len(self.graph_names))
        self._fwd = self.ops["fwd"]
        self._checked = CheckCache(self.check)  # check once per accepted argument metadata

    # ------------------------------------------------------------------ entry point

    def _fail(self, exc, msg, entry: str = "conv"):
        raise exc(f"{self.namespace}.{entry}: {msg}")

    def check(self, node_features, edge_attr, weights, src, dst, num_nodes) -> None:
        """One clear ``TypeError`` / ``ValueError`` per mistake, naming the argument (no device sync)."""
        edges = self.check_arguments("conv", node_features, edge_attr, (("weights", weights),), src, dst, num_nodes)
        numel = self.weight_numel
        if self.shared_weights:
            if weights.dim() != 1 or weights.shape[0] != numel:
                self._fail(ValueError, f"weights are shared: expected shape ({numel},), got {tuple(weights.shape)}")
        elif weights.dim() != 2 or weights.shape[1] != numel or weights.shape[0] != edges:
            self._fail(ValueError, f"weights are per edge: expected shape ({edges}, {numel}), "
                                   f"got {tuple(weights.shape)}")

    def check_arguments(self, entry: str, node_features, edge_attr, weights: tuple, src, dst, num_nodes) -> int:
        """The checks of an entry point's graph and operands; ``weights``: ``(name, tensor)``
        pairs of its weight tensors (types, dtypes and devices checked here, shapes by the
        caller). Returns the number of edges.

        Raises:
            TypeError, ValueError: one per mistake, ``<namespace>.<entry>: ...`` naming the argument.
        """
        dim_in1, dim_in2 = self.dims["dim_in1"], self.dims["dim_in2"]
        operands = (("node_features", node_features), ("edge_attr", edge_attr), *weights)
        tensors = (*operands, ("src", src), ("dst", dst))
        for name, t in tensors:
            if not isinstance(t, torch.Tensor):
                self._fail(TypeError, f"{name} must be a torch.Tensor, got {type(t).__name__}", entry)
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, torch.SymInt)):
            self._fail(TypeError, f"num_nodes must be an int, got {type(num_nodes).__name__}", entry)
        allowed = ", ".join(str(d) for d in self.dtypes)
        for name, t in operands:
            if t.dtype not in self.dtypes:
                self._fail(TypeError, f"{name} must have dtype in ({allowed}), got {t.dtype}", entry)
        if len({t.dtype for _, t in operands}) > 1:
            names = ", ".join(n for n, _ in operands[:-1]) + f" and {operands[-1][0]}"
            self._fail(TypeError, f"{names} must share one dtype, got "
                                  f"{', '.join(str(t.dtype) for _, t in operands)}", entry)
        for name, t in tensors[len(operands):]:
            if t.dtype not in (torch.int64, torch.int32):
                self._fail(TypeError, f"{name} must hold integer node indices (int64 or int32), got {t.dtype}", entry)
            if t.dim() != 1:
                self._fail(ValueError, f"{name} must have shape (num_edges,), got {tuple(t.shape)}", entry)
        if node_features.dim() != 2 or node_features.shape[1] != dim_in1:
            self._fail(ValueError, f"node_features must have shape (num_nodes, {dim_in1}), "
                                   f"got {tuple(node_features.shape)}", entry)
        if node_features.shape[0] != num_nodes:
            self._fail(ValueError, f"num_nodes={num_nodes} does not match node_features, which has "
                                   f"{node_features.shape[0]} rows", entry)
        edges = src.shape[0]
        if dst.shape[0] != edges:
            self._fail(ValueError, f"src and dst must have one entry per edge, got {edges} and {dst.shape[0]}", entry)
        if edge_attr.dim() != 2 or edge_attr.shape[1] != dim_in2 or edge_attr.shape[0] != edges:
            self._fail(ValueError, f"edge_attr must have shape ({edges}, {dim_in2}) (one row per edge of "
                                   f"src/dst), got {tuple(edge_attr.shape)}", entry)
        check_same_device(f"{self.namespace}.{entry}", tuple(n for n, _ in tensors), tuple(t for _, t in tensors))
        return edges

    def check_range(self, src, dst, num_nodes) -> None:
        """``0 <= src, dst < num_nodes`` (one device sync), in eager code only.

        Skipped inside ``torch.compile`` (a host read of device data there is a graph break,
        and under ``mode="reduce-overhead"`` a sync between two CUDA graphs) and while a CUDA
        graph is being captured (a host read during capture is an error): validate the graph
        in eager code there (e.g. in the warm-up call that capture needs anyway).
        """
        if src.shape[0] == 0 or torch.compiler.is_compiling():
            return
        if src.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        # three small kernels and one sync when the indices are valid; which array is wrong, after
        lo, hi = torch.stack(torch.aminmax(torch.cat((src, dst)))).tolist()
        if 0 <= lo and hi < num_nodes:
            return
        bad = torch.stack([((src < 0) | (src >= num_nodes)).any(), ((dst < 0) | (dst >= num_nodes)).any()]).tolist()
        for name, t, b in (("src", src, bad[0]), ("dst", dst, bad[1])):
            if b:
                self._fail(ValueError, f"{name} holds node indices outside [0, num_nodes={num_nodes}): "
                                       f"min {int(t.min())}, max {int(t.max())}")

    def graph_tensors(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, ...]:
        """The graph arguments of the ops, ``graph_names`` (int64, no sync): ``src``, ``dst``,
        then per segment op ``<index>_order`` (edges stably sorted by that index) and
        ``<index>_ptr`` (CSR row pointers, ``num_nodes + 1``: node ``n``'s edges are
        ``order[ptr[n]:ptr[n + 1]]``); empty below ``segment_min_edges`` edges."""
        src, dst = src.long().contiguous(), dst.long().contiguous()
        if not self._sort_keys:
            return (src, dst)
        if src.shape[0] < self.segment_min_edges:  # the ops launch their atomic kernels: nothing to sort
            empty = src.new_empty((0,))
            return (src, dst) + (empty,) * (len(self.graph_names) - 2)
        nodes = torch.arange(num_nodes + 1, device=src.device, dtype=torch.int64)
        out = [src, dst]
        for idx in (src if k == "src" else dst for k in self._sort_keys):
            key, order = torch.sort(idx, stable=True)
            out += [order.contiguous(), torch.searchsorted(key, nodes).contiguous()]
        return tuple(out)

    def conv(self, node_features: torch.Tensor, edge_attr: torch.Tensor, weights: torch.Tensor, src: torch.Tensor,
             dst: torch.Tensor, num_nodes: int, *, check: bool = True) -> torch.Tensor:
        """``out[dst[e]] += TP(node_features[src[e]], edge_attr[e], weights[e])`` (or the mean).

        Differentiable to any order with respect to ``node_features``, ``edge_attr`` and
        ``weights``. Runs on the tensors' device (all on one; CUDA, or CPU with
        ``TRITON_INTERPRET=1``), whatever the current CUDA device.

        Index check. With ``check=True`` (default), eager code checks ``0 <= src, dst <
        num_nodes`` before any kernel runs: a ``ValueError`` naming the array, never an
        out-of-bounds access; it costs one device sync per call. It is skipped inside
        ``torch.compile`` and while a CUDA graph is being captured (``torch.cuda.graph``,
        ``mode="reduce-overhead"``), where reading device data on the host would break the
        graph or fail the capture: there the indices are not checked, and an out-of-range
        index is an out-of-bounds memory access, so check the graph in eager code (the
        warm-up call before a capture does). ``check=False`` skips it everywhere (hot loops
        whose indices come from a trusted neighbour list). Nothing else in a call reads
        device data on the host, so the conv, its gradients of every order, and the
        ``mean`` reduce can be captured in a CUDA graph.

        Raises:
            TypeError, ValueError: a bad argument (named; for arguments on several devices,
                each one's device).
            RuntimeError: a device the kernels cannot run on.
        """
        # the cached check under torch.compile would trace its set lookups: the plain one there
        (self.check if torch.compiler.is_compiling() else self._checked)(
            node_features, edge_attr, weights, src, dst, num_nodes)
        graph = self.prepare(src, dst, num_nodes, check)
        return self.finish(self._fwd(node_features, edge_attr, weights, *graph, num_nodes), graph, num_nodes)

    def prepare(self, src, dst, num_nodes: int, check: bool) -> tuple[torch.Tensor, ...]:
        """What an entry point does after its argument checks and before its forward op: the
        index check (``check``), then the graph tensors (returned)."""
        if check:
            self.check_range(src, dst, num_nodes)
        return self.graph_tensors(src, dst, num_nodes)

    def finish(self, out: torch.Tensor, graph, num_nodes: int) -> torch.Tensor:
        """An entry point's forward op output, summed per node, as it returns it: divided by
        the in-degree (``mean``)."""
        if self.reduce == "mean":
            out = out * (1.0 / self._in_degree(graph, num_nodes).clamp_min(1).to(out.dtype))[:, None]
        return out

    def _in_degree(self, graph, num_nodes: int) -> torch.Tensor:
        """Edges into each node, int64 ``(num_nodes,)``: from ``dst``'s row pointers where the
        graph was sorted by ``dst``, else an ``index_add_`` (``torch.bincount`` reads the
        largest index on the host: a sync on CUDA, an error in CUDA graph capture)."""
        if self._dst_ptr is not None and graph[self._dst_ptr].numel():
            ptr = graph[self._dst_ptr]
            return ptr[1:] - ptr[:-1]
        dst = graph[1]
        return torch.zeros(num_nodes, dtype=torch.int64, device=dst.device).index_add_(0, dst, torch.ones_like(dst))

    # ------------------------------------------------------------------ the ops

    def _define(self, name, args, returns, impl, fake):
        arglist = ", ".join(f"Tensor {a}" for a in args + self.graph_names)
        op = define_op(f"{self.namespace}::conv_{name}", impl, schema=f"({arglist}, SymInt num_nodes) -> {returns}")
        register_fake(op, fake)
        self.impls[name] = impl
        return op

    def _check_same_device(self, name, names, tensors) -> None:
        """An op's tensors (operands ``names``, then the graph) on one device (the kernels run on
        their tensors' device; ``conv`` checked its arguments, but the ops may be called directly)."""
        check_same_device(f"{self.namespace}::conv_{name}", names + self.graph_names, tensors)

    def _check_run(self, name, names, tensors) -> None:
        """``_check_same_device``, then a device the kernels run on."""
        self._check_same_device(name, names, tensors)
        check_device(f"{self.namespace}::conv_{name}", tensors[0].device)

    def check_op(self, name: str, names: tuple[str, ...], tensors, run: bool = True) -> None:
        """Op ``conv_<name>``'s tensors (operands ``names``, then the graph) on one device and,
        with ``run``, one its kernels run on (for ops defined beside these, ``conv_radial``'s)."""
        (self._check_run if run else self._check_same_device)(name, tuple(names), tensors)

    def _graph_args(self, name, graph):
        """The graph arguments of ``_launch_<name>``: ``src``, ``dst`` (and a segment op's order and row pointers)."""
        return graph_args(graph, self.segment.get(name))

    def _alloc(self, like, zero: bool, shape):
        return like.new_zeros(shape) if zero else like.new_empty(shape)

    def _define_operand_op(self, name: str):
        """``fwd``, ``bwd_x``, ``bwd_y`` or a ``*_lin`` op."""
        names, kind, out = _OPS[name.removesuffix("_lin")]
        n0, n1 = names[:2]  # the two operands in a layout (the third is the weights)
        width = self.dims[out]
        launcher = "_launch_" + name
        order = self.segment.get(name)

        def rows(a, graph, num_nodes):
            return num_nodes if kind == "node" else graph[0].shape[0]

        def impl(a, b, c, *rest):
            *graph, num_nodes = rest
            self._check_run(name, names, (a, b, c, *graph))
            launch = self._launchers.get(launcher)
            if launch is None:  # no path contributes
                return a.new_zeros((rows(a, graph, num_nodes), width))
            edges = graph[0].shape[0]
            if kind == "edge":
                result = a.new_empty((edges, width))
                if edges > 0:
                    launch(self.to_kernel(n0, a).contiguous(), self.to_kernel(n1, b).contiguous(), c.contiguous(),
                           result, *self._graph_args(name, graph))
                return self.from_kernel(out, result)
            # atomics add into zeros; a segment op on a sorted graph writes every row itself
            segment = order is not None and graph[order].numel() > 0
            result = self._alloc(a, not segment, (num_nodes, width))
            if edges > 0 and num_nodes > 0:
                launch(self.to_kernel(n0, a).contiguous(), self.to_kernel(n1, b).contiguous(), c.contiguous(),
                       result, *self._graph_args(name, graph))
            return self.from_kernel(out, result)

        def fake(a, b, c, *rest):
            *graph, num_nodes = rest
            self._check_same_device(name, names, (a, b, c, *graph))
            return a.new_empty((rows(a, graph, num_nodes), width))

        return self._define(name, names, "Tensor", impl, fake)

    def to_kernel(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """Operand ``name`` (``x``, ``y`` or ``g``; other names pass) as the kernels' ``ir_mul`` rows."""
        perm = self._perms.get(name)
        return rows if perm is None else perm.to_ir_mul(rows)

    def from_kernel(self, width: str, rows: torch.Tensor) -> torch.Tensor:
        """An output of the kernels (``width``: ``dim_out``, ``dim_in1`` or ``dim_in2``) in the spec's layout."""
        perm = self._perms.get(width)
        return rows if perm is None else perm.to_mul_ir(rows)

    def _gw_shape(self, edges):
        return (self.weight_numel,) if self.shared_weights else (edges, self.weight_numel)

    def _bwd_w(self, x, y, g, *rest):
        """``dF/dW (x, y, G)``: summed over the edges if the weights are shared (per-program
        partial sums, then their sum: deterministic), else one row per edge."""
        *graph, _ = rest
        self._check_run("bwd_w", ("x", "y", "g"), (x, y, g, *graph))
        edges = graph[0].shape[0]
        launch = self._launchers.get("_launch_bwd_w")
        if launch is None or edges == 0:  # no weight has a nonzero coefficient, or no edges
            return x.new_zeros(self._gw_shape(edges))
        operands = [self.to_kernel(n, t).contiguous() for n, t in (("x", x), ("y", y), ("g", g))]
        if self.shared_weights:
            gw = self._alloc(x, self.zero_fill_w, ((edges + self.wsum_rows - 1) // self.wsum_rows, self.weight_numel))
            launch(*operands, gw, *self._graph_args("bwd_w", graph))
            return gw.sum(0)
        gw = self._alloc(x, self.zero_fill_w, (edges, self.weight_numel))
        launch(*operands, gw, *self._graph_args("bwd_w", graph))
        return gw

    def _bwd_w_fake(self, x, y, g, *rest):
        *graph, _ = rest
        self._check_same_device("bwd_w", ("x", "y", "g"), (x, y, g, *graph))
        return x.new_empty(self._gw_shape(graph[0].shape[0]))

    def _bwd(self, x, y, weights, g, *rest):
        """``(dF/dx, dF/dy, dF/dW)`` at ``(x, y, weights, G)`` from the fused kernels (one gather
        of ``G`` per edge): what ``conv_bwd_x``, ``conv_bwd_y`` and ``conv_bwd_w`` return."""
        *graph, num_nodes = rest
        self._check_run("bwd", ("x", "y", "weights", "g"), (x, y, weights, g, *graph))
        f, edges, dim_in2 = self.fused, graph[0].shape[0], self.dims["dim_in2"]
        gx = x.new_zeros((num_nodes, self.dims["dim_in1"]))  # scattered into with atomics
        gw = self._alloc(x, self.zero_fill_w, (edges, self.weight_numel))
        # with partials: dF/dy partial sums, one row per kernel or channel tile, summed here (no atomics)
        gy = self._alloc(x, f.zero_gy, (edges, f.partials * dim_in2))
        if edges > 0:
            self._launchers["_launch_bwd"](self.to_kernel("x", x).contiguous(), self.to_kernel("y", y).contiguous(),
                                           weights.contiguous(), self.to_kernel("g", g).contiguous(),
                                           gx, gy, gw, *self._graph_args("bwd", graph))
        if f.partials > 1:
            gy = gy.view(edges, f.partials, dim_in2).sum(1)
        return self.from_kernel("dim_in1", gx), self.from_kernel("dim_in2", gy), gw

    def _bwd_fake(self, x, y, weights, g, *rest):
        *graph, num_nodes = rest
        self._check_same_device("bwd", ("x", "y", "weights", "g"), (x, y, weights, g, *graph))
        edges = graph[0].shape[0]
        return (x.new_empty((num_nodes, self.dims["dim_in1"])), x.new_empty((edges, self.dims["dim_in2"])),
                x.new_empty((edges, self.weight_numel)))
