"""Pallas backend entry point: ``TensorProductIR`` -> ``pallas_kernels.py`` + ``jax_ops.py``.

Every decision is made in Python: ``kernels`` / ``fused`` build each kernel body as
statements (``stmts``, arithmetic in ``eqdsl.kernel_ir``), ``passes`` rewrite their sums
and unroll their channel loops (spec keys ``pallas_factor``, ``pallas_fma``,
``pallas_unroll``), ``printer`` writes them as source lines,
and the templates only loop and substitute.

Kernel sets. Per kind (``plan.KINDS``: the forward and the three backwards, plus the
weighted-only ones of a product that mixes weighted and unweighted paths) a list of
kernels over consecutive output blocks (``kernels``). The conv may split further (spec
key ``pallas_conv_max_terms``): it then gets kernels of its own (``CONV_*_KERNELS``;
otherwise those name the plain product's).

Fused backward. A channelwise or fully connected product (``fused.fused_reason`` is None:
every path ``uvu`` or every path ``uvw``, weighted, one-channel ``x2``, per-batch weights) also gets
``backward_fused(x1, x2, w, g) = (dF/dx1, dF/dx2, dF/dW)``, one pass over ``g``
(``fused``), which the forward's VJP calls instead of the three.

Radial kernels. With ``radial_features = H`` (``conv_radial``) the conv's kinds that read
the weights (``plan.RADIAL_KINDS``, and the conv's fused backward if it has one) also
get a radial variant (``RADIAL_*_KERNELS``): the same bodies, split like the conv's, whose
operands ``rf_ref`` ``(rows, H)`` and ``wr_ref`` ``(H, weight_numel)`` replace ``w_ref`` and
whose weight reads are ``stmts.RadialRead`` statements (each path's weight tile formed
on chip as ``rf @ wr[:, columns]``, ``eqdsl.runtime.jax.tiles.radial_vec``). With
``pallas_radial_materialize = 1`` there are none: the runtime's ``conv_radial`` forms the
weights with a matmul and calls the conv's kernels.
"""

from __future__ import annotations

from ...analysis import mixed_weighting
from ..render import render
from ...ir import TensorProductIR
from ...runtime.pallas_abi import KERNEL_ABI
from .fused import fused_context
from .kernels import kernels as kernel_set
from .passes import factor_kernel, fma_kernel, unroll_kernel
from .plan import KINDS, RADIAL_KINDS, blocks as plan_blocks, annotate_radial, next_pow2, radial_max_cols, weight_layout
from .printer import print_body
from .tuning import BLOCK_ELEMS, MAX_BLOCK_BATCH, MIN_BLOCK_BATCH, tuning_of

__all__ = ["render_files", "build_context"]


def _every_kernel(kernels: dict, fused: dict | None, *families: dict | None) -> list[dict]:
    """Every kernel context of a build: the plain product's sets, its fused backward, and the
    conv's (and the radial conv's) own sets and fused backward."""
    out = [k for ks in kernels.values() for k in ks]
    out += fused["kernels"] if fused else []
    for family in families:
        if family:
            out += [k for st in family["kernel_sets"] for k in st["kernels"]]
            out += family["fused"]["kernels"] if family["fused"] else []
    return out


def build_context(ir: TensorProductIR, header: str, tuning=()) -> dict:
    """The templates' context: the product's metadata and every kernel context, each group
    with its ``lines`` of source (``tuning``: a spec's tuning pairs, ``tuning.tuning_of``)."""
    t = tuning_of(tuning)
    in1, in2, out = (plan_blocks(b, ir.layout) for b in (ir.in1, ir.in2, ir.out))
    wmap = weight_layout(ir, in1, in2, out)
    blocks = {"x1": in1, "x2": in2, "g": out}
    mixed = mixed_weighting(ir)
    kinds = [k for k, _, _, _ in KINDS if mixed or not k.endswith("_wo")]
    kernels = {kind: kernel_set(kind, ir, blocks, wmap) for kind in kinds}
    # The conv's kernels (and conv_radial's) run on ir_mul rows whatever the spec's layout; a
    # mul_ir conv permutes its operands and output (eqdsl.runtime.jax.columns): a segment
    # program splitting mul_ir tiles on chip converts each component's layout through shared
    # memory every loop step. H200, 2026-11-29, one call, jax_ops.conv with the permutations
    # against the mul_ir kernels, µs fwd / fwd+bwd on bulk Si: nequip_toluene float64 2,258 / 5,971
    # -> 1,533 / 4,357 (2 edges per step), float32 970 / 2,914 -> 896 / 2,394; mace_large float64
    # 2,310 / 7,695 -> 1,993 / 6,269, float32 1,043 / 3,488 -> 986 / 2,828; on 512 edges (float32)
    # 53 / 91 -> 62 / 108, within that graph's run-to-run spread (58 / 105 in the next call)
    conv_layout = "ir_mul" if ir.conv else ir.layout
    cblocks = blocks if conv_layout == ir.layout else {
        "x1": plan_blocks(ir.in1, conv_layout), "x2": plan_blocks(ir.in2, conv_layout), "g": plan_blocks(ir.out, conv_layout)}
    factored = t.factor > 0
    conv_fuse = bool(ir.conv) and t.conv_fuse_bwd
    # the conv's own kernels (pallas_conv_max_terms), split over more output blocks than the
    # plain product's. A segment program carries a running sum per output column of its
    # kernel; the split re-gathers only the inputs its kernels share (x1 rows, from L2).
    # The plain product keeps one kernel: split, it re-reads its inputs once per kernel (and,
    # before the kernels shared one output buffer, a concatenation joined the pieces: mace_large
    # fwd 467 -> 1,053 us, H100, 2026-11-25; the split without that pass is not re-measured).
    # pallas_conv_fused_max_terms: the conv's fused backward split further, down to part of
    # an x1 block's paths per kernel (each part writes a partial dF/dx1 message, added up
    # after the segment sum): fewer registers per program for one more message per part
    plain_fused = fused_context(ir, blocks, wmap, factored=factored) if t.fuse_bwd or conv_fuse else None

    def conv_kernels(terms, fused_terms, prefix: str, const: str) -> dict:
        return {
            "kernel_sets": [{"kind": kind, "const": const + kind.upper() + "_KERNELS",
                             "kernels": kernel_set(kind, ir, cblocks, wmap, terms, prefix)} for kind in kinds],
            "fused": fused_context(ir, cblocks, wmap, terms if fused_terms is None else fused_terms, prefix,
                                   split_blocks=fused_terms is not None, factored=factored) if conv_fuse else None,
            "fused_const": const + "BWD_FUSED_KERNELS",
            "segments_const": const + "FUSED_GX1_SEGMENTS",
        }

    conv_family = None
    if ir.conv and (t.conv_max_terms is not None or t.conv_fused_max_terms is not None or cblocks is not blocks):
        conv_family = conv_kernels(t.conv_max_terms, t.conv_fused_max_terms, "conv", "CONV_")
        same = cblocks is blocks and \
            [len(s["kernels"]) for s in conv_family["kernel_sets"]] == [len(kernels[k]) for k in kinds]
        if same and conv_family["fused"] is not None:
            same = len(conv_family["fused"]["kernels"]) == len(plain_fused["kernels"])
        if same:  # the budget splits nothing further: the conv uses the plain product's kernels
            conv_family = None
    # pallas_conv_max_terms_<dtype> / pallas_conv_fused_max_terms_<dtype>: that dtype's conv calls
    # run a family of their own (CONV_<DTYPE>_*), split within its budgets (float64's running sums
    # take twice the registers); a budget the dtype does not set is the conv's
    own_terms, own_fused = dict(t.conv_max_terms_by_dtype), dict(t.conv_fused_max_terms_by_dtype)
    conv_dtype_families = [
        {"dtype": dtype, **conv_kernels(own_terms.get(dtype, t.conv_max_terms),
                                        own_fused.get(dtype, t.conv_fused_max_terms),
                                        f"conv_{dtype}", f"CONV_{dtype.upper()}_")}
        for dtype in ir.dtypes if ir.conv and (dtype in own_terms or dtype in own_fused)
    ]
    separate = conv_family is not None
    fused = plain_fused if t.fuse_bwd or (conv_fuse and not separate) else None
    conv_fused = conv_fuse and (conv_family["fused"] if separate else fused) is not None
    # conv_radial: the radial variants of the conv's kinds that read the weights, split as the
    # conv's (same term budgets) and further where a kernel's dots would hold more columns of
    # the radial weight in shared memory than fit (plan.radial_max_cols, float32 at 16 rows:
    # the runtime forms a larger kernel's tiles with multiply-adds), and of its fused
    # backward if it has one (not split by columns: the runtime's fallback applies)
    radial = None
    if ir.radial_features is not None and t.radial_materialize:  # conv(x, y, rf @ wr): no kernels of its own
        radial = {"features": ir.radial_features, "kernel_sets": [], "fused": None, "materialize": True}
    elif ir.radial_features is not None:
        terms, fused_terms = t.conv_max_terms, t.conv_fused_max_terms
        radial = {
            "features": ir.radial_features,
            "kernel_sets": [{"kind": kind, "const": "RADIAL_" + kind.upper() + "_KERNELS",
                             "kernels": kernel_set(kind, ir, cblocks, wmap, terms, "radial", ir.radial_features,
                                                   radial_max_cols(next_pow2(ir.radial_features)))}
                            for kind in RADIAL_KINDS],
            "fused": fused_context(ir, cblocks, wmap, terms if fused_terms is None else fused_terms, "radial",
                                   split_blocks=fused_terms is not None, factored=factored,
                                   radial=ir.radial_features) if conv_fused else None,
            "materialize": False,
        }
    for k in _every_kernel(kernels, fused, conv_family, *conv_dtype_families, radial):
        if factored and not (t.factor == 2 and k["kind"].startswith("fwd")):  # fewer operations on channel tiles
            k.update(factor_kernel(k))
        if t.fma:
            k.update(fma_kernel(k))
        if t.unroll > 1:  # last: it renames the temporaries of the loops' steps
            k.update(unroll_kernel(k, t.unroll))
        if radial is not None:  # radial kernels: dot columns (the runtime's shared-memory estimate), precision
            annotate_radial(k, int(t.radial_dot))
        for g in k["groups"]:
            g["lines"] = print_body(g["body"], "    ")
    block_batch = t.block_batch
    if block_batch is None:
        widest = max(b.pad * (next_pow2(b.dim) if b.tile else 1) for b in in1 + in2 + out)
        block_batch = max(MIN_BLOCK_BATCH, min(MAX_BLOCK_BATCH, BLOCK_ELEMS // widest))
    tiles = sorted({b.desc for b in in1 + in2 + out if b.tile})

    return {
        "header": header,
        "kernel_abi": KERNEL_ABI,
        "name": ir.name,
        "conv": ir.conv,
        "reduce": ir.reduce,
        "deterministic": ir.deterministic,
        "summary": str(ir),
        "layout": ir.layout,
        "shared_weights": ir.shared_weights,
        "dtypes": repr(tuple(ir.dtypes)),
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "weight_numel": ir.weight_numel,
        "kweight_numel": max(ir.weight_numel, 1),
        "has_weights": ir.weight_numel > 0,
        "tiles": ", ".join(tiles),
        "block_batch": block_batch,
        "num_warps": t.num_warps,
        "num_warps_by_dtype": _dict_literal(t.num_warps_by_dtype),
        "segment_edges": t.segment_edges,
        "block_batch_by_dtype": _dict_literal(t.block_batch_by_dtype),
        "segment_edges_by_dtype": _dict_literal(t.segment_edges_by_dtype),
        "factor": t.factor,
        "fma": t.fma,
        "kernel_sets": [{"kind": kind, "const": kind.upper() + "_KERNELS", "kernels": kernels[kind]} for kind in kinds],
        "kernels": [k for kind in kinds for k in kernels[kind]],
        "num_kernels": {kind: len(kernels[kind]) for kind in kinds},
        "fused": fused,
        "tp_fused": fused is not None and t.fuse_bwd,
        "conv_fused": conv_fused,
        "conv_family": conv_family,
        # the conv's kernels on ir_mul rows of a mul_ir product: (mul, 2l+1) of x1's, x2's, out's blocks
        "conv_blocks": None if cblocks is blocks else
        [(repr(tuple((b.mul, b.dim) for b in bs)), name) for bs, name in ((ir.in1, "x1"), (ir.in2, "x2"), (ir.out, "out"))],
        "conv_dtype_families": conv_dtype_families,
        "radial": radial,
        "mixed_weighting": mixed,
        "flops_per_batch": ir.flops_per_batch,
        "bytes_per_batch": dict(ir.bytes_per_batch),
        "num_paths": len(ir.paths),
    }


def render_files(ir: TensorProductIR, header: str, tuning=()) -> dict[str, str]:
    """``pallas_kernels.py`` and ``jax_ops.py``; ``tuning``: a spec's tuning pairs (only the
    ``pallas_*`` keys are read, ``tuning.tuning_of``)."""
    ctx = build_context(ir, header, tuning)
    return {
        "pallas_kernels.py": render("pallas_kernels.py.j2", **ctx),
        "jax_ops.py": render("jax_ops.py.j2", **ctx),
    }


def _dict_literal(pairs) -> str:
    """``{"float64": 2}``: a dict display of ``(str, int)`` pairs, in their order."""
    return "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
