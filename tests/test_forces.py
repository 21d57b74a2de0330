"""Force training through the generated ops, as an interatomic potential uses them.

positions -> edge vectors -> e3nn spherical harmonics (x2) -> tensor product with node
features gathered at the edge source (x1) and radial weights -> invariant energy;
forces F = -dE/dx by autograd; the loss |F - F_ref|^2 differentiated with respect to
the radial parameters (a gradient of a gradient through the tensor product).
Everything is compared with the same model built from ``e3nn.o3.TensorProduct``.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from genutil import build_package
from tolerances import REL_TOL as TOL

torch = pytest.importorskip("torch")
o3 = pytest.importorskip("e3nn.o3")

SPEC = """
[[tensor_product]]
name = "{name}"
irreps_in1 = "3x0e+2x1o+2x2e"
irreps_in2 = "0e+1o+2e"
irreps_out = "0e+1o+2e"
mode = "uvu"
shared_weights = false
layout = "{layout}"
"""
# 4 atoms: 12 edges, one 16-row tile per launch (the interpreter runs tiles one by one;
# several tiles and partial ones: test_torch_grads)
N_ATOMS, N_BASIS = 4, 4
# Compiled kernels on a GPU (conftest.py leaves TRITON_INTERPRET unset there), else the interpreter on CPU.
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    """The JAX tests: on the CPU, XLA compiling the interpret-mode kernels dominates their time;
    most XLA optimizations off while this module runs (as in test_jax_grads; the same ops,
    unfused). A GPU keeps them."""
    try:
        import jax
    except ImportError:  # a torch-only environment
        yield
        return
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", jax.default_backend() == "cpu")
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module", params=["mul_ir", "ir_mul"])
def pkg(request, tmp_path_factory):
    name = f"forces_{request.param}"
    return build_package(tmp_path_factory.mktemp("forces"), name, SPEC.format(name=name, layout=request.param))


def _system(meta, seed=0):
    rng = np.random.default_rng(seed)
    pos = rng.uniform(0.0, 2.5, size=(N_ATOMS, 3))
    src, dst = np.array([(i, j) for i in range(N_ATOMS) for j in range(N_ATOMS) if i != j]).T
    feats = rng.standard_normal((N_ATOMS, meta.DIM_IN1))
    theta = rng.standard_normal((N_BASIS, meta.WEIGHT_NUMEL)) / N_BASIS
    f_ref = rng.standard_normal((N_ATOMS, 3))
    return pos, src, dst, feats, theta, f_ref


def _blocks(irreps: str):
    out = []
    for term in irreps.split("+"):
        mul, ir = term.split("x")
        out.append((int(mul), ir))
    return out


def _scalar_columns(meta):
    """Columns of the output holding 0e components (same in both layouts: dim 1)."""
    cols, off = [], 0
    for mul, ir in _blocks(meta.IRREPS_OUT):
        dim = 2 * int(ir[:-1]) + 1
        if ir == "0e":
            cols.extend(range(off, off + mul))
        off += mul * dim
    return np.array(cols)


def _to_layout_perm(irreps: str, layout: str) -> np.ndarray:
    """Index map p with x_layout = x_mul_ir[:, p]."""
    idx, off = [], 0
    for mul, ir in _blocks(irreps):
        dim = 2 * int(ir[:-1]) + 1
        block = np.arange(off, off + mul * dim).reshape(mul, dim)
        idx.append((block if layout == "mul_ir" else block.T).reshape(-1))
        off += mul * dim
    return np.concatenate(idx)


def torch_model(meta, tp, dtype, rot=None):
    """Energy(pos, theta) with the tensor product ``tp(x1, x2, w)`` in the package's layout."""
    pos0, src, dst, feats, theta0, f_ref = _system(meta)
    src_t, dst_t = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
    p1 = torch.as_tensor(_to_layout_perm(meta.IRREPS_IN1, meta.LAYOUT), device=DEVICE)
    p2 = torch.as_tensor(_to_layout_perm(meta.IRREPS_IN2, meta.LAYOUT), device=DEVICE)
    feats_t = torch.tensor(feats, dtype=torch.float64, device=DEVICE)
    if rot is not None:  # node features rotate with the positions
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # e3nn builds its Wigner D in the default dtype
        try:
            feats_t = feats_t @ o3.Irreps(meta.IRREPS_IN1).D_from_matrix(rot.cpu()).T.to(DEVICE)
        finally:
            torch.set_default_dtype(old)
    h = feats_t.to(dtype)[:, p1]
    scal = torch.as_tensor(_scalar_columns(meta), device=DEVICE)
    readout = torch.linspace(-1.0, 1.0, len(scal), dtype=dtype, device=DEVICE)
    centers = torch.linspace(0.5, 4.0, N_BASIS, dtype=dtype, device=DEVICE)

    def energy(pos, theta):
        vec = pos[dst_t] - pos[src_t]
        r = torch.linalg.norm(vec, dim=1)
        x2 = o3.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component")[:, p2]
        w = torch.exp(-((r[:, None] - centers) ** 2)) @ theta
        out = tp(h[src_t], x2, w)
        s = out[:, scal]
        return (s @ readout).sum() + 0.5 * (s**2).sum()

    pos = torch.tensor(pos0, dtype=dtype, device=DEVICE)
    theta = torch.tensor(theta0, dtype=dtype, device=DEVICE)
    return energy, pos, theta, torch.tensor(f_ref, dtype=dtype, device=DEVICE)


def _e3nn_tp(meta, dtype):
    tp = o3.TensorProduct(meta.IRREPS_IN1, meta.IRREPS_IN2, meta.IRREPS_OUT, meta.INSTRUCTIONS,
                          irrep_normalization=meta.IRREP_NORMALIZATION, path_normalization=meta.PATH_NORMALIZATION,
                          shared_weights=meta.SHARED_WEIGHTS, internal_weights=False).to(dtype=dtype, device=DEVICE)
    if meta.LAYOUT == "mul_ir":
        return tp
    q1 = torch.as_tensor(np.argsort(_to_layout_perm(meta.IRREPS_IN1, meta.LAYOUT)), device=DEVICE)
    q2 = torch.as_tensor(np.argsort(_to_layout_perm(meta.IRREPS_IN2, meta.LAYOUT)), device=DEVICE)
    po = torch.as_tensor(_to_layout_perm(meta.IRREPS_OUT, meta.LAYOUT), device=DEVICE)
    return lambda x1, x2, w: tp(x1[:, q1], x2[:, q2], w)[:, po]


def energy_forces_grad(energy, pos, theta, f_ref):
    pos = pos.clone().requires_grad_()
    theta = theta.clone().requires_grad_()
    e = energy(pos, theta)
    forces = -torch.autograd.grad(e, pos, create_graph=True)[0]
    loss = ((forces - f_ref) ** 2).sum()
    (g_theta,) = torch.autograd.grad(loss, theta)
    return e.detach(), forces.detach(), g_theta


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


# each dtype is a compile of its own in the CPU interpreter (about a minute): both layouts and
# both dtypes, in two runs
@pytest.mark.parametrize("pkg,dtype_name", [("mul_ir", "float32"), ("ir_mul", "float64")], indirect=["pkg"])
def test_torch_energy_forces_and_weight_gradient_match_e3nn(pkg, dtype_name):
    torch_ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    dtype = getattr(torch, dtype_name)
    got = energy_forces_grad(*torch_model(pkg, torch_ops.tensor_product, dtype))
    want = energy_forces_grad(*torch_model(pkg, _e3nn_tp(pkg, dtype), dtype))
    for g, w, what in zip(got, want, ("energy", "forces", "d loss / d theta")):
        assert _rel(g, w) <= TOL[dtype_name], what


def _hvp(energy, pos, theta, v):
    """Hessian-vector product d/dpos <dE/dpos, v>: a second derivative through the op."""
    p = pos.detach().requires_grad_()
    (g,) = torch.autograd.grad(energy(p, theta), p, create_graph=True)
    (hv,) = torch.autograd.grad((g * v).sum(), p)
    return hv


@pytest.mark.parametrize("pkg", ["ir_mul"], indirect=True)
def test_torch_hessian_is_symmetric(pkg):
    """``u . H v == v . H u`` for random ``u, v``, and ``H v`` equals e3nn's: the Hessian's
    symmetry and values, from two Hessian-vector products instead of its 3 N rows (each a
    second backward through interpreted kernels on the CPU; any asymmetric ``H`` gives
    ``u^T (H - H^T) v != 0`` for random ``u, v``). One layout: the layout changes only the
    kernels' column arithmetic, which the second-order checks of ``test_torch_grads`` cover
    in both (the ``mul_ir`` case took a minute of the CI machine's 2 cores)."""
    torch_ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    energy, pos, theta, _ = torch_model(pkg, torch_ops.tensor_product, torch.float64)
    gen = torch.Generator().manual_seed(3)
    u, v = (torch.randn(pos.shape, generator=gen, dtype=torch.float64).to(pos.device) for _ in range(2))
    hu, hv = _hvp(energy, pos, theta, u), _hvp(energy, pos, theta, v)
    uhv, vhu = float((u * hv).sum()), float((v * hu).sum())
    assert abs(uhv - vhu) <= 1e-10 * float(u.norm() * hv.norm())  # the scale of the dot product
    e3nn_energy = torch_model(pkg, _e3nn_tp(pkg, torch.float64), torch.float64)[0]
    assert _rel(hv, _hvp(e3nn_energy, pos, theta, v)) <= 1e-9


def energy_and_forces(energy, pos, theta):
    """Energy and forces alone (no loss gradient: what the equivariance test compares)."""
    pos = pos.clone().requires_grad_()
    e = energy(pos, theta)
    return e.detach(), -torch.autograd.grad(e, pos)[0]


def test_torch_forces_are_equivariant(pkg):
    torch_ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    energy, pos, theta, _ = torch_model(pkg, torch_ops.tensor_product, torch.float64)
    rot = o3.rand_matrix(dtype=torch.float64).to(DEVICE)
    # the unrotated system once; no d loss / d theta (it was computed and not compared):
    # 10 interpreted launches per evaluation down to 2
    e0, f0 = energy_and_forces(energy, pos, theta)
    for q in (rot, -rot):  # a rotation, then a rotation with inversion
        energy_q = torch_model(pkg, torch_ops.tensor_product, torch.float64, rot=q)[0]
        e1, f1 = energy_and_forces(energy_q, pos @ q.T, theta)
        assert abs(float(e1 - e0)) <= 1e-10 * abs(float(e0))
        assert _rel(f1, f0 @ q.T) <= 1e-9


def test_torch_make_fx_symbolic_trace_then_compile(pkg):
    """NequIP/Nequix route: make_fx(tracing_mode='symbolic') of energy+forces, then compile."""
    from torch.fx.experimental.proxy_tensor import make_fx

    torch_ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    energy, pos, theta, _ = torch_model(pkg, torch_ops.tensor_product, torch.float64)

    def energy_and_forces(p, th):
        p = p.requires_grad_()
        e = energy(p, th)
        return e, -torch.autograd.grad(e, p, create_graph=True)[0]

    gm = make_fx(energy_and_forces, tracing_mode="symbolic", _allow_non_fake_inputs=True)(pos.clone(), theta)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any(pkg.__name__.split(".")[0] in t or "eqdsl" in t for t in targets), "generated ops missing from the trace"
    # no host sync (aten.item / nonzero / _local_scalar_dense); operator.getitem (unpacking a
    # multi-output op such as the fused backward) is not one
    syncs = ("aten.nonzero", "aten.item", "aten._local_scalar_dense")
    assert not any(t.startswith(syncs) for t in targets), [t for t in targets if t.startswith(syncs)]
    compiled = torch.compile(gm, fullgraph=True, dynamic=True)
    e_c, f_c = compiled(pos.clone(), theta)
    e_ref, f_ref = energy_and_forces(pos.clone(), theta)
    assert _rel(e_c, e_ref.detach()) <= 1e-12 and _rel(f_c, f_ref.detach()) <= 1e-12


# ----------------------------------------------------------------------------- jax


def jax_model(meta, tp, dtype):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    e3nn_jax = pytest.importorskip("e3nn_jax")
    pos0, src, dst, feats, theta0, f_ref = _system(meta)
    p1 = _to_layout_perm(meta.IRREPS_IN1, meta.LAYOUT)
    p2 = _to_layout_perm(meta.IRREPS_IN2, meta.LAYOUT)
    h = jnp.asarray(feats[:, p1], dtype=dtype)
    scal = _scalar_columns(meta)
    readout = jnp.linspace(-1.0, 1.0, len(scal), dtype=dtype)
    centers = jnp.linspace(0.5, 4.0, N_BASIS, dtype=dtype)

    def energy(pos, theta):
        vec = pos[dst] - pos[src]
        r = jnp.linalg.norm(vec, axis=1)
        x2 = e3nn_jax.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component").array[:, p2]
        w = jnp.exp(-((r[:, None] - centers) ** 2)) @ theta
        s = tp(h[src], x2, w)[:, scal]
        return (s @ readout).sum() + 0.5 * (s**2).sum()

    return energy, jnp.asarray(pos0, dtype=dtype), jnp.asarray(theta0, dtype=dtype), jnp.asarray(f_ref, dtype=dtype)


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
def test_jax_energy_forces_and_weight_gradient_match_e3nn(pkg, dtype_name):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jax_ops = importlib.import_module(pkg.__name__ + ".jax_ops")
    energy, pos, theta, f_ref = jax_model(pkg, jax_ops.tensor_product, getattr(jax.numpy, dtype_name))

    def loss(th, p):
        forces = -jax.grad(energy)(p, th)
        return ((forces - f_ref) ** 2).sum()

    # The model's own matmuls (radial basis, readout) in full float32: on a GPU jax's
    # default precision would use tf32 there, which is not what is under test.
    with jax.default_matmul_precision("highest"):
        e, de = jax.jit(jax.value_and_grad(energy))(pos, theta)  # one trace for both (interpret mode: slow)
        forces = -de
        g_theta = jax.jit(jax.grad(loss))(theta, pos)
    want = energy_forces_grad(*torch_model(pkg, _e3nn_tp(pkg, torch.float64), torch.float64))
    for g, w, what in zip((e, forces, g_theta), want, ("energy", "forces", "d loss / d theta")):
        assert _rel(torch.as_tensor(np.asarray(g, dtype=np.float64)), w.cpu()) <= TOL[dtype_name], what


def test_jax_hessian_is_symmetric(pkg):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jax_ops = importlib.import_module(pkg.__name__ + ".jax_ops")
    energy, pos, theta, _ = jax_model(pkg, jax_ops.tensor_product, jax.numpy.float64)
    hess = np.asarray(jax.jit(jax.jacrev(jax.grad(energy)))(pos, theta)).reshape(3 * N_ATOMS, 3 * N_ATOMS)
    assert np.abs(hess - hess.T).max() <= 1e-10 * np.abs(hess).max()
