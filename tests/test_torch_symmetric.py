"""Generated symmetric-contraction torch ops (issue 27): the Helion kernels of every derivative
against a torch float64 contraction of the dense U tensors (mace's ``U_matrix_real``, never the
IR's symmetrized terms), to third order; float64 gradcheck and gradgradcheck; equivariance
under rotation and inversion (e3nn's D matrices); both layouts; argument errors.

Tiny problems (mul 4, ``0e+1o -> 0e+1o``, 3 elements): Triton's interpreter runs the kernels'
loops over their term tables in Python (0.4-2.4 s a call), so ``mul_ir`` (correlation 3) checks
every derivative up to third order against the dense contraction, and gradcheck/gradgradcheck
run on ``ir_mul`` (correlation 2: the same generated loops, a quarter of the terms).
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
import torch

from eqdsl.codegen.generate import GenerateError
from eqdsl.symmetric.codegen import generate_symmetric, symmetric_files
from eqdsl.symmetric.lower import lower
from eqdsl.symmetric.reference import from_channels, to_channels
from eqdsl.symmetric.spec import parse_symmetric_specs
from eqdsl.symmetric.u_tensors import u_tensor_dense

from tolerances import REL_TOL

e3nn_o3 = pytest.importorskip("e3nn.o3")

TOL = REL_TOL["float64"]
CASES = {"mul_ir": 3, "ir_mul": 2}  # layout -> correlation


def _spec(layout: str, correlation: int):
    (spec,) = parse_symmetric_specs(
        f'[[symmetric_contraction]]\nname = "sc_{layout}"\nirreps_in = "4x0e+4x1o"\nirreps_out = "4x0e+4x1o"\n'
        f'correlation = {correlation}\nnum_elements = 3\nlayout = "{layout}"\n')
    return spec


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("symmetric")
    out = {}
    for layout, corr in CASES.items():
        spec = _spec(layout, corr)
        ir = lower(spec)
        generate_symmetric(ir, root / "pkgs")
        out[layout] = (spec, ir)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    mods = {layout: importlib.import_module(f"pkgs.sc_{layout}.torch_symmetric") for layout in CASES}
    yield {layout: (*out[layout], mods[layout]) for layout in CASES}
    sys.path.remove(str(root))


def torch_reference(spec, x, w, elem):
    """mace's einsum contraction of the dense U tensors, in torch (differentiable to any order)."""
    mul = spec.mul
    dims_in = tuple(mi.ir.dim for mi in spec.irreps_in)
    dims_out = tuple(mi.ir.dim for mi in spec.irreps_out)
    # (N, dim*mul) in the layout -> (N, dim, mul)
    perm_in = torch.as_tensor(to_channels(np.arange(sum(dims_in) * mul)[None], dims_in, mul, spec.layout)[0])
    xc = x[:, perm_in]
    wn = w[elem]
    outs, col = [], 0
    for o, mi in enumerate(spec.irreps_out):
        acc = 0
        for nu in range(spec.correlation[o], 0, -1):
            u = torch.tensor(np.array(u_tensor_dense(spec.coupling_irreps, mi.ir, nu, spec.cg_convention)))
            k = u.shape[-1]
            wk = wn[:, col:col + k * mul].reshape(-1, k, mul)
            col += k * mul
            t = torch.einsum("nkc,m...k->ncm...", wk, u)  # (N, c, m, i_1..i_nu)
            for _ in range(nu):
                t = torch.einsum("ncm...i,nic->ncm...", t, xc)
            acc = acc + t.transpose(1, 2)  # (N, m, c)
        outs.append(acc)
    yc = torch.cat(outs, dim=1)  # (N, dim_out, mul)
    # back to the layout: inverse of the column permutation
    perm_out = torch.as_tensor(to_channels(np.arange(sum(dims_out) * mul)[None], dims_out, mul, spec.layout)[0])
    return yc.reshape(x.shape[0], -1)[:, torch.argsort(perm_out.reshape(-1))]


def _inputs(ir, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, ir.dim_in * ir.mul, dtype=torch.float64, generator=g)
    w = torch.randn(ir.num_elements, ir.weight_numel, dtype=torch.float64, generator=g)
    elem = torch.tensor([0, 2, 1, 2, 0, 1, 1][:n])
    return x, w, elem


def _rel(got, want):
    got, want = got.detach(), want.detach()
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("layout", list(CASES))
def test_forward_equals_dense_reference(packages, layout):
    spec, ir, mod = packages[layout]
    x, w, elem = _inputs(ir)
    want = torch_reference(spec, x, w, elem)
    got = mod.symmetric_contraction(x, w, elem)
    assert got.shape == (5, 16) and _rel(got, want) < TOL
    assert want.abs().max() > 1  # not a vanishing case
    assert mod.symmetric_contraction(x[:0], w, elem[:0]).shape == (0, 16)  # no nodes: no launch


@pytest.mark.parametrize("layout", list(CASES))
def test_derivatives_equal_reference(packages, layout):
    """First derivatives (both layouts); for mul_ir (correlation 3) also the second, with respect
    to x, the weights and the output cotangent, and the third in x, against autograd through the
    dense reference. The layout only changes the kernels' column offsets, which every order
    shares (``eqdsl.symmetric.helion._component_access``)."""
    spec, ir, mod = packages[layout]
    x, w, elem = _inputs(ir, seed=1)
    gen = torch.Generator().manual_seed(2)
    cot = torch.randn(5, 16, dtype=torch.float64, generator=gen)
    u = torch.randn_like(x)
    uw = torch.randn_like(w)

    def derivs(fn):
        xx, ww, gg = (t.clone().requires_grad_(True) for t in (x, w, cot))
        y = fn(xx, ww)
        gx, gw = torch.autograd.grad((y * gg).sum(), (xx, ww), create_graph=True)
        if layout != "mul_ir":
            return y, gx, gw, None, None, None, None
        s = (gx * u).sum() + (gw * uw).sum()
        hx, hw, hg = torch.autograd.grad(s, (xx, ww, gg), create_graph=True)
        third = torch.autograd.grad((hx * u).sum(), xx)[0]
        return y, gx, gw, hx, hw, hg, third

    got = derivs(lambda a, b: mod.symmetric_contraction(a, b, elem))
    want = derivs(lambda a, b: torch_reference(spec, a, b, elem))
    for name, g_, w_ in zip(("out", "dx", "dW", "d2x", "d2W", "d2G", "d3x"), got, want):
        if w_ is None:
            continue
        assert w_.abs().max() > 1e-3, name  # every derivative checked is a nonzero one
        assert _rel(g_, w_) < TOL, name


def test_fourth_derivative_of_a_cubic_is_zero(packages):
    """Past the polynomial's degree the ops are zeros (no kernel), so autograd still works."""
    spec, ir, mod = packages["mul_ir"]  # correlation 3: d4/dx4 = 0, d3/dx3 constant
    x, w, elem = _inputs(ir, seed=3)
    xx = x.clone().requires_grad_(True)
    u = torch.randn_like(x)
    y = mod.symmetric_contraction(xx, w, elem)
    (gx,) = torch.autograd.grad(y.sum(), xx, create_graph=True)
    (hx,) = torch.autograd.grad((gx * u).sum(), xx, create_graph=True)
    (tx,) = torch.autograd.grad((hx * u).sum(), xx, create_graph=True)
    assert tx.abs().max() > 1e-3
    (fx,) = torch.autograd.grad((tx * u).sum(), xx, allow_unused=True)
    assert fx is None or fx.abs().max() == 0


def test_gradcheck_gradgradcheck(packages):
    spec, ir, mod = packages["ir_mul"]
    x, w, elem = _inputs(ir, n=2, seed=4)
    x.requires_grad_(True)
    w.requires_grad_(True)

    def fn(a, b):
        return mod.symmetric_contraction(a, b, elem[:2])

    assert torch.autograd.gradcheck(fn, (x, w), fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, (x, w), fast_mode=True)


@pytest.mark.parametrize("layout", list(CASES))
def test_equivariant_under_rotation_and_inversion(packages, layout):
    spec, ir, mod = packages[layout]
    x, w, elem = _inputs(ir, seed=5)
    mul = ir.mul

    def in_layout(d, dims):
        """e3nn's D (mul_ir) as it acts on rows of ``layout``."""
        n = d.shape[0]
        p = from_channels(to_channels(np.eye(n), dims, mul, "mul_ir"), dims, layout)  # mul_ir -> layout
        return torch.as_tensor(p.T @ d.numpy() @ p)

    out = mod.symmetric_contraction(x, w, elem)
    torch.manual_seed(0)
    r = e3nn_o3.rand_matrix().double()
    for mat in (r, -r, -torch.eye(3, dtype=torch.float64)):
        a = in_layout(e3nn_o3.Irreps(ir.irreps_in).D_from_matrix(mat), (1, 3))
        b = in_layout(e3nn_o3.Irreps(ir.irreps_out).D_from_matrix(mat), (1, 3))
        rotated = mod.symmetric_contraction(x @ a.T, w, elem)
        assert _rel(rotated, out @ b.T) < TOL
    # odd outputs flip under inversion: the check above is not vacuous
    assert out[:, 4:].abs().max() > 0.1


def test_argument_errors(packages):
    spec, ir, mod = packages["mul_ir"]
    x, w, elem = _inputs(ir)
    f = mod.symmetric_contraction
    cases = [
        ((x[:, :15], w, elem), ValueError, r"x must have shape \(num_nodes, 16\)"),
        ((x, w[:, :-1], elem), ValueError, r"weights must have shape \(3, 64\)"),
        ((x, w[:2], elem), ValueError, r"weights must have shape \(3, 64\)"),
        ((x, w, elem[:4]), ValueError, r"elem must have shape \(5,\)"),
        ((x, w, elem.double()), TypeError, "elem must be an integer tensor"),
        ((x, w.float(), elem), TypeError, "x and weights must share one dtype"),
        ((x.half(), w.half(), elem), TypeError, "x must have dtype in"),
        ((x.numpy(), w, elem), TypeError, "x must be a torch.Tensor"),
        ((x, w, elem + 1), ValueError, r"elem holds 3, outside 0..2"),
        ((x, w, elem - 1), ValueError, r"elem holds -1, outside 0..2"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            f(*args)
    op = mod.OPS["bwd_x"]
    with pytest.raises(ValueError, match=r"g must have shape \(5, 16\)"):
        op(x, w, x[:, :15], elem)


def test_generation_deterministic_and_refuses_foreign_directory(packages, tmp_path):
    spec, ir, _ = packages["mul_ir"]
    assert symmetric_files(ir) == symmetric_files(lower(spec))
    (tmp_path / "sc_mul_ir").mkdir()
    (tmp_path / "sc_mul_ir" / "__init__.py").write_text("# mine\n")
    with pytest.raises(GenerateError, match="not generated by eqdsl"):
        generate_symmetric(ir, tmp_path)



def test_torch_compile_fullgraph(packages):
    """``torch.compile(fullgraph=True, dynamic=True)`` of an energy through the op (its
    torch.library ops have fake implementations and autograd formulas): equal to eager, its
    gradients in x and the weights too (AOTAutograd's backward graph calls the op's
    ``bwd_x`` / ``bwd_w``), also at a second node count through the same graph."""
    spec, ir, mod = packages["ir_mul"]

    def energy(x, w, elem):
        return (mod.symmetric_contraction(x, w, elem) ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(energy, fullgraph=True, dynamic=True)
    for n, seed in ((5, 3), (7, 4)):
        x, w, elem = _inputs(ir, n=n, seed=seed)
        x, w = x.requires_grad_(), w.requires_grad_()
        e_c, e_r = compiled(x, w, elem), energy(x, w, elem)
        assert _rel(e_c, e_r) < TOL
        for a, b in zip(torch.autograd.grad(e_c, (x, w)), torch.autograd.grad(e_r, (x, w))):
            assert _rel(a, b) < TOL and b.abs().max() > 1


def test_make_fx_energy_and_forces_then_compile(packages):
    """The NequIP / Nequix route to second order under ``torch.compile``: ``make_fx``
    (symbolic) of the energy and its gradient in x with ``create_graph``, compiled
    ``fullgraph``; the traced graph holds the generated ops and no host sync."""
    from torch.fx.experimental.proxy_tensor import make_fx

    spec, ir, mod = packages["ir_mul"]

    def energy_and_grad(x, w, elem):
        x = x.requires_grad_()
        # check=False: the element-range check reads elem on the host, which a symbolic
        # trace cannot (torch.compile skips it by itself)
        e = (mod.symmetric_contraction(x, w, elem, check=False) ** 2).sum()
        return e, torch.autograd.grad(e, x, create_graph=True)[0]

    x, w, elem = _inputs(ir, n=7, seed=5)
    gm = make_fx(energy_and_grad, tracing_mode="symbolic", _allow_non_fake_inputs=True)(x.clone(), w, elem)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any(t.startswith("eqdsl_sc_") for t in targets), targets
    syncs = ("aten.nonzero", "aten.item", "aten._local_scalar_dense")
    assert not any(t.startswith(syncs) for t in targets), [t for t in targets if t.startswith(syncs)]
    torch._dynamo.reset()
    e_c, g_c = torch.compile(gm, fullgraph=True, dynamic=True)(x.clone(), w, elem)
    e_r, g_r = energy_and_grad(x.clone(), w, elem)
    assert _rel(e_c, e_r) < TOL and _rel(g_c, g_r) < TOL and g_r.abs().max() > 1


def test_shipped_triton_code_path(tmp_path, monkeypatch):
    """A package generated with its Triton code (``symmetric_package_files(..., triton=True)``,
    what ``eqdsl generate`` and ``eqdsl.symmetric.load`` write): the ops launch
    ``triton_kernels/`` through ``eqdsl.runtime.triton_launch`` (no Helion kernel object), and
    the forward, a force loss's gradients (second order) and int32 / int64 ``elem`` agree with
    the dense reference in float64 (Triton's interpreter on the CPU; the other tests run the
    same kernels through Helion)."""
    from eqdsl.codegen.generate import symmetric_package_files
    from eqdsl.codegen.package import write_package
    from eqdsl.runtime import triton_launch

    (spec,) = parse_symmetric_specs(
        '[[symmetric_contraction]]\nname = "sc_lowered"\nirreps_in = "3x0e+3x1o"\nirreps_out = "3x0e+3x1o"\n'
        'correlation = 2\nnum_elements = 2\nlayout = "mul_ir"\ndtypes = ["float64"]\n')
    ir = lower(spec)
    files = symmetric_package_files(ir, "# test header\n# regenerate: test_shipped_triton_code_path\n", triton=True)
    assert {f"sc_lowered/triton_kernels/sc_{k}_float64.py" for k in ("fwd", "bwd_x", "bwd_w")} <= set(files)
    write_package(tmp_path, files)
    monkeypatch.setenv("EQDSL_KERNELS", "triton")  # read at the package's first kernel call
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        mod = importlib.import_module("sc_lowered.torch_symmetric")
        assert not triton_launch.use_helion()
        assert repr(mod._OPS._kernels["fwd"]).startswith("triton_launch kernel")
        g = torch.Generator().manual_seed(7)
        x = torch.randn(6, ir.dim_in * ir.mul, dtype=torch.float64, generator=g).requires_grad_()
        w = torch.randn(ir.num_elements, ir.weight_numel, dtype=torch.float64, generator=g).requires_grad_()
        elem = torch.tensor([0, 1, 1, 0, 1, 0])
        for e in (elem, elem.to(torch.int32)):
            want = torch_reference(spec, x, w, e)
            got = mod.symmetric_contraction(x, w, e)
            assert _rel(got, want) < TOL and want.abs().max() > 0.1
        loss = lambda f: (torch.autograd.grad((f ** 2).sum(), x, create_graph=True)[0] ** 2).sum()  # noqa: E731
        for a, b in zip(torch.autograd.grad(loss(got), (x, w)), torch.autograd.grad(loss(want), (x, w))):
            assert _rel(a, b) < TOL and b.abs().max() > 0.1
    finally:
        sys.path.remove(str(tmp_path))
