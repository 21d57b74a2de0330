"""Lowering a symmetric-contraction spec to its IR, and MACE's weights to the IR's layout.

``lower(spec)`` symmetrizes each exact U tensor (``eqdsl.symmetric.u_tensors``): the
polynomial ``sum_{i_1..i_nu} U[m, i_1, ..., i_nu, k] x_{i_1} ... x_{i_nu}`` has one
coefficient per monomial (a nondecreasing index tuple), the exact sum of U over the
monomial's distinct permutations. Monomials whose sum is exactly 0 are dropped (e.g. every
term of an antisymmetric path such as ``1o x 1o -> 1e``: its weight ``k`` still counts in
``num_params``, as in mace, and multiplies nothing). The result is deterministic: terms
sorted by ``(out, m, nu, k, monomial)``, floats rounded once from the exact values.

Weight layout (per element, ``weight_numel`` columns): output block after output block;
within block ``o`` of correlation ``N``, the order ``nu = N, N-1, ..., 1`` (mace's
``contractions[o].weights_max``, then its ``weights`` list, which runs from ``N-1`` down to
1); each ``(K, mul)`` block row-major (``k * mul + c``). ``weights_from_mace`` /
``weights_to_mace`` map mace's parameters (``(num_elements, K, mul)`` each) to and from it.
"""

from __future__ import annotations

from fractions import Fraction

from ..errors import SpecError
from .ir import SymmetricContractionIR, SymmetricTerm
from .spec import SymmetricContractionSpec
from .u_tensors import exact_to_float, exact_to_str, u_tensor

__all__ = ["lower", "symmetrized_terms", "weights_from_mace", "weights_to_mace", "mace_weight_blocks", "spec_from_mace"]


def symmetrized_terms(spec: SymmetricContractionSpec, out: int, nu: int) -> tuple[int, list[tuple]]:
    """``(K, [(m, k, monomial, ExactReal), ...])`` of output block ``out`` at order ``nu``,
    zeros dropped, sorted by ``(m, k, monomial)``."""
    ir_out = spec.irreps_out[out].ir
    t = u_tensor(spec.coupling_irreps, ir_out, nu, spec.cg_convention)
    acc: dict[tuple, dict[int, Fraction]] = {}
    for idx, v in t.entries:
        m, ins, k = idx[0], idx[1:-1], idx[-1]
        key = (m, k, tuple(sorted(ins)))
        d = acc.setdefault(key, {})
        for r, q in v:
            d[r] = d.get(r, 0) + q
    terms = []
    for key in sorted(acc):
        v = tuple(sorted((r, q) for r, q in acc[key].items() if q != 0))
        if v:
            terms.append((*key, v))
    return t.num_params, terms


def lower(spec: SymmetricContractionSpec) -> SymmetricContractionIR:
    """The IR of ``spec`` (see the module docstring for the term and weight order).

    Raises:
        SpecError: an output irrep that no order reaches (it would always be 0).
    """
    mul = spec.mul
    terms: list[SymmetricTerm] = []
    num_params, offsets = [], []
    col = 0
    for o, mi in enumerate(spec.irreps_out):
        n_corr = spec.correlation[o]
        ks = [0] * n_corr
        offs = [0] * n_corr
        for nu in range(n_corr, 0, -1):  # mace's weights_max (nu = N) first, then N-1 .. 1
            k_count, sym = symmetrized_terms(spec, o, nu)
            ks[nu - 1], offs[nu - 1] = k_count, col
            col += k_count * mul
            for m, k, mono, v in sym:
                terms.append(SymmetricTerm(out=o, m=m, nu=nu, k=k, monomial=mono, coeff=exact_to_float(v),
                                           coeff_exact=exact_to_str(v)))
        if not any(ks):
            raise SpecError(*spec.origin, "irreps_out", f"output irrep '{mi.ir}' has no path from "
                            f"'{spec.irreps_in}' at any correlation order up to {n_corr}: it would always be 0")
        num_params.append(tuple(ks))
        offsets.append(tuple(offs))
    terms.sort(key=lambda t: (t.out, t.m, t.nu, t.k, t.monomial))
    return SymmetricContractionIR(
        name=spec.name, irreps_in=str(spec.irreps_in), irreps_out=str(spec.irreps_out), mul=mul,
        dim_in=spec.irreps_in.dim // mul, out_dims=tuple(mi.ir.dim for mi in spec.irreps_out),
        correlation=tuple(spec.correlation), num_elements=spec.num_elements, num_params=tuple(num_params),
        weight_numel=col, weight_offsets=tuple(offsets), layout=spec.layout, dtypes=tuple(spec.dtypes),
        terms=tuple(terms), basis=spec.basis, cg_convention=spec.cg_convention,
    )


def mace_weight_blocks(module) -> list[tuple]:
    """``[(weights_max, [weights...]), ...]`` per output block of a mace ``SymmetricContraction``."""
    return [(c.weights_max, list(c.weights)) for c in module.contractions]


def _cat(arrays, like):
    if type(like).__module__.startswith("torch"):
        import torch
        return torch.cat(arrays, dim=-1)
    import numpy as np
    return np.concatenate(arrays, axis=-1)


def weights_from_mace(ir: SymmetricContractionIR, blocks) -> "array":
    """mace's parameters as the IR's flat ``(num_elements, weight_numel)`` weights.

    Args:
        ir: the lowered spec.
        blocks: per output block ``(weights_max, weights)``: ``weights_max`` of shape
            ``(num_elements, K_N, mul)`` (order ``N = correlation[o]``) and ``weights`` the
            list for orders ``N-1, ..., 1`` (mace's ``Contraction.weights_max`` and
            ``.weights``; ``mace_weight_blocks(module)`` collects them). numpy arrays or
            torch tensors (differentiable: only reshapes and one concatenation).

    Returns:
        ``(num_elements, weight_numel)``, the type of the inputs. An order with no path
        (``num_params`` 0; mace keeps a ``(num_elements, 1, mul)`` placeholder that
        multiplies a zero U) contributes no columns.

    Raises:
        ValueError: a block count or a shape that does not match ``ir``.
    """
    if len(blocks) != len(ir.out_dims):
        raise ValueError(f"expected {len(ir.out_dims)} output blocks of mace weights, got {len(blocks)}")
    pieces = []
    like = None
    for o, (w_max, ws) in enumerate(blocks):
        n_corr = ir.correlation[o]
        ws = list(ws)
        if len(ws) != n_corr - 1:
            raise ValueError(f"output block {o}: expected {n_corr - 1} mace weights below weights_max, got {len(ws)}")
        for nu, w in zip(range(n_corr, 0, -1), [w_max, *ws]):
            k = ir.num_params[o][nu - 1]
            want = (ir.num_elements, max(k, 1), ir.mul)
            if tuple(w.shape) != want:
                raise ValueError(f"output block {o}, order {nu}: mace weight of shape {tuple(w.shape)}, expected {want}")
            like = w
            if k:
                pieces.append(w.reshape(ir.num_elements, k * ir.mul))
    return _cat(pieces, like)


def weights_to_mace(ir: SymmetricContractionIR, weights) -> list[tuple]:
    """The inverse of ``weights_from_mace``: ``[(weights_max, [weights...]), ...]`` per block.

    ``weights`` is ``(num_elements, weight_numel)`` (numpy or torch); each returned array is
    ``(num_elements, K, mul)`` (views where possible), and an order with no path gets
    mace's ``(num_elements, 1, mul)`` placeholder of zeros.

    Raises:
        ValueError: ``weights`` of the wrong shape.
    """
    if tuple(weights.shape) != (ir.num_elements, ir.weight_numel):
        raise ValueError(f"weights of shape {tuple(weights.shape)}, expected {(ir.num_elements, ir.weight_numel)}")
    out = []
    for o, n_corr in enumerate(ir.correlation):
        per_nu = []
        for nu in range(n_corr, 0, -1):
            k, off = ir.num_params[o][nu - 1], ir.weight_offsets[o][nu - 1]
            if k:
                per_nu.append(weights[:, off:off + k * ir.mul].reshape(ir.num_elements, k, ir.mul))
            else:
                per_nu.append(_zeros(weights, (ir.num_elements, 1, ir.mul)))
        out.append((per_nu[0], per_nu[1:]))
    return out


def _zeros(like, shape):
    if hasattr(like, "new_zeros"):  # torch: same dtype and device
        return like.new_zeros(shape)
    import numpy as np
    return np.zeros(shape, dtype=like.dtype)


def spec_from_mace(module, name: str, layout: str = "mul_ir", dtypes: tuple[str, ...] = ("float32", "float64")
                   ) -> SymmetricContractionSpec:
    """The spec of a mace ``SymmetricContraction`` (mace-torch 0.3.16), checked against its U buffers.

    Irreps, correlations and ``num_elements`` are read from the module; ``cg_convention``
    is the one whose exact U tensors equal every ``U_matrix_<nu>`` buffer of every
    contraction (to 1e-12 for float64 buffers, 1e-6 for float32); where both conventions
    match, the U tensors involve no triple whose sign differs and the default is returned.

    Raises:
        ValueError: buffers that match neither convention (e.g. a module built with
            ``use_reduced_cg=True``: cuEquivariance's basis, which eqdsl does not build), or
            a module this spec kind cannot express (``SpecError``'s reason, one line).
    """
    import numpy as np
    import torch

    from ..cg import CG_CONVENTIONS, DEFAULT_CG_CONVENTION
    from .spec import parse_symmetric_specs
    from .u_tensors import u_tensor_dense

    irreps_in, irreps_out = str(module.irreps_in), str(module.irreps_out)
    corrs = [int(c.correlation) for c in module.contractions]
    num_elements = int(module.contractions[0].weights_max.shape[0])
    outs = [str(mi.ir) for mi in module.irreps_out]
    corr_text = str(corrs[0]) if len(set(corrs)) == 1 else \
        "{" + ", ".join(f'"{ir}" = {c}' for ir, c in zip(outs, corrs)) + "}"

    dtypes_text = ", ".join(f'"{d}"' for d in dtypes)

    def make(convention: str) -> SymmetricContractionSpec:
        text = (f'[[symmetric_contraction]]\nname = "{name}"\nirreps_in = "{irreps_in}"\n'
                f'irreps_out = "{irreps_out}"\ncorrelation = {corr_text}\nnum_elements = {num_elements}\n'
                f'layout = "{layout}"\ndtypes = [{dtypes_text}]\n'
                f'cg_convention = "{convention}"\n')
        try:
            (spec,) = parse_symmetric_specs(text, "<mace SymmetricContraction>")
        except SpecError as e:
            reason = e.reason
        else:
            return spec
        raise ValueError(f"mace SymmetricContraction {irreps_in} -> {irreps_out}: {reason}")

    def matches(spec: SymmetricContractionSpec) -> bool:
        for o, (mi, c) in enumerate(zip(spec.irreps_out, module.contractions)):
            for nu in range(1, spec.correlation[o] + 1):
                theirs = dict(c.named_buffers())[f"U_matrix_{nu}"].detach().cpu()
                tol = 1e-12 if theirs.dtype == torch.float64 else 1e-6
                theirs = theirs.double().numpy()
                ours = u_tensor_dense(spec.coupling_irreps, mi.ir, nu, spec.cg_convention)
                if ours.shape[-1] == 0:  # no path: mace keeps one parameter's worth of zeros
                    if theirs.shape[-1] != 1 or np.abs(theirs).max() > tol:
                        return False
                    continue
                if theirs.size != ours.size or np.abs(ours.reshape(theirs.shape) - theirs).max() > tol:
                    return False
        return True

    found = [conv for conv in CG_CONVENTIONS if matches(make(conv))]
    if not found:
        raise ValueError(
            f"mace SymmetricContraction {irreps_in} -> {irreps_out}: its U buffers are mace's U_matrix_real in "
            f"neither CG convention ({', '.join(CG_CONVENTIONS)}); a module built with use_reduced_cg=True has "
            "cuEquivariance's basis, which eqdsl does not build")
    return make(DEFAULT_CG_CONVENTION if DEFAULT_CG_CONVENTION in found else found[0])
