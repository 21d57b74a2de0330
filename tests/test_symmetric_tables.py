"""The term tables every symmetric-contraction kernel loops over (``eqdsl.symmetric.tables``):
``apply_tables_reference`` of each op (``fwd``, ``bwd_w``, ``bwd_x`` of every order) against
torch autograd through mace's dense U contraction (``torch_reference`` of
``test_torch_symmetric``: ``U_matrix_real``, never the symmetrized terms), both layouts; the
tables' structure (CSR offsets, slots covering every result column once) and determinism.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eqdsl.symmetric.fold import fold_ir, fold_weights_reference
from eqdsl.symmetric.lower import lower
from eqdsl.symmetric.tables import KINDS, apply_tables_reference, max_order, op_tables

from test_torch_symmetric import _spec, torch_reference

pytest.importorskip("e3nn.o3")

CASES = {"mul_ir": 3, "ir_mul": 2}


def _derivative(spec, kind, n, x, w, g, hs, elem):
    """The op's value by autograd: d/dG, d/dW or d/dx of F_n = D^n_x <out, G>[h_1..h_n]."""
    g = g.clone().requires_grad_(kind == "fwd")
    f = (torch_reference(spec, x, w, elem) * g).sum()
    for h in hs:
        (d,) = torch.autograd.grad(f, x, create_graph=True)
        f = (d * h).sum()
    wrt = {"fwd": g, "bwd_w": w, "bwd_x": x}[kind]
    (want,) = torch.autograd.grad(f, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if want is None else want


@pytest.mark.parametrize("folded", [False, True], ids=["terms", "folded"])
@pytest.mark.parametrize("layout", list(CASES))
def test_tables_compute_every_derivative(layout, folded):
    spec = _spec(layout, CASES[layout])
    ir = lower(spec)
    fold = fold_ir(ir)
    gen = torch.Generator().manual_seed(0)
    n_rows, din, dout = 5, ir.dim_in * ir.mul, sum(ir.out_dims) * ir.mul
    x = torch.randn(n_rows, din, dtype=torch.float64, generator=gen).requires_grad_(True)
    w = torch.randn(ir.num_elements, ir.weight_numel, dtype=torch.float64, generator=gen).requires_grad_(True)
    g = torch.randn(n_rows, dout, dtype=torch.float64, generator=gen)
    hs = [torch.randn(n_rows, din, dtype=torch.float64, generator=gen) for _ in range(4)]
    elem = torch.tensor([0, 2, 1, 2, 0])
    a = fold_weights_reference(fold, w.detach().numpy())
    for kind in KINDS if not folded else ("fwd", "bwd_x"):  # bwd_w is never folded
        for n in range(max_order(ir, kind) + 1):
            t = op_tables(fold.ir if folded else ir, kind, n)
            want = _derivative(spec, kind, n, x, w, g, hs[:n], elem).numpy()
            width = {"fwd": dout, "bwd_w": ir.weight_numel, "bwd_x": din}[kind]
            got = apply_tables_reference(t, ir.mul, x.detach().numpy(), [h.numpy() for h in hs[:n]],
                                         a if folded else w.detach().numpy(), g.numpy(), elem.numpy(),
                                         num_elements=ir.num_elements, result_width=width)
            assert np.abs(want).max() > 1e-3, (kind, n)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max(), err_msg=f"{kind} {n}")


@pytest.mark.parametrize("layout", list(CASES))
def test_tables_structure(layout):
    ir = lower(_spec(layout, CASES[layout]))
    for kind in KINDS:
        for n in range(max_order(ir, kind) + 1):
            t = op_tables(ir, kind, n)
            assert t == op_tables(ir, kind, n)  # deterministic
            assert len(t.ptr) == len(t.slots) * t.groups + 1 and t.ptr[0] == 0 and t.ptr[-1] == len(t.coeff)
            assert all(a <= b for a, b in zip(t.ptr, t.ptr[1:]))
            assert all(len(row) == len(t.columns) for row in t.cols)
            # the monomial index partitions each group's terms into runs of one monomial each
            assert len(t.mono_ptr) == len(t.ptr) and t.mono_ptr[-1] == len(t.mono_cols)
            for grp in range(len(t.ptr) - 1):
                ms = range(t.mono_ptr[grp], t.mono_ptr[grp + 1])
                assert [t.mono_terms[m] for m in ms] + [t.ptr[grp + 1]] == \
                    ([t.ptr[grp]] + [t.mono_terms[m + 1] for m in ms] if ms else [t.ptr[grp + 1]])
                for m in ms:
                    terms = range(t.mono_terms[m], t.mono_terms[m + 1])
                    assert terms and all(t.cols[i][t.head_width:] == t.mono_cols[m] for i in terms)
                assert len({t.mono_cols[m] for m in ms}) == len(ms)  # each monomial once per group
            # the slots cover every column of a result row exactly once
            covered = sorted(b + c * s for b, s in t.slots for c in range(ir.mul))
            width = {"fwd": sum(ir.out_dims), "bwd_w": ir.weight_numel // ir.mul, "bwd_x": ir.dim_in}[kind]
            assert covered == list(range(width * ir.mul)), (kind, n)
    with pytest.raises(ValueError, match="no .bwd_x. derivative of order"):
        op_tables(ir, "bwd_x", max_order(ir, "bwd_x") + 1)


def test_fold_shrinks_the_heads():
    """Folding leaves one head per (o, m, monomial): the forward's terms become its monomials."""
    ir = lower(_spec("mul_ir", 3))
    fold = fold_ir(ir)
    assert fold == fold_ir(ir)  # deterministic
    plain, folded = op_tables(ir, "fwd", 0), op_tables(fold.ir, "fwd", 0)
    assert len(folded.coeff) == len(folded.mono_cols) == len(plain.mono_cols) < len(plain.coeff)
    assert fold.rows == len(plain.mono_cols) and fold.cols * ir.mul == ir.weight_numel
    assert sum(v for _, _, v in fold.entries) == pytest.approx(sum(t.coeff for t in ir.terms))
