"""Text tables for ``eqdsl inspect``: paths, weights, CG nonzeros and costs."""

from __future__ import annotations

from .ir import TensorProductIR
from .irreps import Irreps
from .spec import TensorProductSpec

__all__ = ["summarize"]


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[c].rjust(widths[c]) if c in right else r[c].ljust(widths[c]) for c in range(len(r))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summarize(spec: TensorProductSpec, ir: TensorProductIR) -> str:
    """One tensor product: header lines and a table of its paths."""
    in1, in2, out = Irreps(ir.irreps_in1), Irreps(ir.irreps_in2), Irreps(ir.irreps_out)
    rows = [["#", "instruction (e3nn)", "irreps", "path_shape", "weights", "cg_nnz", "path_weight", "flops/batch"]]
    for p, ins in zip(ir.paths, spec.instructions):
        rows.append([
            str(p.index),
            str(ins),
            f"{in1[p.i_in1]} x {in2[p.i_in2]} -> {out[p.i_out]}",
            "x".join(map(str, p.path_shape)),
            str(p.weight_numel),
            str(len(p.nonzeros)),
            f"{p.path_weight:.6g}",
            str(p.flops),
        ])
    nnz = sum(len(p.nonzeros) for p in ir.paths)
    head = [
        f"{ir.name}: {ir.irreps_in1} x {ir.irreps_in2} -> {ir.irreps_out}",
        f"  layout {ir.layout}, irrep_normalization {ir.irrep_normalization}, path_normalization {ir.path_normalization}, "
        f"{'shared' if ir.shared_weights else 'per-batch'} weights",
        f"  dims: in1 {ir.dim_in1}, in2 {ir.dim_in2}, out {ir.dim_out}; paths {len(ir.paths)}; "
        f"weight_numel {ir.weight_numel}; CG nonzeros {nnz}",
    ]
    for dtype, nbytes in ir.bytes_per_batch:
        head.append(
            f"  {dtype}: {ir.flops_per_batch} FLOP and {nbytes} B per batch element, "
            f"arithmetic intensity {ir.flops_per_batch / nbytes:.2f} FLOP/B"
        )
    return "\n".join(head) + "\n\n" + _table(rows, right={0, 4, 5, 6, 7}) + "\n"
