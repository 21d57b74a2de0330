"""``TensorProductFunctions``: the JAX entry points of one generated tensor product, bound to its kernels.

A generated ``jax_ops.py`` hands its metadata and its ``pallas_kernels`` module (the
generated kernel bodies and kernel sets) to ``TensorProductFunctions``, which wires the
kernels' derivatives (``autodiff``), checks the arguments (``checks``) and runs the
kernels under ``jax.jit`` (``tensor_product``, ``tensor_product_vjp``, ``conv``,
``conv_radial``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import jax
import jax.numpy as jnp

from .autodiff import RadialVJP, TensorProductVJP, make_conv_vjp_ops, make_radial_vjp_ops, make_vjp_ops
from .columns import ConvColumns
from .checks import check_block_batch, check_conv_inputs, check_conv_radial_inputs, check_grad_out, check_inputs
from .graph import conv_graph
from . import launch  # its launchers read at call time (tools patch launch.launch_segments)
from .launch import use_interpret
from .padding import PaddedGraph, kernel_weights, pad_graph, pad_rows, round_up, user_weights
from .tiles import DOT_MIN
from ..pallas_abi import KERNEL_ABI

__all__ = ["TensorProductFunctions", "ConvKernels", "RadialKernels"]


@dataclass(frozen=True)
class ConvKernels:
    """The fused convolution's kernel sets of a ``pallas_kernels`` module.

    Attributes:
        reduce: ``"sum"`` or ``"mean"`` (each node's sum divided by its in-degree).
        fwd, bwd_x1, bwd_x2, bwd_w: ``(kernel body, first column, width)`` triples of each
            derivative (``launch.launch_segments`` / ``launch_edges``).
        weighted: ``(fwd, bwd_x1, bwd_x2)`` over the weighted paths only (some paths are
            unweighted), or None.
        backward_fused_kernels: ``(kernel, dF/dx width, weight width)`` triples of the fused
            backward (the three gradients from one gather of ``G`` per edge), or None.
        gx1_segments: None, or how the fused kernels' partial ``dF/dx`` pieces add up per
            ``x1`` block (``launch.conv_backward_fused``).
    """

    reduce: str
    fwd: tuple
    bwd_x1: tuple
    bwd_x2: tuple
    bwd_w: tuple
    weighted: tuple | None = None
    backward_fused_kernels: tuple | None = None
    gx1_segments: tuple | None = None


@dataclass(frozen=True)
class RadialKernels:
    """``conv_radial``'s kernel sets of a ``pallas_kernels`` module (spec key ``radial_features``).

    Attributes:
        features: ``H``, the radial features per edge.
        fwd, bwd_x1, bwd_x2: ``(kernel body, first column, width)`` triples of the conv's derivatives
            that read the weights, with operands ``rf`` ``(rows, H)`` and ``wr``
            ``(H, weight_numel)`` in place of the weights (formed on chip).
        backward_fused_kernels: the fused backward's ``(kernel, dF/dx width, weight width)``
            triples in that form, or None; ``gx1_segments`` as ``ConvKernels``'.
        materialize: no kernels of its own (``fwd`` ... None; spec key
            ``pallas_radial_materialize``): ``conv_radial`` runs the conv at
            ``radial_features @ radial_weight``.
    """

    features: int
    fwd: tuple | None = None
    bwd_x1: tuple | None = None
    bwd_x2: tuple | None = None
    backward_fused_kernels: tuple | None = None
    gx1_segments: tuple | None = None
    materialize: bool = False

    def __post_init__(self):
        if self.materialize != (self.fwd is None or self.bwd_x1 is None or self.bwd_x2 is None):
            raise ValueError("RadialKernels: give fwd, bwd_x1 and bwd_x2, or materialize=True and none of them")


class TensorProductFunctions:
    """``tensor_product``, ``tensor_product_vjp`` and (with ``conv``) ``conv`` of one generated product.

    Args:
        kernels: the generated ``pallas_kernels`` module (``forward``, ``backward_x1``,
            ``backward_x2``, ``backward_w``: launchers ``f(a, b, c, *, block_batch,
            interpret)``; ``NAME``, ``NUM_WARPS``, ``BLOCK_BATCH``, ``SEGMENT_EDGES``,
            ``BLOCK_BATCH_BY_DTYPE``, ``SEGMENT_EDGES_BY_DTYPE``, ``NUM_WARPS_BY_DTYPE`` (the defaults
            of one dtype),
            ``IDIM_IN1``, ``IDIM_IN2``, ``IDIM_OUT``, ``IWEIGHT_NUMEL``).
        dim_in1, dim_in2, dim_out, weight_numel: row widths of ``x1``, ``x2``, the output,
            the weights (e3nn's order, the spec's layout).
        shared_weights: weights ``(weight_numel,)`` (True) or one row per batch row.
        dtypes: the dtype names the kernels were generated for.
        weighted: the launchers ``(forward, backward_x1, backward_x2)`` over the weighted
            paths only (some paths are unweighted), or None.
        fused: the fused backward's launcher ``f(x1, x2, w, g, *, block_batch, interpret) ->
            (gx1, gx2, gw)`` (a channelwise product), or None.
        conv: the fused convolution's kernel sets, or None.
        conv_by_dtype: ``{dtype name: ConvKernels}``, the conv's kernel sets for that dtype's
            operands in place of ``conv``'s (spec key ``pallas_conv_max_terms_<dtype>``), or None.
        radial: ``conv_radial``'s kernel sets (needs ``conv``, per-edge weights), or None.
        conv_blocks: ``(x1, x2, output)`` blocks, ``((mul, 2l+1), ...)`` each, of a ``mul_ir``
            product whose conv kernels (and ``radial``'s) run on ``ir_mul`` rows: ``conv`` and
            ``conv_radial`` permute their operands' and output's columns
            (``columns.ConvColumns``); None: the conv's kernels read the spec's rows.

    Attributes:
        kernel_ops: the four kernels as ``autodiff.TensorProductVJP``.
        conv_ops: the four conv kernels as ``TensorProductVJP`` on the kernels' rows (``ir_mul``
            with ``conv_blocks``; None without ``conv``).
        radial_ops: ``conv_radial``'s kernels as ``autodiff.RadialVJP`` (None without ``radial``,
            or where it materializes the weights).

    Raises:
        ValueError: ``radial`` without ``conv``, or with shared weights.
        ImportError: ``kernels`` was generated for another ``KERNEL_ABI`` than this runtime's
            (``eqdsl.runtime.pallas_abi``): regenerate the package.
    """

    def __init__(self, kernels: ModuleType, *, dim_in1: int, dim_in2: int, dim_out: int, weight_numel: int,
                 shared_weights: bool, dtypes: tuple[str, ...], weighted=None, fused=None,
                 conv: ConvKernels | None = None, radial: RadialKernels | None = None,
                 conv_by_dtype: dict[str, ConvKernels] | None = None, conv_blocks=None):
        abi = getattr(kernels, "KERNEL_ABI", 1)
        if abi != KERNEL_ABI:
            raise ImportError(
                f"{kernels.__name__} was generated for Pallas kernel ABI {abi}, this eqdsl runs ABI {KERNEL_ABI} "
                "(eqdsl.runtime.pallas_abi); regenerate it with eqdsl generate")
        self.kernels = kernels
        self.dim_in1, self.dim_in2, self.dim_out = dim_in1, dim_in2, dim_out
        self.weight_numel, self.shared_weights, self.dtypes = weight_numel, shared_weights, tuple(dtypes)
        self.kernel_ops: TensorProductVJP = make_vjp_ops(
            kernels.forward, kernels.backward_x1, kernels.backward_x2, kernels.backward_w, weighted=weighted,
            fused=fused, shared_weights=shared_weights)
        # jitted (static block size and mode) so that eager calls do not run the kernels op by op.
        # No padding here: every kernel launch pads its own rows to a multiple of the batch block
        # (per device when the batch is sharded: sharding.row_parallel).
        self._tensor_product = jax.jit(self._tensor_product_traced, static_argnames=("block_batch", "interpret"))
        self._tensor_product_vjp = jax.jit(self._vjp_traced, static_argnames=("block_batch", "interpret"))
        self.conv_kernels = conv
        self._conv_columns = None if conv_blocks is None else ConvColumns.of(*conv_blocks)
        self.conv_by_dtype = dict(conv_by_dtype or {})
        for dtype, family in self.conv_by_dtype.items():
            if conv is None or (family.weighted is None) != (conv.weighted is None) or \
                    (family.backward_fused_kernels is None) != (conv.backward_fused_kernels is None):
                raise ValueError(f"{kernels.NAME}: conv_by_dtype[{dtype!r}] has other kernel kinds than conv")
        self.conv_ops: TensorProductVJP | None = None
        if conv is not None:
            if conv.reduce not in ("sum", "mean"):
                raise ValueError(f"{kernels.NAME}: reduce must be 'sum' or 'mean', got {conv.reduce!r}")
            fused_conv = self._conv_backward_fused if conv.backward_fused_kernels is not None else None
            self.conv_ops = make_conv_vjp_ops(
                *self._conv_launchers(lambda ck: (ck.fwd, ck.bwd_x1, ck.bwd_x2)), self._conv_backward_w,
                weighted=None if conv.weighted is None else self._conv_launchers(lambda ck: ck.weighted),
                fused=fused_conv)
            self._conv = jax.jit(self._conv_traced, static_argnames=("num_nodes", "block", "interpret"))
        self.radial_kernels = radial
        self.radial_ops: RadialVJP | None = None
        if radial is not None:
            if conv is None or shared_weights:
                raise ValueError(f"{kernels.NAME}: conv_radial needs the conv and per-edge weights")
            if not radial.materialize:
                self.radial_ops = make_radial_vjp_ops(
                    self.conv_ops, *self._radial_launchers(radial),
                    fused=self._radial_backward_fused if radial.backward_fused_kernels is not None else None)
            self._conv_radial = jax.jit(self._conv_radial_traced, static_argnames=("num_nodes", "block", "interpret"))

    # ------------------------------------------------------------------ the plain product

    def _check(self, x1, x2, weights):
        return check_inputs(x1, x2, weights, dim_in1=self.dim_in1, dim_in2=self.dim_in2,
                            weight_numel=self.weight_numel, shared_weights=self.shared_weights, dtypes=self.dtypes)

    def tensor_product(self, x1, x2, weights, *, interpret: bool | None = None, block_batch: int | None = None):
        """``out[z] = TP(x1[z], x2[z]; weights)`` (the generated module's ``tensor_product``)."""
        x1, x2, weights = self._check(x1, x2, weights)
        if x1.shape[0] == 0:
            return jnp.zeros((0, self.dim_out), x1.dtype)
        block_batch = check_block_batch(block_batch, self._block_batch(x1.dtype))
        return self._tensor_product(x1, x2, weights, block_batch=block_batch, interpret=use_interpret(interpret))

    def tensor_product_vjp(self, x1, x2, weights, grad_out, *, interpret: bool | None = None,
                           block_batch: int | None = None):
        """The three gradients of ``sum(grad_out * tensor_product(x1, x2, weights))``, no forward
        (the generated module's ``tensor_product_vjp``)."""
        x1, x2, weights = self._check(x1, x2, weights)
        grad_out = check_grad_out(grad_out, batch=x1.shape[0], dim_out=self.dim_out, dtype=x1.dtype)
        if x1.shape[0] == 0:
            return jnp.zeros_like(x1), jnp.zeros_like(x2), jnp.zeros_like(weights)
        block_batch = check_block_batch(block_batch, self._block_batch(x1.dtype))
        return self._tensor_product_vjp(x1, x2, weights, grad_out, block_batch=block_batch,
                                        interpret=use_interpret(interpret))

    def _block_batch(self, dtype) -> int:
        """The module's default rows (edges) per program for ``dtype``."""
        return self.kernels.BLOCK_BATCH_BY_DTYPE.get(jnp.dtype(dtype).name, self.kernels.BLOCK_BATCH)

    def _num_warps(self, dtype) -> int:
        """The module's Triton warps per program for ``dtype``'s calls (``NUM_WARPS_BY_DTYPE``,
        absent from modules generated before it: they have ``NUM_WARPS`` only)."""
        k = self.kernels
        return getattr(k, "NUM_WARPS_BY_DTYPE", {}).get(jnp.dtype(dtype).name, k.NUM_WARPS)

    def _segment_edges(self, dtype) -> int:
        """The module's default edges per loop step of the conv's segment kernels for ``dtype``."""
        return self.kernels.SEGMENT_EDGES_BY_DTYPE.get(jnp.dtype(dtype).name, self.kernels.SEGMENT_EDGES)

    def _weights(self, weights, rows: int):
        return kernel_weights(weights, self.weight_numel, self.shared_weights, rows)

    def _tensor_product_traced(self, x1, x2, weights, *, block_batch: int, interpret: bool):
        return self.kernel_ops.fwd(x1, x2, self._weights(weights, x1.shape[0]), block_batch, interpret)

    def _vjp_traced(self, x1, x2, weights, g, *, block_batch: int, interpret: bool):
        ops, w = self.kernel_ops, self._weights(weights, x1.shape[0])
        if ops.bwd is not None:  # the fused backward: one pass over g
            ga, gb, gw = ops.bwd(x1, x2, w, g, block_batch, interpret)
        else:
            ga = ops.bwd_x1(g, x2, w, block_batch, interpret)
            gb = ops.bwd_x2(x1, g, w, block_batch, interpret)
            gw = ops.bwd_w(x1, x2, g, block_batch, interpret)
        return ga, gb, user_weights(gw, self.weight_numel, self.shared_weights, x1.shape[0])

    # ------------------------------------------------------------------ the fused convolution

    def _conv_for(self, dtype) -> ConvKernels:
        """The conv's kernel sets for operands of ``dtype``."""
        return self.conv_by_dtype.get(jnp.dtype(dtype).name, self.conv_kernels)

    def _conv_launchers(self, sets):
        """``(forward, backward_x1, backward_x2)`` launchers of the kernel sets ``sets(ConvKernels)``
        of the operands' dtype (``_conv_for``)."""
        k = self.kernels
        shared = 2 if self.shared_weights else None

        # block_batch: (edges per program of the per-edge kernels, edges per step of the segment kernels)
        def forward(a, b, c, graph, *, block_batch, interpret):
            return launch.launch_segments(k.NAME, sets(self._conv_for(a.dtype))[0], (a, b, c), node_arg=0,
                                   shared_arg=shared,
                                   perm=graph.perm_dst, rowptr=graph.rowptr_dst, gather=graph.gather_dst,
                                   num_nodes=a.shape[0], out_width=k.IDIM_OUT, block_edges=block_batch[1],
                                   interpret=interpret, num_warps=self._num_warps(a.dtype))

        def backward_x1(g, b, c, graph, *, block_batch, interpret):
            return launch.launch_segments(k.NAME, sets(self._conv_for(g.dtype))[1], (g, b, c), node_arg=0,
                                   shared_arg=shared,
                                   perm=graph.perm_src, rowptr=graph.rowptr_src, gather=graph.gather_src,
                                   num_nodes=g.shape[0], out_width=k.IDIM_IN1, block_edges=block_batch[1],
                                   interpret=interpret, num_warps=self._num_warps(g.dtype))

        def backward_x2(a, g, c, graph, *, block_batch, interpret):
            return launch.launch_edges(k.NAME, sets(self._conv_for(a.dtype))[2], (a, g, c),
                                gathers={0: graph.src, 1: graph.dst},
                                shared_arg=shared, shared_out=False, num_nodes=a.shape[0], out_width=k.IDIM_IN2,
                                block_edges=block_batch[0], interpret=interpret, num_warps=self._num_warps(a.dtype))

        return forward, backward_x1, backward_x2

    def _conv_backward_w(self, a, b, g, graph, *, block_batch, interpret):
        k = self.kernels
        return launch.launch_edges(k.NAME, self._conv_for(a.dtype).bwd_w, (a, b, g),
                            gathers={0: graph.src, 2: graph.dst},
                            shared_arg=None, shared_out=self.shared_weights, num_nodes=a.shape[0],
                            out_width=k.IWEIGHT_NUMEL, block_edges=block_batch[0], interpret=interpret,
                            num_warps=self._num_warps(a.dtype))

    def _conv_backward_fused(self, a, b, c, g, graph, *, block_batch, interpret):
        # the three gradients with one gather of G per edge (launch.conv_backward_fused)
        k, ck = self.kernels, self._conv_for(a.dtype)
        return launch.conv_backward_fused(k.NAME, ck.backward_fused_kernels, (a, b, c, g), graph, num_nodes=a.shape[0],
                                   dim_in2=k.IDIM_IN2, weight_numel=k.IWEIGHT_NUMEL, gx1_segments=ck.gx1_segments,
                                   block_edges=block_batch[0], segment_edges=block_batch[1], interpret=interpret,
                                   num_warps=self._num_warps(a.dtype))

    def conv(self, node_features, edge_attr, weights, src, dst, num_nodes: int, *, check: bool = True,
             interpret: bool | None = None, block_edges: int | None = None, segment_edges: int | None = None):
        """The fused graph convolution (the generated module's ``conv``)."""
        x, y, w, src, dst, num_nodes = check_conv_inputs(
            node_features, edge_attr, weights, src, dst, num_nodes, dim_in1=self.dim_in1, dim_in2=self.dim_in2,
            weight_numel=self.weight_numel, shared_weights=self.shared_weights, dtypes=self.dtypes, check=check)
        if num_nodes == 0:
            return jnp.zeros((0, self.dim_out), x.dtype)
        block = (check_block_batch(block_edges, self._block_batch(x.dtype)),
                 check_block_batch(segment_edges, self._segment_edges(x.dtype)))
        return self._conv(x, y, w, src, dst, num_nodes=num_nodes, block=block, interpret=use_interpret(interpret))

    def _conv_traced(self, x, y, w, src, dst, *, num_nodes: int, block: tuple[int, int], interpret: bool):
        rows = max(round_up(y.shape[0], block[0]), block[0])
        graph = conv_graph(src, dst, num_nodes, rows, x.dtype)
        w = self._weights(w, rows)
        return self._on_kernel_rows(lambda a, b: self.conv_ops.fwd(a, pad_rows(b, rows), w, graph, block, interpret),
                                    x, y, graph)

    def _on_kernel_rows(self, run, x, y, graph):
        """``run(x, y)`` (a conv forward) on the kernels' rows (``ir_mul`` with ``conv_blocks``),
        then the ``mean`` reduce's scaling; the result in the spec's rows."""
        cols = self._conv_columns
        if cols is not None:
            x, y = cols.to_kernels(x, y)
        out = run(x, y)
        if self.conv_kernels.reduce == "mean":
            out = out * graph.inv_degree[:, None]
        return out if cols is None else cols.from_kernels(out)

    # ------------------------------------------------------------------ conv_radial

    def _radial_launchers(self, r: RadialKernels):
        k = self.kernels

        # operands (a, b, rf, wr): rf edge rows, wr (H, numel) given whole (the shared_arg). Segment
        # tiles of DOT_MIN edges or more (weights formed by dots) keep one row per running sum
        # (step_sums): one per edge of the tile would not fit in registers
        def forward(a, b, rf, wr, graph, *, block_batch, interpret):
            return launch.launch_segments(k.NAME, r.fwd, (a, b, rf, wr), node_arg=0, shared_arg=3,
                                          perm=graph.perm_dst, rowptr=graph.rowptr_dst, gather=graph.gather_dst,
                                          num_nodes=a.shape[0], out_width=k.IDIM_OUT, block_edges=block_batch[1],
                                          interpret=interpret, num_warps=self._num_warps(a.dtype),
                                          step_sums=block_batch[1] >= DOT_MIN)

        def backward_x1(g, b, rf, wr, graph, *, block_batch, interpret):
            return launch.launch_segments(k.NAME, r.bwd_x1, (g, b, rf, wr), node_arg=0, shared_arg=3,
                                          perm=graph.perm_src, rowptr=graph.rowptr_src, gather=graph.gather_src,
                                          num_nodes=g.shape[0], out_width=k.IDIM_IN1, block_edges=block_batch[1],
                                          interpret=interpret, num_warps=self._num_warps(g.dtype),
                                          step_sums=block_batch[1] >= DOT_MIN)

        def backward_x2(a, g, rf, wr, graph, *, block_batch, interpret):
            return launch.launch_edges(k.NAME, r.bwd_x2, (a, g, rf, wr), gathers={0: graph.src, 1: graph.dst},
                                       shared_arg=3, shared_out=False, num_nodes=a.shape[0], out_width=k.IDIM_IN2,
                                       block_edges=block_batch[0], interpret=interpret, num_warps=self._num_warps(a.dtype))

        return forward, backward_x1, backward_x2

    def _radial_backward_fused(self, a, b, rf, wr, g, graph, *, block_batch, interpret):
        k, r = self.kernels, self.radial_kernels
        return launch.conv_backward_fused(k.NAME, r.backward_fused_kernels, (a, b, rf, wr, g), graph,
                                          num_nodes=a.shape[0], dim_in2=k.IDIM_IN2, weight_numel=k.IWEIGHT_NUMEL,
                                          gx1_segments=r.gx1_segments, block_edges=block_batch[0],
                                          segment_edges=block_batch[1], interpret=interpret, num_warps=self._num_warps(a.dtype),
                                          step_sums=block_batch[1] >= DOT_MIN)

    def conv_radial(self, node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes: int, *,
                    check: bool = True, interpret: bool | None = None, block_edges: int | None = None,
                    segment_edges: int | None = None):
        """``conv(node_features, edge_attr, radial_features @ radial_weight, src, dst, num_nodes)``
        with each edge's weights formed on chip, or by a matmul where ``radial.materialize``
        (the generated module's ``conv_radial``)."""
        if self.radial_kernels is None:
            raise ValueError(f"{self.kernels.NAME}: no conv_radial; set radial_features = H in the spec (with "
                             "conv = true and per-edge weights)")
        x, y, rf, wr, src, dst, num_nodes = check_conv_radial_inputs(
            node_features, edge_attr, radial_features, radial_weight, src, dst, num_nodes, dim_in1=self.dim_in1,
            dim_in2=self.dim_in2, weight_numel=self.weight_numel, radial=self.radial_kernels.features,
            dtypes=self.dtypes, check=check)
        if num_nodes == 0:
            return jnp.zeros((0, self.dim_out), x.dtype)
        block = (check_block_batch(block_edges, self._block_batch(x.dtype)),
                 check_block_batch(segment_edges, self._segment_edges(x.dtype)))
        return self._conv_radial(x, y, rf, wr, src, dst, num_nodes=num_nodes, block=block,
                                 interpret=use_interpret(interpret))

    def _conv_radial_traced(self, x, y, rf, wr, src, dst, *, num_nodes: int, block: tuple[int, int], interpret: bool):
        if self.radial_ops is None:  # materialized: the matmul at full precision (as the unfused reference)
            w = jnp.matmul(rf, wr, precision=jax.lax.Precision.HIGHEST)
            return self._conv_traced(x, y, w, src, dst, num_nodes=num_nodes, block=block, interpret=interpret)
        rows = max(round_up(y.shape[0], block[0]), block[0])
        graph = conv_graph(src, dst, num_nodes, rows, x.dtype)
        rf = pad_rows(rf, rows)
        return self._on_kernel_rows(
            lambda a, b: self.radial_ops.fwd(a, pad_rows(b, rows), rf, wr, graph, block, interpret), x, y, graph)

    def pad_graph(self, node_features, edge_attr, weights, src, dst, num_nodes: int, *, min_nodes: int = 16,
                  min_edges: int = 64) -> PaddedGraph:
        """``padding.pad_graph`` with this product's weight sharing."""
        return pad_graph(node_features, edge_attr, weights, src, dst, num_nodes, shared_weights=self.shared_weights,
                         min_nodes=min_nodes, min_edges=min_edges)
