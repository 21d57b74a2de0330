"""The fused graph convolution's Helion kernels: the tensor product's kernels with the convolution's ``Operands``.

Only for specs with ``conv = true``. ``out[dst[e]] += TP(x[src[e]], edge_attr[e], w[e])``
is the derivative ``dF/dg`` of the four-linear form of the tensor product with the
node operands gathered per edge::

    F(x, y, W, G) = sum_e sum_paths W[e] C x[src[e]] y[e] G[dst[e]]

so the convolution and its derivatives are the four kernel families of ``kernels``
(built by its ``kernel_context``, not copied), given the convolution's addressing
(``conv_operands``) as a parameter: node rows gathered per edge (``x`` at ``s_idx =
src[e]``, ``G`` at ``d_idx = dst[e]``), edge rows (``y``, ``W``) at the edge, and the
computed node operand scattered::

    conv_fwd    (x, y, W) -> out (num_nodes, dim_out)  gather x by src, scatter into dst
    conv_bwd_x  (G, y, W) -> gx  (num_nodes, dim_in1)  gather G by dst, scatter into src
    conv_bwd_y  (x, G, W) -> gy  (num_edges, dim_in2)  gathers only
    conv_bwd_w  (x, y, G) -> gw  (num_edges, weight_numel), or with shared weights
                                 per-program partial sums (summed by the op)

plus ``*_lin`` variants of the first three over the weighted paths only when some path
is unweighted (``F`` is then affine in ``W``; the derivatives of ``conv_bwd_w`` use them).
No per-edge message ever reaches memory: the gather of node rows and the scatter into
nodes happen inside the kernels. For mace_large, component 1 of ``x`` block 2 at
channel tile ``tile_c`` is ``x[s_idx, 640 + tile_c.index]`` (block 2 starts at column
512, 128 channels per component). A launch passes the graph tensors and the op's
``(rows, dim)`` tensors (``x``, ``y``, ``weights``, ``g`` and the computed ``out`` /
``gx`` / ``gy`` / ``gw``); the host builds no views.

The scatter is either ``hl.atomic_add`` into a zeroed output (``deterministic =
false``), or (``deterministic = true``) a segment reduction: edges stably sorted by the
scatter index, CSR row pointers, one program per node looping over its edge range
(``hl.tile(start, end)``, a data-dependent bound) in a fixed order, reading edge rows
at ``eid = order[e]``, accumulating in registers and writing each node row once: the
same bits every run.

A spec may also choose the segment reduction for speed alone (``Tuning.segment`` in the
``conv_fwd`` or ``conv_bwd_x`` sub-table, with ``deterministic = false``): one edge per loop
step leaves nothing to sum across warps, and no atomics (mace_large's forward on 114,688
edges: 863 against 1,853 us, H100). Sorting costs host time, so graphs of fewer than
``Tuning.segment_min_edges`` edges are not sorted and that op launches atomic copies of
its kernels (``*_small``, ``small_graph_kernels``). The fused backward keeps its atomics.

Channel tiles as a grid axis (``Tuning.grid_c``, ``kernels.grid_c``): an atomic or
per-edge kernel runs ``for tile_c, tile_b in hl.tile([M, num_edges])``, a segment kernel
``for tile_c, tile_n in hl.tile([M, num_nodes], block_size=[block_c, 1])`` with ``node =
tile_n.begin``: each program owns one node's columns of one channel tile, which no other
channel tile touches, and sums its edges in the same fixed order (still bitwise
reproducible). Each program loads the edge indices and per-edge scalars it needs itself.

``conv_radial`` (spec ``radial_features = H``): the kernels of ``fwd``, ``bwd_x``, ``bwd_y``
and the fused backward again, with ``Operands.radial`` (``kernels.Radial``): every per-edge
weight tile formed on chip as ``radial_features[rows, :H] @ radial_weight[:H, cols]``
(``radial_kernel_context``, ``fused_radial_kernels``; docs/conv_radial.md).
"""

from __future__ import annotations

from dataclasses import replace

from ...analysis import fused_bwd_reason
from ...ir import TensorProductIR
from .fused import FUSED_MODES, fused_bwd_kernels
from .kernels import TILE_B, Operands, Radial, RadialTileShape, kernel_context
from .printer import Row
from .tuning import DEFAULT_TUNING, Tuning, TuningTable, tuning_of

__all__ = [
    "CONV_FAMILIES", "conv_operands", "conv_kernel_context", "small_graph_kernels", "fused_conv_kernels", "segment_ops",
    "segment_min_edges", "graph_names", "NODE_OPS", "SEGMENT_BLOCK_B", "SMALL_GRAPH_BLOCK_B", "RADIAL_FAMILIES",
    "radial_kernel_context", "fused_radial_kernels", "DOT_SETTINGS", "RADIAL_NODE_OPS", "radial_segment_ops",
    "sorted_scatters", "small_radial_kernels", "radial_materialized_bwd",
]

# TP family -> (conv op name, how the computed operand is written)
#   scatter_src / scatter_dst: a node operand, scattered by that index; edge: one row per edge
CONV_FAMILIES = {
    "fwd": ("fwd", "dst"),
    "bwd_x1": ("bwd_x", "src"),
    "bwd_x2": ("bwd_y", "edge"),
    "bwd_w": ("bwd_w", "edge"),
    "fwd_lin": ("fwd_lin", "dst"),
    "bwd_x1_lin": ("bwd_x_lin", "src"),
    "bwd_x2_lin": ("bwd_y_lin", "edge"),
}
_DOC = {
    "fwd": "Fused convolution (dF/dG): gather x by src, scatter into dst",
    "bwd_x": "Gradient with respect to the node features (dF/dx): gather G by dst, scatter into src",
    "bwd_y": "Gradient with respect to the edge attributes (dF/dy), one row per edge",
    "bwd_w": "Gradient with respect to the weights (dF/dW)",
}
# the conv ops' tensors (the whole-row kernel parameters) of each operand role
_TENSORS = (("x1", "x"), ("x2", "y"), ("g", "g"), ("w", "weights"), ("out", "out"), ("gx1", "gx"), ("gx2", "gy"),
            ("gw", "gw"), ("gx2p", "gyp"))
S_IDX, D_IDX, EID = Row("s_idx", True), Row("d_idx", True), Row("eid", True)


def conv_operands(scatter: str, segment: bool) -> Operands:
    """The convolution's addressing (``kernels.Operands``) of a kernel whose computed
    operand is written per ``scatter`` (``CONV_FAMILIES``: ``dst``, ``src`` or ``edge``);
    ``segment``: a node scatter as a sorted segment reduction (edge rows at ``eid``)."""
    edge = EID if segment else TILE_B
    return Operands(
        _TENSORS,
        rows=(("x1", S_IDX), ("x2", edge), ("g", D_IDX), ("w", edge)),
        sub_rows=(("x1", Row("srows", True)), ("x2", Row("rows", True)), ("g", Row("drows", True))),
        scatter="store" if scatter == "edge" else ("segment" if segment else "atomic"),
        scatter_row={"dst": D_IDX, "src": S_IDX}.get(scatter),
    )


def _base(op: str) -> str:
    return op.removesuffix("_lin")


def _conv_kernel(k: dict, family: str, segment: bool) -> dict:
    """A kernel context built with ``conv_operands``, completed for the conv template:
    its name, docstring, grid kind, graph parameters and the row indices it loads."""
    op, scatter = CONV_FAMILIES[family]
    k = dict(k, doc=f"{_DOC[_base(op)]}: {k['detail']}")
    uses_s = bool({"s_idx", "srows"} & k["rows_used"])
    uses_d = bool({"d_idx", "drows"} & k["rows_used"])
    if segment:
        gather = "src" if scatter == "dst" else "dst"  # the other end of each edge
        graph = ["order", "ptr", gather]
        k["kind"] = "segment"
        k["index_lines"] = [f"{'s_idx' if gather == 'src' else 'd_idx'} = {gather}[eid]"]
    else:
        graph = ["src", "dst"]
        k["kind"] = {"block": "atomic" if scatter != "edge" else "edge"}.get(k["kind"], k["kind"])
        k["index_lines"] = (["s_idx = src[tile_b]"] if uses_s else []) + (["d_idx = dst[tile_b]"] if uses_d else [])
        k["row_lines"] = (["srows = hl.load(src, [rows], extra_mask=ok)"] if uses_s else []) + (
            ["drows = hl.load(dst, [rows], extra_mask=ok)"] if uses_d else []
        )
    k["graph"] = graph
    k["params"] = graph + k["params"]
    return k


# the conv ops that scatter into nodes, and the graph tensors a segment reduction of each reads
NODE_OPS = {"conv_fwd": ("dst_order", "dst_ptr"), "conv_bwd_x": ("src_order", "src_ptr")}
# the radial ops that scatter into nodes, and the conv op whose scatter (and sort) each shares
RADIAL_NODE_OPS = {"conv_radial_fwd": "conv_fwd", "conv_radial_bwd_x": "conv_bwd_x"}
# edges per loop step of a segment op whose sub-table sets no block_b: more than one
# makes every output component a cross-warp sum per step (Tuning.segment)
SEGMENT_BLOCK_B = 1
# edges per program of the atomic kernels a non-deterministic segment op launches on small
# graphs (Tuning.segment_min_edges); the atomic forward's tuned tiles were 2 and 4 rows
SMALL_GRAPH_BLOCK_B = 4


def segment_ops(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> tuple[str, ...]:
    """The conv ops (of ``conv_fwd``, ``conv_bwd_x``) whose node scatter is a segment
    reduction: both with ``deterministic = true``, else those tuned ``segment = 1``."""
    if not ir.conv:
        return ()
    return tuple(op for op in NODE_OPS if ir.deterministic or tuning_of(tuning, op).segment)


def radial_segment_ops(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> tuple[str, ...]:
    """The radial ops (of ``conv_radial_fwd``, ``conv_radial_bwd_x``) whose node scatter is a
    segment reduction: both with ``deterministic = true``, else those tuned ``segment = 1``."""
    if not ir.conv or ir.radial_features is None:
        return ()
    return tuple(op for op in RADIAL_NODE_OPS if ir.deterministic or tuning_of(tuning, op).segment)


def sorted_scatters(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> tuple[str, ...]:
    """The node scatters (``NODE_OPS`` keys) whose index the graph is sorted by: those of the
    segment conv ops and of the segment radial ops (a conv op and its radial op share one sort)."""
    seg = set(segment_ops(ir, tuning)) | {RADIAL_NODE_OPS[op] for op in radial_segment_ops(ir, tuning)}
    return tuple(op for op in NODE_OPS if op in seg)


def graph_names(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> tuple[str, ...]:
    """The graph tensors every conv op takes after its three operands: ``src``, ``dst``,
    then the sort order and CSR row pointers of each sorted scatter (``sorted_scatters``)."""
    return ("src", "dst") + tuple(name for op in sorted_scatters(ir, tuning) for name in NODE_OPS[op])


def _segment_steps(tuning: TuningTable, ops: tuple[str, ...]) -> TuningTable:
    """``tuning`` with ``block_b = SEGMENT_BLOCK_B`` for the segment ops that do not set it."""
    if isinstance(tuning, Tuning):  # one Tuning for every op: as given
        return tuning
    keys = {k for k, _ in tuning}
    return tuple(tuning) + tuple((f"{op}.block_b", SEGMENT_BLOCK_B) for op in ops if f"{op}.block_b" not in keys)


def segment_min_edges(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> int:
    """Edges from which a segment op sorts the graph; below, a non-deterministic one
    launches its atomic kernels (``small_graph_kernels``). One value for the module (the
    graph is sorted once for every op): ``conv_fwd``'s, or ``conv_bwd_x``'s when only that
    op is a segment op, else the first segment radial op's. 0 with ``deterministic = true``
    or without segment ops."""
    seg = segment_ops(ir, tuning) + radial_segment_ops(ir, tuning)
    if ir.deterministic or not seg:
        return 0
    return tuning_of(tuning, seg[0]).segment_min_edges


def tuning_op(family: str) -> str:
    """The tuning op name (``[tuning.<op>]``) of a TP kernel family's conv kernels (``bwd_x1`` -> ``conv_bwd_x``)."""
    return "conv_" + _base(CONV_FAMILIES[family][0])


def _families(ir: TensorProductIR, tuning: TuningTable, seg: tuple[str, ...]) -> dict[str, list[dict]]:
    """Conv op -> kernel contexts; ``seg``: the tuning ops whose node scatter is a segment reduction."""
    def segment(family: str) -> bool:
        return tuning_op(family) in seg and CONV_FAMILIES[family][1] != "edge"

    def operands(family: str) -> Operands:
        return conv_operands(CONV_FAMILIES[family][1], segment(family))

    return {
        CONV_FAMILIES[f][0]: [_conv_kernel(k, f, segment(f)) for k in ks]
        for f, ks in kernel_context(ir, tuning, op_of=tuning_op, operands=operands, prefix="conv").items()
    }


def small_graph_kernels(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Per non-deterministic segment op (``fwd``, ``bwd_x``, ``*_lin``), its atomic kernels
    (named ``<kernel>_small``, ``SMALL_GRAPH_BLOCK_B`` edges per program) for graphs of
    fewer than ``segment_min_edges`` edges, where sorting them costs more host time than
    the segment kernel saves. ``{}`` when there is none (also with ``segment_min_edges = 0``)."""
    seg = segment_ops(ir, tuning) if segment_min_edges(ir, tuning) else ()
    if not seg:
        return {}
    if isinstance(tuning, Tuning):
        table = replace(tuning, block_b=SMALL_GRAPH_BLOCK_B, block_b_min=min(tuning.block_b_min, SMALL_GRAPH_BLOCK_B))
    else:
        table = tuple(tuning) + tuple((f"{op}.block_b", SMALL_GRAPH_BLOCK_B) for op in seg)
    ops = {CONV_FAMILIES[f][0] for f in CONV_FAMILIES if tuning_op(f) in seg}
    return {op: [dict(k, name=k["name"] + "_small") for k in ks] for op, ks in _families(ir, table, ()).items()
            if op in ops}


def conv_kernel_context(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Kernel contexts of the convolution, per conv op (``fwd``, ``bwd_x``, ``bwd_y``, ``bwd_w``, ``*_lin``);
    a spec's ``[tensor_product.tuning.conv_<op>]`` sub-table tunes that op's kernels."""
    seg = segment_ops(ir, tuning)
    return _families(ir, _segment_steps(tuning, seg), seg)


def _has_fused_bwd(ir: TensorProductIR, t: Tuning) -> bool:
    """An atomic convolution's fused backward exists (channelwise, ``fuse_bwd``, not deterministic)."""
    return not ir.deterministic and bool(t.fuse_bwd) and fused_bwd_reason(ir, FUSED_MODES) is None


def fused_conv_kernels(ir: TensorProductIR, tuning: TuningTable) -> list[dict]:
    """The fused backward (``fused``) of an atomic convolution, or ``[]``.

    The plain tensor product's fused kernels with the convolution's addressing: ``x``
    gathered by ``src``, ``G`` by ``dst``, ``y`` / ``W`` / ``gy`` / ``gw`` per edge, and
    ``gx`` scattered into ``src`` with ``hl.atomic_add`` (so not for ``deterministic =
    true``, whose node gradients are segment reductions in a fixed order). Tuned as ``conv_bwd``.
    """
    t = tuning_of(tuning, "conv_bwd")
    if not _has_fused_bwd(ir, t):
        return []
    ops = conv_operands("src", False)
    return [
        dict(k, index_lines=["s_idx = src[tile_b]", "d_idx = dst[tile_b]"], params=["src", "dst"] + k["params"])
        for k in fused_bwd_kernels(ir, t, native=False, ops=ops, grads="dF/dx, dF/dy, dF/dW", prefix="conv")
    ]


# ------------------------------------------------------------------ conv_radial

# the TP families whose conv kernels read per-edge weights, and so have radial variants
# (bwd_w does not read them: conv_radial's weight gradient is conv_bwd_w, then two matmuls)
RADIAL_FAMILIES = ("fwd", "bwd_x1", "bwd_x2")
# helion.kernel settings of the radial kernels: their on-chip products in IEEE float32
# (Helion's default dot precision is TF32, which rounds the operands to 10 mantissa bits:
# another function than radial_features @ radial_weight)
DOT_SETTINGS = 'dot_precision="ieee"'
# spec key radial_dot = 1: three TF32 tensor-core products (Helion 1.4 Settings.dot_precision
# "tf32x3", Triton's TF32x3 split of each float32 operand), about float32 accuracy, opt-in
FAST_DOT_SETTINGS = 'dot_precision="tf32x3"'


def _radial_operands(ir: TensorProductIR, scatter: str, segment: bool) -> Operands:
    return replace(conv_operands(scatter, segment), radial=Radial(ir.radial_features))


def _radial_doc(k: dict, radial_dot: int = 0) -> dict:
    return dict(k, doc=f"conv_radial: {k['doc']} Weights formed on chip: radial_features @ radial_weight.",
                settings=FAST_DOT_SETTINGS if radial_dot else DOT_SETTINGS)


def radial_materialized_bwd(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> bool:
    """Whether ``conv_radial``'s fused backward is the conv's fused backward at ``W = rf @ Wr``
    (``materialize = 1`` in ``conv_radial_bwd``'s sub-table, where the conv has a fused backward)."""
    return (ir.radial_features is not None and bool(tuning_of(tuning, "conv_radial_bwd").materialize)
            and _has_fused_bwd(ir, tuning_of(tuning, "conv_bwd")))


def radial_kernel_context(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Kernel contexts of ``conv_radial``'s ops (``radial_fwd``, ``radial_bwd_x``, ``radial_bwd_y``), or ``{}``
    without ``radial_features``.

    Each is the conv op's kernels with the weights formed on chip (``kernels.Radial``), named
    ``conv_radial_<family>_<n>`` and tuned as ``conv_radial_<op>`` (defaults: 16 edges per
    program, so that the product is a ``tl.dot``), not as the conv op: a segment op's one
    edge per step would leave a dot nothing to work on. The node scatters are segment
    reductions (``block_b`` edges a step, 16 by default) with ``deterministic = true`` or
    where the op's sub-table sets ``segment = 1`` (``radial_segment_ops``), else atomics. An
    op whose kernels read a weight tile of more than one channel axis (``uvw`` / ``uvv``
    reductions, ``kernels.RadialTileShape``), or tuned ``materialize = 1``, has none: the
    runtime forms its weights with a matmul and calls the conv op.
    """
    return _radial_families(ir, tuning, radial_segment_ops(ir, tuning))


def small_radial_kernels(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Per non-deterministic segment radial op (``radial_fwd``, ``radial_bwd_x``), its atomic
    kernels (named ``<kernel>_small``) for graphs of fewer than ``segment_min_edges`` edges,
    which are not sorted (as ``small_graph_kernels``). ``{}`` when there is none."""
    seg = radial_segment_ops(ir, tuning) if segment_min_edges(ir, tuning) else ()
    if not seg:
        return {}
    ops = {"radial_" + RADIAL_NODE_OPS[op].removeprefix("conv_") for op in seg}
    return {op: [dict(k, name=k["name"] + "_small") for k in ks]
            for op, ks in _radial_families(ir, tuning, ()).items() if op in ops}


def _radial_families(ir: TensorProductIR, tuning: TuningTable, seg: tuple[str, ...]) -> dict[str, list[dict]]:
    """Radial op -> kernel contexts; ``seg``: the radial tuning ops whose node scatter is a segment reduction."""
    if ir.radial_features is None:
        return {}
    out = {}
    for family in RADIAL_FAMILIES:
        op, scatter = CONV_FAMILIES[family]
        if tuning_of(tuning, "conv_radial_" + op).materialize:  # the runtime's matmul + conv op
            continue
        segment = "conv_radial_" + op in seg and scatter != "edge"
        ops = _radial_operands(ir, scatter, segment)
        try:
            ks = kernel_context(ir, tuning, op_of=lambda f: "conv_radial_" + CONV_FAMILIES[f][0],
                                operands=lambda f: ops, prefix="conv_radial", families=(family,))[family]
        except RadialTileShape:
            continue
        dot = tuning_of(tuning, "conv_radial_" + op).radial_dot
        out["radial_" + op] = [_radial_doc(_conv_kernel(k, family, segment), dot) for k in ks]
    return out


def fused_radial_kernels(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING) -> list[dict]:
    """``conv_radial``'s fused backward (``fused_conv_kernels`` with the weights formed on chip,
    tuned as ``conv_radial_bwd``), or ``[]``: it reads each edge's features tile once for
    ``dF/dx``, ``dF/dy`` and ``dF/dW`` (the last one feeds the two matmuls of the radial gradients)."""
    t = tuning_of(tuning, "conv_radial_bwd")
    if ir.radial_features is None or ir.deterministic or not t.fuse_bwd or t.materialize \
            or fused_bwd_reason(ir) is not None:
        return []
    ops = _radial_operands(ir, "src", False)
    return [
        _radial_doc(dict(k, index_lines=["s_idx = src[tile_b]", "d_idx = dst[tile_b]"],
                         params=["src", "dst"] + k["params"]), t.radial_dot)
        for k in fused_bwd_kernels(ir, t, native=False, ops=ops, grads="dF/dx, dF/dy, dF/dW", prefix="conv_radial")
    ]
