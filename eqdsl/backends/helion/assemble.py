"""The Helion backend's files: ``helion_kernels.py`` + ``torch_ops.py``, and for ``conv = true``
``helion_conv_kernels.py`` + ``torch_conv.py``.

The kernel builders (``kernels``, ``fused``, ``conv``) return template contexts whose
statements are already printed (``printer``); here they are grouped per family and op,
the launchers and op contexts of the glue templates are built, and the templates render
(they only loop and substitute). The plain tensor product reads and writes ``mul_ir``
rows in place (``native``); the convolution's kernels run on ``ir_mul`` rows, which each
of its ops converts to and from (``eqdsl.runtime.torch.conv.ColumnPermutation``).
"""

from __future__ import annotations

from ...analysis import fused_bwd_reason
from ...runtime.layout import layouts_differ
from ..render import render
from ...ir import Block, TensorProductIR
from .conv import NODE_OPS, fused_conv_kernels, conv_kernel_context, fused_radial_kernels, graph_names, \
    radial_kernel_context, radial_materialized_bwd, segment_min_edges, segment_ops, small_graph_kernels, \
    small_radial_kernels
from .fused import FUSED_MODES, fused_bwd_kernels
from .kernels import ALL_FAMILIES, kernel_context, wsum_rows
from .tuning import DEFAULT_TUNING, TWIN, TuningTable, dtype_tuning, tuned_dtypes, tuning_of

__all__ = ["render_files", "op_namespace", "op_context"]

# Tensor of each operand in the generated op, and each family's computed one.
_IN_TENSOR = {"x1": "x1", "x2": "x2", "g": "g", "w": "weights"}
_OUT_TENSOR = {"fwd": "out", "bwd_x1": "gx1", "bwd_x2": "gx2", "bwd_w": "gw"}
for _f in ("fwd", "bwd_x1", "bwd_x2"):
    _OUT_TENSOR[_f + "_lin"] = _OUT_TENSOR[_f]
_GX2_PARTIALS = "gx2p"  # the (batch, parts * dim_in2) buffer of the fused kernels' gx2 partial sums


def op_namespace(name: str) -> str:
    """``torch.library`` namespace of the generated ops (the name is a validated identifier)."""
    return "eqdsl_" + "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


def _calls(kernels: list[dict]) -> list[str]:
    return [f"_k.{k['name']}({', '.join(k['params'])})" for k in kernels]


def _launcher(family: str, args: tuple[str, ...], kernels: list[dict]) -> dict:
    """Kernel calls of one family, for ``torch_ops.py``: the kernels take whole rows, so
    the launcher builds no views."""
    names = [_IN_TENSOR[a] for a in args] + [_OUT_TENSOR[family]]
    return {
        "name": family,
        "signature": ", ".join(f"{n}: torch.Tensor" for n in names),
        "calls": _calls(kernels),
    }


def _layouts_differ(blocks: tuple[Block, ...]) -> bool:
    return layouts_differ([(b.mul, b.dim) for b in blocks])


def op_context(ir: TensorProductIR, tuning: TuningTable = DEFAULT_TUNING, bwd_w_op: str = "bwd_w") -> dict:
    """Template values shared by the generated op modules (``torch_ops``, ``torch_conv``);
    ``wsum_rows`` follows the tuning of ``bwd_w_op`` (the kernels that write the partial sums)."""
    return {
        "name": ir.name,
        "namespace": op_namespace(ir.name),
        "layout": ir.layout,
        "dtypes": list(ir.dtypes),
        "torch_dtypes": "(" + ", ".join(f"torch.{d}" for d in ir.dtypes) + ("," if len(ir.dtypes) == 1 else "") + ")",
        "shared_weights": ir.shared_weights,
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "weight_numel": ir.weight_numel,
        "wsum_rows": wsum_rows(ir, tuning_of(tuning, bwd_w_op)),
        # a weighted path without nonzeros (zero path weight) writes nothing: zero-fill
        "zero_fill_w": any(p.has_weight and not p.nonzeros for p in ir.paths),
    }


def _summary(ir: TensorProductIR) -> dict:
    return {
        "irreps_in1": ir.irreps_in1,
        "irreps_in2": ir.irreps_in2,
        "irreps_out": ir.irreps_out,
        "n_paths": len(ir.paths),
        "n_nonzeros": sum(len(p.nonzeros) for p in ir.paths),
    }


def _fused_context(ir: TensorProductIR, tuning: TuningTable, native: bool) -> dict | None:
    """The fused backward (``fused``) for ``torch_ops.py``: kernels, launcher, and what its
    outputs need (``gx2`` partials to sum, columns no kernel writes to zero), or None
    when the product is not channelwise or ``fuse_bwd`` is 0."""
    t = tuning_of(tuning, "bwd")
    if not t.fuse_bwd or fused_bwd_reason(ir, FUSED_MODES) is not None:
        return None
    kernels = fused_bwd_kernels(ir, t, native)
    if not kernels:
        return None
    parts = sum(k["parts"] for k in kernels)
    gx2 = "gx2" if parts == 1 else _GX2_PARTIALS
    covered_x1 = {a for k in kernels for a in k["blocks_in1"]}
    return {
        "kernels": kernels,
        "launcher": {
            "name": "bwd",
            "signature": ", ".join(f"{a}: torch.Tensor" for a in ("x1", "x2", "weights", "g", "gx1", gx2, "gw")),
            "calls": _calls(kernels),
        },
        "partials": parts,
        "zero_gx2": any(len(k["x2_cols"]) < ir.dim_in2 for k in kernels),
        "zero_gx1": len(covered_x1) < len(ir.in1),
    }


def _tp_files(ir: TensorProductIR, header: str, tuning: TuningTable, twins=None) -> dict[str, str]:
    native = ir.layout == "mul_ir"
    kernel_layout = ir.layout
    families = kernel_context(ir, tuning, native)
    args = {f: a for f, _, a in ALL_FAMILIES}
    ops = {
        **op_context(ir, tuning),
        "launchers": {f: _launcher(f, args[f], ks) for f, ks in families.items()},
        "native": native,
        "kernel_layout": kernel_layout,
        "linear_ops": "fwd_lin" in families,
        "conv": ir.conv,
        "radial": ir.radial_features is not None,
    }
    fused = _fused_context(ir, tuning, native)
    if fused is not None:
        families["bwd"] = fused.pop("kernels")
        ops["launchers"]["bwd"] = fused.pop("launcher")
    ops["fused_bwd"] = fused
    all_kernels = [k for ks in families.values() for k in ks]
    if twins is not None:
        twins["helion_kernels.py"] = all_kernels
        return {"torch_ops.py": render("torch_ops.py.j2", header=header, **ops)}
    twins = _twins(ir, header, tuning, "helion_kernels.py", _tp_files)
    return {
        "helion_kernels.py": render(
            "helion_kernels.py.j2", header=header, name=ir.name, kernels=all_kernels + twins, layout=ir.layout,
            twins=[k["name"] for k in twins],
            n_kernels={f: len(ks) for f, ks in families.items()}, **_summary(ir)
        ),
        "torch_ops.py": render("torch_ops.py.j2", header=header, **ops),
    }


# conv op -> argument names (the tensors of the generated op)
_CONV_ARGS = {
    "fwd": ("x", "y", "weights"),
    "bwd_x": ("g", "y", "weights"),
    "bwd_y": ("x", "g", "weights"),
    "bwd_w": ("x", "y", "g"),
}
# computed tensor of each conv op
_CONV_RESULT = {"fwd": "out", "bwd_x": "gx", "bwd_y": "gy", "bwd_w": "gw"}
_RADIAL = ["radial_features", "radial_weight"]  # what conv_radial's ops take in place of the weights


def _radial_launchers(ir: TensorProductIR, tuning: TuningTable,
                      names: tuple[str, ...]) -> tuple[dict, list[dict], dict | None]:
    """``conv_radial``'s launchers (``radial_<op>``: its tensors, the weights replaced by
    ``_RADIAL``), all its kernels, and its fused backward's outputs (or None)."""
    launchers, kernels = {}, []
    small = small_radial_kernels(ir, tuning)
    for op, ks in radial_kernel_context(ir, tuning).items():
        base = op.removeprefix("radial_")
        segment = any(k["kind"] == "segment" for k in ks)
        launchers[op] = {"name": op, "calls": _calls(ks), "small_calls": _calls(small.get(op, [])), "segment": segment,
                         "tensors": list(_CONV_ARGS[base][:2]) + _RADIAL + [_CONV_RESULT[base]],
                         "order_arg": names.index(NODE_OPS["conv_" + base][0]) if segment else None}
        kernels += ks + small.get(op, [])
    fused = fused_radial_kernels(ir, tuning)
    if not fused:
        return launchers, kernels, None
    parts = sum(k["parts"] for k in fused)
    launchers["radial_bwd"] = {"name": "radial_bwd", "calls": _calls(fused), "small_calls": [], "segment": False,
                               "order_arg": None,
                               "tensors": ["x", "y"] + _RADIAL + ["g", "gx", "gy" if parts == 1 else "gyp", "gw"]}
    zero_gy = any(len(k["x2_cols"]) < ir.dim_in2 for k in fused)
    return launchers, kernels + fused, {"partials": parts, "zero_gy": zero_gy}


def _conv_launcher(op: str, kernels: list[dict], small: list[dict], names: tuple[str, ...]) -> dict:
    """Kernel calls of one conv op: its tensors are the kernels' parameters (no views);
    a segment op's launcher also takes ``order`` / ``ptr``, the graph tensors of its scatter
    index (``order_arg``: the index of ``order`` among ``names``), ``small_calls`` its atomic
    kernels for small graphs."""
    base = op.removesuffix("_lin")
    segment = any(k["kind"] == "segment" for k in kernels)
    order = NODE_OPS["conv_" + base] if segment else None
    return {
        "name": op,
        "calls": _calls(kernels),
        "small_calls": _calls(small),
        "tensors": list(_CONV_ARGS[base]) + [_CONV_RESULT[base]],
        "segment": segment,
        "order_arg": names.index(order[0]) if order else None,
    }


def _conv_files(ir: TensorProductIR, header: str, tuning: TuningTable, twins=None) -> dict[str, str]:
    families = conv_kernel_context(ir, tuning)
    small = small_graph_kernels(ir, tuning)
    names = graph_names(ir, tuning)
    launchers = {op: _conv_launcher(op, ks, small.get(op, []), names) for op, ks in families.items()}
    fused = fused_conv_kernels(ir, tuning)
    parts = sum(k["parts"] for k in fused)  # gy partial-sum rows the op adds (1: written directly)
    if fused:
        families["bwd"] = fused
        launchers["bwd"] = {"name": "bwd", "calls": _calls(fused),
                            "tensors": ["x", "y", "weights", "g", "gx", "gy" if parts == 1 else "gyp", "gw"],
                            "small_calls": [], "segment": False, "order_arg": None}
    convert = ir.layout == "mul_ir"
    seg = segment_ops(ir, tuning)
    radial, radial_kernels, radial_fused = _radial_launchers(ir, tuning, names)
    ctx = {
        **op_context(ir, tuning, bwd_w_op="conv_bwd_w"),
        "in1_blocks": repr(tuple((b.mul, b.dim) for b in ir.in1)),
        "in2_blocks": repr(tuple((b.mul, b.dim) for b in ir.in2)),
        "out_blocks": repr(tuple((b.mul, b.dim) for b in ir.out)),
        "convert_in1": convert and _layouts_differ(ir.in1),
        "convert_in2": convert and _layouts_differ(ir.in2),
        "convert_out": convert and _layouts_differ(ir.out),
        "launchers": launchers,
        "linear_ops": "fwd_lin" in families,
        "reduce": ir.reduce,
        "deterministic": ir.deterministic,
        "graph_names": names,
        "segment_ops": seg,
        "segment_min_edges": segment_min_edges(ir, tuning),
        "fused_bwd": {
            "partials": parts,
            "zero_gy": any(len(k["x2_cols"]) < ir.dim_in2 for k in fused),
        } if fused else None,
        "radial_features": ir.radial_features,
        "radial_launchers": radial,
        "radial_fused": radial_fused,
        "radial_materialized_bwd": radial_materialized_bwd(ir, tuning),
    }
    kernels = [k for ks in families.values() for k in ks] + [k for ks in small.values() for k in ks] + radial_kernels
    if twins is not None:
        twins["helion_conv_kernels.py"] = kernels
        return {"torch_conv.py": render("torch_conv.py.j2", header=header, **ctx)}
    twins = _twins(ir, header, tuning, "helion_conv_kernels.py", _conv_files)
    return {
        "helion_conv_kernels.py": render(
            "helion_conv_kernels.py.j2", header=header, name=ir.name, kernels=kernels + twins,
            twins=[k["name"] for k in twins],
            deterministic=ir.deterministic, segment_ops=seg, n_kernels={f: len(ks) for f, ks in families.items()},
            radial_kernels=[k["name"] for k in radial_kernels], radial_features=ir.radial_features, **_summary(ir)
        ),
        "torch_conv.py": render("torch_conv.py.j2", header=header, **ctx),
    }


def _twins(ir: TensorProductIR, header: str, tuning: TuningTable, source: str, files) -> list[dict]:
    """The kernels of ``source`` that a dtype's own tuning (``block_b_float64``, ...) makes
    differ from the shared ones, renamed ``<kernel>__<dtype>``.

    ``files(ir, header, tuning, twins)`` is ``_tp_files`` or ``_conv_files``: given a dict
    ``twins`` it stores its kernel contexts there and returns its glue file alone, which a
    dtype's tuning may not change (its keys touch block sizes and warps only): the ops,
    launchers and outputs are every dtype's.

    Raises:
        ValueError: a dtype's tuning changes the glue (a kernel split, partial sums).
    """
    pairs = tuning if isinstance(tuning, tuple) else ()
    dtypes = [d for d in tuned_dtypes(pairs) if d in ir.dtypes]
    if not dtypes:
        return []
    out: list[dict] = []
    base: dict = {}
    base_glue = files(ir, header, tuning, base)
    shared = {k["name"]: k for k in base[source]}
    for dtype in dtypes:
        mine: dict = {}
        if files(ir, header, dtype_tuning(pairs, dtype), mine) != base_glue:
            raise ValueError(f"{ir.name}: the {dtype} tuning keys change the ops' kernels or outputs, not only their blocks")
        names = [k["name"] for k in mine[source]]
        if names != list(shared):
            raise ValueError(f"{ir.name}: the {dtype} tuning keys change the kernels of {source}: {names} "
                             f"against {list(shared)}")
        out += [dict(k, name=k["name"] + TWIN + dtype) for k in mine[source] if k != shared[k["name"]]]
    return out


def render_files(ir: TensorProductIR, header: str, tuning: TuningTable = DEFAULT_TUNING) -> dict[str, str]:
    """The Helion backend's files of one package, ``{name: text}``: ``helion_kernels.py``
    and ``torch_ops.py``, and with ``ir.conv`` ``helion_conv_kernels.py`` and ``torch_conv.py``.

    Args:
        ir: the lowered tensor product.
        header: the generated files' first lines (``generate.Header``).
        tuning: one ``Tuning`` for every op, or a spec's ``tuning`` pairs (``tuning.tuning_of``).
    """
    files = _tp_files(ir, header, tuning)
    if ir.conv:
        files |= _conv_files(ir, header, tuning)
    return files
