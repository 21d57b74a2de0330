"""Lowering: a validated ``TensorProductSpec`` plus exact CG to the kernel IR."""

from __future__ import annotations

from .cg import scaled_nonzeros
from .instructions import normalized_path_alphas, normalized_path_weights, path_shape
from .ir import ITEMSIZE, Block, CGNonzero, PathIR, TensorProductIR
from .irreps import Irreps
from .spec import TensorProductSpec

__all__ = ["lower", "blocks"]


def blocks(irreps: Irreps, layout: str) -> tuple[Block, ...]:
    """Operand blocks of ``irreps`` with offsets and strides for ``layout``."""
    out, offset = [], 0
    for idx, mi in enumerate(irreps):
        d = mi.ir.dim
        sm, sc = (d, 1) if layout == "mul_ir" else (1, mi.mul)
        out.append(Block(idx, mi.mul, mi.ir.l, mi.ir.p, offset, sm, sc))
        offset += mi.dim
    return tuple(out)


def _path_flops(mode: str, nnz: int, m1: int, m2: int, mo: int, dim_out: int, has_weight: bool) -> int:
    # Direct evaluation: per channel pair, each nonzero is x1*x2 then a multiply-add with
    # its coefficient (3 flops); then the weight contraction into the output.
    pairs = m1 if mode == "uuu" else m1 * m2
    fan = mo if mode == "uvw" else 1
    contract = 2 * pairs * fan * dim_out if has_weight else pairs * dim_out
    return 3 * nnz * pairs + contract


def lower(spec: TensorProductSpec) -> TensorProductIR:
    """Lower ``spec``: fold both normalizations into the CG nonzeros (exactly, rounded once:
    ``eqdsl.cg.scaled_nonzeros``, in the spec's ``cg_convention``), lay out operands.

    Everything downstream (the kernels, and ``eqdsl.reference``, the oracle) reads the
    coefficients from the IR's nonzeros, so the CG sign convention is decided here once.
    """
    in1, in2, out = spec.irreps_in1, spec.irreps_in2, spec.irreps_out
    norm = (in1, in2, out, spec.instructions, spec.irrep_normalization, spec.path_normalization)
    alphas, weights = normalized_path_alphas(*norm), normalized_path_weights(*norm)
    paths, w_off, flops = [], 0, 0
    for idx, (ins, alpha, pw) in enumerate(zip(spec.instructions, alphas, weights)):
        l1, l2, lo = in1[ins.i_in1].ir.l, in2[ins.i_in2].ir.l, out[ins.i_out].ir.l
        nz = tuple(
            sorted(
                (CGNonzero(i, j, k, c) for i, j, k, c in scaled_nonzeros(l1, l2, lo, alpha, spec.cg_convention)),
                key=lambda n: (n.k, n.i, n.j),
            )
        )
        shape = path_shape(ins, in1, in2, out)
        f = _path_flops(ins.mode, len(nz), in1[ins.i_in1].mul, in2[ins.i_in2].mul, out[ins.i_out].mul,
                        2 * lo + 1, ins.has_weight)
        p = PathIR(idx, ins.mode, ins.i_in1, ins.i_in2, ins.i_out, ins.has_weight, pw,
                   w_off if ins.has_weight else -1, shape, nz, f)
        w_off += p.weight_numel
        flops += f
        paths.append(p)
    per_batch_elems = in1.dim + in2.dim + out.dim + (0 if spec.shared_weights else w_off)
    return TensorProductIR(
        name=spec.name,
        irreps_in1=str(in1),
        irreps_in2=str(in2),
        irreps_out=str(out),
        layout=spec.layout,
        irrep_normalization=spec.irrep_normalization,
        path_normalization=spec.path_normalization,
        shared_weights=spec.shared_weights,
        dtypes=spec.dtypes,
        dim_in1=in1.dim,
        dim_in2=in2.dim,
        dim_out=out.dim,
        weight_numel=w_off,
        in1=blocks(in1, spec.layout),
        in2=blocks(in2, spec.layout),
        out=blocks(out, spec.layout),
        paths=tuple(paths),
        flops_per_batch=flops,
        bytes_per_batch=tuple((d, per_batch_elems * ITEMSIZE[d]) for d in spec.dtypes),
        conv=spec.conv,
        reduce=spec.reduce,
        deterministic=spec.deterministic,
        cg_convention=spec.cg_convention,
        radial_features=spec.radial_features,
    )
