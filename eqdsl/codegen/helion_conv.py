"""Helion (PyTorch) fused graph convolution: ``TensorProductIR`` -> ``helion_conv_kernels.py`` + ``torch_conv.py``.

Only for specs with ``conv = true``. ``out[dst[e]] += TP(x[src[e]], edge_attr[e], w[e])``
is the derivative ``dF/dg`` of the four-linear form of the tensor product with the
node operands gathered per edge::

    F(x, y, W, G) = sum_e sum_paths W[e] C x[src[e]] y[e] G[dst[e]]

so the convolution and its derivatives are the four kernel families of
``helion_backend`` (built by its ``kernel_context``, not copied) with the row index of
each operand rewritten (``x1_<i>[tile_b, ...]`` -> ``x1_<i>[s_idx, ...]``)::

    conv_fwd    (x, y, W) -> out (num_nodes, dim_out)  gather x by src, scatter into dst
    conv_bwd_x  (G, y, W) -> gx  (num_nodes, dim_in1)  gather G by dst, scatter into src
    conv_bwd_y  (x, G, W) -> gy  (num_edges, dim_in2)  gathers only
    conv_bwd_w  (x, y, G) -> gw  (num_edges, weight_numel), or with shared weights
                                 per-program partial sums (summed by the op)

plus ``*_lin`` variants of the first three over the weighted paths only when some path
is unweighted (``F`` is then affine in ``W``; the derivatives of ``conv_bwd_w`` use them).
No per-edge message ever reaches memory: the gather of node rows and the scatter into
nodes happen inside the kernels.

As in the plain tensor product, the kernels take whole rows: ``flat_access`` folds the
emitters' per-block view accesses into column arithmetic after rendering and keeps the
row index (``s_idx``, ``d_idx``, ``eid``, ``node``, ...) as it is. For mace_large,
``x1_2[s_idx, 1, tile_c]`` becomes ``x[s_idx, 640 + tile_c.index]`` (block 2 starts at
column 512, 128 channels per component). A launch passes the graph tensors and the op's
``(rows, dim)`` tensors (``x``, ``y``, ``weights``, ``g`` and the computed ``out`` /
``gx`` / ``gy`` / ``gw``); the host builds no views.

The scatter is either ``hl.atomic_add`` into a zeroed output (``deterministic =
false``), or (``deterministic = true``) a segment reduction: edges stably sorted by the
scatter index, CSR row pointers, one program per node looping over its edge range
(``hl.tile(start, end)``, a data-dependent bound) in a fixed order, accumulating in
registers and writing each node row once: the same bits every run.

A spec may also choose the segment reduction for speed alone (``Tuning.segment`` in the
``conv_fwd`` or ``conv_bwd_x`` sub-table, with ``deterministic = false``): one edge per loop
step leaves nothing to sum across warps, and no atomics (mace_large's forward on 114,688
edges: 863 against 1,853 us, H100). Sorting costs host time, so graphs of fewer than
``Tuning.segment_min_edges`` edges are not sorted and that op launches atomic copies of
its kernels (``*_small``, ``small_graph_kernels``). The fused backward keeps its atomics.

Channel tiles as a grid axis (``Tuning.grid_c``, ``helion_backend._grid_c``): an atomic or
per-edge kernel runs ``for tile_c, tile_b in hl.tile([M, num_edges])``, a segment kernel
``for tile_c, tile_n in hl.tile([M, num_nodes], block_size=[block_c, 1])`` with ``node =
tile_n.begin``: each program owns one node's columns of one channel tile, which no other
channel tile touches, and sums its edges in the same fixed order (still bitwise
reproducible). Each program loads the edge indices and per-edge scalars it needs itself.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..ir import TensorProductIR
from . import helion_backend as hb
from .flat_access import View, flat_params, flatten_kernels
from .render import render

__all__ = [
    "render_files", "conv_kernel_context", "small_graph_kernels", "view_map", "segment_ops", "segment_min_edges",
    "graph_names", "CONV_FAMILIES",
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
# conv op -> argument names (the tensors of the generated op)
_ARGS = {
    "fwd": ("x", "y", "weights"),
    "bwd_x": ("g", "y", "weights"),
    "bwd_y": ("x", "g", "weights"),
    "bwd_w": ("x", "y", "g"),
}
# tensors of the TP kernels' views -> conv op tensors (the whole-row kernel parameters)
_TP_TENSOR = {"x1": "x", "x2": "y", "g": "g", "weights": "weights", "out": "out", "gx1": "gx", "gx2": "gy", "gw": "gw"}
# computed tensor of each conv op
_RESULT = {"fwd": "out", "bwd_x": "gx", "bwd_y": "gy", "bwd_w": "gw"}
# row indices the conv kernels gather with: 1-D index tensors, not tiles (flat_access)
_GATHERED = frozenset({"s_idx", "d_idx", "eid", "rows", "srows", "drows"})
# size of the computed operand's rows / row length, per conv op
_OUT = {
    "fwd": ("num_nodes", "DIM_OUT"),
    "bwd_x": ("num_nodes", "DIM_IN1"),
    "bwd_y": ("num_edges", "DIM_IN2"),
}
_DOC = {
    "fwd": "Fused convolution (dF/dG): gather x by src, scatter into dst",
    "bwd_x": "Gradient with respect to the node features (dF/dx): gather G by dst, scatter into src",
    "bwd_y": "Gradient with respect to the edge attributes (dF/dy), one row per edge",
    "bwd_w": "Gradient with respect to the weights (dF/dW)",
}

_STORE = re.compile(r"^(\w+)\[tile_b, (\d+), tile_c\] = (\w+)$")


def _base(op: str) -> str:
    return op[: -len("_lin")] if op.endswith("_lin") else op


def _rewrite(text: str, edge: str) -> str:
    """Row indices of a TP kernel line for the convolution.

    ``x1`` (node features) rows come from ``s_idx``, ``g`` (node cotangents) rows from
    ``d_idx``, ``x2`` / weights rows from ``edge`` (``tile_b`` or the sorted ``eid``).
    """
    text = re.sub(r"\b(x1_\d+)\[tile_b,", r"\1[s_idx,", text)
    text = re.sub(r"\b(g_\d+)\[tile_b,", r"\1[d_idx,", text)
    text = re.sub(r"hl\.load\((x1_\d+), \[rows,", r"hl.load(\1, [srows,", text)
    text = re.sub(r"hl\.load\((g_\d+), \[rows,", r"hl.load(\1, [drows,", text)
    if edge != "tile_b":
        text = re.sub(r"\b(x2_\d+|w\d+)\[tile_b,", rf"\1[{edge},", text)
    return text


def _uses(lines: list[str], name: str) -> bool:
    pat = re.compile(rf"\b{name}\b")
    return any(pat.search(s) for s in lines)


def _all_lines(k: dict) -> list[str]:
    out = list(k.get("scalars", []))
    for g in k["channel_groups"]:
        if "loads" in g:  # block kernels
            out += g["loads"] + g.get("deferred_stores", [])
            for oc in g["outs"]:
                out += oc["updates"] + oc["stores"]
            for r in g["reductions"]:
                out += r["loads"] + r["updates"]
        else:  # weight kernels
            scopes = ([g["direct"]] if g["direct"] else []) + g["reductions"]
            for s in scopes:
                out += s["loads"] + s["updates"] + s.get("accs", []) + s.get("stores", [])
    return out


def view_map(ir: TensorProductIR) -> dict[str, View]:
    """The per-block views the conv kernels' emitters index (``ir_mul`` ones, as
    ``helion_backend.view_map``), on the conv ops' tensors (``x1_0`` -> columns of ``x``)."""
    return {
        name: View(v.name, _TP_TENSOR[v.base], v.offset, v.shape, v.batched)
        for name, v in hb.view_map(ir, False).items()
    }


def _convert(k: dict, family: str, segment: bool, views: dict[str, View]) -> dict:
    """A TP kernel context -> the convolution's (rewritten lines, graph parameters, grid),
    taking whole rows (``views``; the body is rewritten after rendering). ``segment``: the
    family's node scatter is a segment reduction (``segment_ops``), not atomics."""
    op, scatter = CONV_FAMILIES[family]
    segment = segment and scatter != "edge"
    edge = "eid" if segment else "tile_b"
    rw = lambda s: _rewrite(s, edge)  # noqa: E731
    k = dict(k, name=k["name"].replace("tp_", "conv_", 1), doc=_DOC[_base(op)] + ": " + k["doc"].split(": ", 1)[1])
    k["scalars"] = [rw(s) for s in k.get("scalars", [])]
    scatter_idx = {"dst": "d_idx", "src": "s_idx"}.get(scatter)
    groups = []
    for g in k["channel_groups"]:
        g = dict(g)
        if "outs" in g:  # fwd / bwd_x1 / bwd_x2 families
            g["loads"] = [rw(s) for s in g["loads"]]
            g["reductions"] = [dict(r, loads=[rw(s) for s in r["loads"]], updates=[rw(s) for s in r["updates"]])
                               for r in g["reductions"]]
            outs, finals = [], []

            def store(line: str) -> str:
                m = _STORE.match(line)
                if scatter == "edge":
                    return line
                assert m, line
                param, comp, acc = m.groups()
                if segment:  # masked rows (past the node's edge range) contribute nothing
                    tot = "tot" + acc[len("acc"):]
                    finals.append({"init": f"{tot} = hl.zeros([tile_c], dtype={param}.dtype)",
                                   "store": f"{param}[node, {comp}, tile_c] = {tot}"})
                    return f"{tot} = {tot} + torch.where(ok, {acc}, 0).sum(0)"
                return f"hl.atomic_add({param}, [{scatter_idx}, {comp}, tile_c], {acc})"

            for oc in g["outs"]:
                outs.append(dict(oc, updates=[rw(s) for s in oc["updates"]], stores=[store(s) for s in oc["stores"]]))
            g["deferred_stores"] = [store(s) for s in g["deferred_stores"]]
            g["outs"] = outs
            g["finals"] = finals
        else:  # bwd_w
            def scope(s: dict | None) -> dict | None:
                if s is None:
                    return None
                return dict(s, **{key: [rw(x) for x in s[key]] for key in ("loads", "updates", "accs", "stores")})

            g["direct"] = scope(g["direct"])
            g["reductions"] = [scope(r) for r in g["reductions"]]
        groups.append(g)
    k["channel_groups"] = groups
    lines = _all_lines(k)
    uses_s, uses_d = _uses(lines, "s_idx") or _uses(lines, "srows"), _uses(lines, "d_idx") or _uses(lines, "drows")
    if segment:
        gather = "src" if scatter == "dst" else "dst"  # the other end of each edge
        graph = ["order", "ptr", gather]
        k["kind"] = "segment"
        k["index_lines"] = [f"{'s_idx' if gather == 'src' else 'd_idx'} = {gather}[eid]"]
        k["out_param"] = views[next(p for p in k["params"] if p.startswith(("out_", "gx1_")))].base
    else:
        graph = ["src", "dst"]
        k["kind"] = {"block": "atomic" if scatter != "edge" else "edge"}.get(k["kind"], k["kind"])
        k["index_lines"] = ([f"s_idx = src[tile_b]"] if uses_s else []) + ([f"d_idx = dst[tile_b]"] if uses_d else [])
        k["row_lines"] = ([f"srows = hl.load(src, [rows], extra_mask=ok)"] if uses_s else []) + (
            [f"drows = hl.load(dst, [rows], extra_mask=ok)"] if uses_d else []
        )
    k["graph"] = graph
    k["params"] = graph + flat_params(k["params"], views)
    return k


# the conv ops that scatter into nodes, and the graph tensors a segment reduction of each reads
_NODE_OPS = {"conv_fwd": ("dst_order", "dst_ptr"), "conv_bwd_x": ("src_order", "src_ptr")}
# edges per loop step of a segment op whose sub-table sets no block_b: more than one
# makes every output component a cross-warp sum per step (Tuning.segment)
SEGMENT_BLOCK_B = 1
# edges per program of the atomic kernels a non-deterministic segment op launches on small
# graphs (Tuning.segment_min_edges); the atomic forward's tuned tiles were 2 and 4 rows
SMALL_GRAPH_BLOCK_B = 4


def segment_ops(ir: TensorProductIR, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> tuple[str, ...]:
    """The conv ops (of ``conv_fwd``, ``conv_bwd_x``) whose node scatter is a segment
    reduction: both with ``deterministic = true``, else those tuned ``segment = 1``."""
    if not ir.conv:
        return ()
    return tuple(op for op in _NODE_OPS if ir.deterministic or hb.tuning_of(tuning, op).segment)


def graph_names(ir: TensorProductIR, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> tuple[str, ...]:
    """The graph tensors every conv op takes after its three operands: ``src``, ``dst``,
    then the sort order and CSR row pointers of each segment-reduced scatter."""
    return ("src", "dst") + tuple(name for op in segment_ops(ir, tuning) for name in _NODE_OPS[op])


def _segment_steps(tuning: hb.TuningTable, ops: tuple[str, ...]) -> hb.TuningTable:
    """``tuning`` with ``block_b = SEGMENT_BLOCK_B`` for the segment ops that do not set it."""
    if isinstance(tuning, hb.Tuning):  # one Tuning for every op: as given
        return tuning
    keys = {k for k, _ in tuning}
    return tuple(tuning) + tuple((f"{op}.block_b", SEGMENT_BLOCK_B) for op in ops if f"{op}.block_b" not in keys)


def segment_min_edges(ir: TensorProductIR, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> int:
    """Edges from which a segment op sorts the graph; below, a non-deterministic one
    launches its atomic kernels (``small_graph_kernels``). One value for the module (the
    graph is sorted once for every op): ``conv_fwd``'s, or ``conv_bwd_x``'s when only that
    op is a segment op. 0 with ``deterministic = true`` or without segment ops."""
    seg = segment_ops(ir, tuning)
    if ir.deterministic or not seg:
        return 0
    return hb.tuning_of(tuning, seg[0]).segment_min_edges


def small_graph_kernels(ir: TensorProductIR, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Per non-deterministic segment op (``fwd``, ``bwd_x``, ``*_lin``), its atomic kernels
    (named ``<kernel>_small``, ``SMALL_GRAPH_BLOCK_B`` edges per program) for graphs of
    fewer than ``segment_min_edges`` edges, where sorting them costs more host time than
    the segment kernel saves. ``{}`` when there is none (also with ``segment_min_edges = 0``)."""
    seg = segment_ops(ir, tuning) if segment_min_edges(ir, tuning) else ()
    if not seg:
        return {}
    views = view_map(ir)
    if isinstance(tuning, hb.Tuning):
        table = replace(tuning, block_b=SMALL_GRAPH_BLOCK_B, block_b_min=min(tuning.block_b_min, SMALL_GRAPH_BLOCK_B))
    else:
        table = tuple(tuning) + tuple((f"{op}.block_b", SMALL_GRAPH_BLOCK_B) for op in seg)
    return {
        CONV_FAMILIES[f][0]: [dict(k, name=k["name"] + "_small") for k in (_convert(k, f, False, views) for k in ks)]
        for f, ks in hb.kernel_context(ir, table, op_of=_tuning_op).items() if _tuning_op(f) in seg
    }


def conv_kernel_context(ir: TensorProductIR, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> dict[str, list[dict]]:
    """Kernel contexts of the convolution, per conv op (``fwd``, ``bwd_x``, ``bwd_y``, ``bwd_w``, ``*_lin``);
    a spec's ``[tensor_product.tuning.conv_<op>]`` sub-table tunes that op's kernels."""
    views = view_map(ir)
    seg = segment_ops(ir, tuning)
    return {
        CONV_FAMILIES[f][0]: [_convert(k, f, _tuning_op(f) in seg, views) for k in ks]
        for f, ks in hb.kernel_context(ir, _segment_steps(tuning, seg), op_of=_tuning_op).items()
    }


def fused_conv_kernels(ir: TensorProductIR, tuning: hb.TuningTable, views: dict[str, View]) -> list[dict]:
    """The fused backward (``helion_fused``) of an atomic convolution, or ``[]``.

    The plain tensor product's fused kernels with the rows rewritten: ``x`` gathered by
    ``src``, ``G`` by ``dst``, ``y`` / ``W`` / ``gy`` / ``gw`` per edge, and ``gx``
    scattered into ``src`` with ``hl.atomic_add`` (so not for ``deterministic = true``,
    whose node gradients are segment reductions in a fixed order). Tuned as ``conv_bwd``.
    """
    from .helion_fused import fused_bwd_kernels, fused_bwd_reason

    t = hb.tuning_of(tuning, "conv_bwd")
    if ir.deterministic or not t.fuse_bwd or fused_bwd_reason(ir) is not None:
        return []
    out = []
    for k in fused_bwd_kernels(ir, t, native=False):
        def rw(line: str) -> str:
            m = _STORE.match(line)
            if m and m.group(1).startswith("gx1_"):
                return f"hl.atomic_add({m.group(1)}, [s_idx, {m.group(2)}, tile_c], {m.group(3)})"
            return _GX2.sub(lambda n: "gy" + n.group(1)[3:], _rewrite(line, "tile_b"))

        k = dict(k, name=k["name"].replace("tp_", "conv_", 1), doc=k["doc"].replace("dF/dx1, dF/dx2", "dF/dx, dF/dy"))
        for key in ("scalars", "init", "final"):
            k[key] = [rw(s) for s in k[key]]
        k["channel_groups"] = [dict(g, lines=[rw(s) for s in g["lines"]]) for g in k["channel_groups"]]
        k["index_lines"] = ["s_idx = src[tile_b]", "d_idx = dst[tile_b]"]
        k["params"] = ["src", "dst"] + [_GX2.sub(lambda n: "gy" + n.group(1)[3:], p) for p in flat_params(k["params"], views)]
        out.append(k)
    return out


# the fused kernels' gx2 / gx2p (whole-row names, not views) are the conv's gy / gyp
_GX2 = re.compile(r"\b(gx2p?)\b")


def _tuning_op(family: str) -> str:
    """The ``spec.TUNING_OPS`` name of a TP kernel family's conv kernels (``bwd_x1`` -> ``conv_bwd_x``)."""
    return "conv_" + CONV_FAMILIES[family][0].removesuffix("_lin")


def _calls(kernels: list[dict]) -> list[str]:
    return [f"_k.{k['name']}({', '.join(k['params'])})" for k in kernels]


def _launcher(op: str, kernels: list[dict], small: list[dict], names: tuple[str, ...]) -> dict:
    """Kernel calls of one conv op: its tensors are the kernels' parameters (no views);
    a segment op's ``order`` / ``ptr`` are the graph tensors of its scatter index
    (``order_arg``: the index of ``order`` among ``names``), ``small_calls`` its atomic
    kernels for small graphs."""
    segment = any(k["kind"] == "segment" for k in kernels)
    order = _NODE_OPS["conv_" + _base(op)] if segment else None
    return {
        "name": op,
        "calls": _calls(kernels),
        "small_calls": _calls(small),
        "tensors": list(_ARGS[_base(op)]) + [_RESULT[_base(op)]],
        "segment": segment,
        "order": order[0] if order else None,
        "ptr": order[1] if order else None,
        "order_arg": names.index(order[0]) if order else None,
    }


def render_files(ir: TensorProductIR, header: str, tuning: hb.TuningTable = hb.DEFAULT_TUNING) -> dict[str, str]:
    if not ir.conv:
        return {}
    views = view_map(ir)
    families = conv_kernel_context(ir, tuning)
    small = small_graph_kernels(ir, tuning)
    names = graph_names(ir, tuning)
    launchers = {op: _launcher(op, ks, small.get(op, []), names) for op, ks in families.items()}
    fused = fused_conv_kernels(ir, tuning, views)
    parts = sum(k["parts"] for k in fused)  # gy partial-sum rows the op adds (1: written directly)
    if fused:
        families["bwd"] = fused
        launchers["bwd"] = {"name": "bwd", "calls": _calls(fused),
                            "tensors": ["x", "y", "weights", "g", "gx", "gy" if parts == 1 else "gyp", "gw"],
                            "small_calls": [], "segment": False, "order": None, "ptr": None, "order_arg": None}
    convert = ir.layout == "mul_ir"
    seg = segment_ops(ir, tuning)
    ctx = {
        **hb.op_context(ir, tuning, bwd_w_op="conv_bwd_w"),
        "in1_blocks": repr(tuple((b.mul, b.dim) for b in ir.in1)),
        "in2_blocks": repr(tuple((b.mul, b.dim) for b in ir.in2)),
        "out_blocks": repr(tuple((b.mul, b.dim) for b in ir.out)),
        "convert_in1": convert and hb._layouts_differ(ir.in1),
        "convert_in2": convert and hb._layouts_differ(ir.in2),
        "convert_out": convert and hb._layouts_differ(ir.out),
        "launchers": launchers,
        "linear_ops": "fwd_lin" in families,
        "reduce": ir.reduce,
        "deterministic": ir.deterministic,
        "graph_names": names,
        "segment_ops": seg,
        # the indices sorted for the segment ops, and where the in-degree's row pointers are
        "sort_keys": [_NODE_OPS[op][0].removesuffix("_order") for op in seg],
        "dst_ptr_arg": names.index("dst_ptr") if "dst_ptr" in names else None,
        "segment_min_edges": segment_min_edges(ir, tuning),
        "fused_bwd": {
            "partials": parts,
            "zero_gy": any(len(k["x2_cols"]) < ir.dim_in2 for k in fused),
        } if fused else None,
    }
    kernels = [k for ks in families.values() for k in ks] + [k for ks in small.values() for k in ks]
    return {
        "helion_conv_kernels.py": flatten_kernels(render(
            "helion_conv_kernels.py.j2", header=header, name=ir.name, kernels=kernels,
            deterministic=ir.deterministic, segment_ops=seg, n_kernels={f: len(ks) for f, ks in families.items()}, **hb._summary(ir)
        ), views, _GATHERED),
        "torch_conv.py": render("torch_conv.py.j2", header=header, **ctx),
    }
