"""The symmetric contraction's JAX entry point (Pallas kernels looping over term tables,
interpret mode on the CPU): every kernel equal to the numpy reference of its tables
(``eqdsl.symmetric.tables.apply_tables_reference``), the op equal to the IR-term and dense-U
numpy references (both layouts, float32 and float64, several channel blocks, rows not a
multiple of the block), reverse-mode derivatives to third order (``jax.test_util.check_grads``
order 2 in float64, and a force loss's gradients against a jnp mirror of the reference that
JAX differentiates itself), equivariance, argument errors, kernel source independent of the
irreps.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from eqdsl.symmetric import dense_reference, lower, parse_symmetric_specs, symmetric_contraction_reference  # noqa: E402
from eqdsl.symmetric.pallas import generate_symmetric_jax, jax_files, render_files  # noqa: E402
from eqdsl.symmetric.reference import from_channels, to_channels  # noqa: E402
from eqdsl.symmetric.tables import apply_tables_reference, max_order, op_tables  # noqa: E402
from tolerances import REL_TOL  # noqa: E402

# name -> (irreps_in, irreps_out, correlation, layout, block_channels): "a" runs two channel
# blocks of 2 lanes per row, "b" one block of 4 lanes for its 3 channels (a padded lane)
CASES = {
    "a": ("4x0e+4x1o", "4x0e+4x1o", 3, "mul_ir", 2),
    "b": ("3x0e+3x1o+3x2e", "3x0e+3x1o", 2, "ir_mul", 32),
}
N = 7  # rows: not a multiple of the block (padding)


def _spec(name):
    irreps_in, irreps_out, corr, layout, _ = CASES[name]
    (spec,) = parse_symmetric_specs(
        f'[[symmetric_contraction]]\nname = "jsc_{name}"\nirreps_in = "{irreps_in}"\nirreps_out = "{irreps_out}"\n'
        f'correlation = {corr}\nnum_elements = 3\nlayout = "{layout}"\n')
    return spec


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    """XLA compiling the interpret-mode kernels dominates the time: most XLA optimizations off
    while this module runs (as in test_jax_grads; the same ops, unfused)."""
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def x64():
    old = jax.config.jax_enable_x64  # other files of the same process may have set it
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


@pytest.fixture(scope="module")
def packages(tmp_path_factory, x64):
    root = tmp_path_factory.mktemp("symjax")
    sys.path.insert(0, str(root))
    out = {}
    for name in CASES:
        spec = _spec(name)
        ir = lower(spec)
        generate_symmetric_jax(ir, root, block_channels=CASES[name][4], block_nodes=4)
        importlib.invalidate_caches()
        out[name] = (spec, ir, importlib.import_module(f"jsc_{name}.jax_ops"))
    yield out
    sys.path.remove(str(root))


def _inputs(ir, seed=0, n=N):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, ir.dim_in * ir.mul))
    w = rng.normal(size=(ir.num_elements, ir.weight_numel))
    elem = rng.integers(0, ir.num_elements, n)
    elem[:3] = [0, 1, 2][:n]  # every element used
    return x, w, elem


def _rel(got, want):
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _jnp_reference(ir):
    """``symmetric_contraction_reference`` in jnp, vectorized over the terms (JAX
    differentiates it itself): every monomial a product of gathered components (padded with
    a component of ones), every term's weight a gathered column, summed into its output row
    by a 0/1 matrix."""
    from eqdsl.irreps import Irreps

    in_dims = tuple(mi.ir.dim for mi in Irreps(ir.irreps_in))
    degree = max(t.nu for t in ir.terms)
    mono = np.array([t.monomial + (ir.dim_in,) * (degree - t.nu) for t in ir.terms])  # (T, degree)
    cols = np.array([ir.weight_offsets[t.out][t.nu - 1] + t.k * ir.mul for t in ir.terms])[:, None] + np.arange(ir.mul)
    coeff = np.array([t.coeff for t in ir.terms])[:, None]
    rows = np.cumsum((0,) + ir.out_dims)[[t.out for t in ir.terms]] + np.array([t.m for t in ir.terms])
    scatter = np.zeros((sum(ir.out_dims), len(ir.terms)))
    scatter[rows, np.arange(len(ir.terms))] = 1.0

    def channels(a, dims):
        blocks, s = [], 0
        for d in dims:
            b = a[:, s:s + d * ir.mul]
            blocks.append(b.reshape(-1, ir.mul, d).transpose(0, 2, 1) if ir.layout == "mul_ir"
                          else b.reshape(-1, d, ir.mul))
            s += d * ir.mul
        return jnp.concatenate(blocks, axis=1)

    def f(x, w, elem):
        xc = channels(x, in_dims)  # (n, dim_in, mul)
        xe = jnp.concatenate([xc, jnp.ones_like(xc[:, :1])], axis=1)
        p = jnp.prod(xe[:, mono, :], axis=2) * coeff * w[elem][:, cols]  # (n, T, mul)
        out = jnp.einsum("rt,ntc->nrc", scatter, p)  # (n, dim_out, mul)
        blocks, s = [], 0
        for d in ir.out_dims:
            b = out[:, s:s + d]
            blocks.append((b.transpose(0, 2, 1) if ir.layout == "mul_ir" else b).reshape(x.shape[0], -1))
            s += d
        return jnp.concatenate(blocks, axis=1)

    return f


def test_jnp_reference_is_the_reference(packages):
    for name in CASES:
        _, ir, _ = packages[name]
        x, w, elem = _inputs(ir, seed=9)
        want = symmetric_contraction_reference(x, w, elem, ir)
        assert _rel(_jnp_reference(ir)(jnp.asarray(x), jnp.asarray(w), jnp.asarray(elem)), want) < 1e-13


# ---------------------------------------------------------------- kernels against their tables


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_equal_table_reference(packages, name):
    """Every kernel (each kind, each order ``n``) on ``ir_mul`` rows equals the numpy reference
    of what its tables define (``apply_tables_reference``, itself checked against autograd of
    the dense U contraction in tests of ``eqdsl.symmetric.tables``), float64: all slots, channel
    blocks, padded lanes, masked rows (7 rows, blocks of 4) and, for ``bwd_w``, the per-element
    sums (test_first_order_ir_mul_weight_chunks cuts them into several chunks per element).
    Through ``launch_jit``, as the ops call them: the later tests reuse these compiled kernels."""
    from eqdsl.runtime.jax import symmetric as runtime

    _, ir, ops = packages[name]
    mod = importlib.import_module(f"jsc_{name}.pallas_kernels")
    rng = np.random.default_rng(3)
    dim_x, dim_g = ir.dim_in * ir.mul, sum(ir.out_dims) * ir.mul
    x, w, elem = _inputs(ir, seed=11)
    vs = [rng.normal(size=x.shape) for _ in range(max_order(ir, "fwd"))]
    g = rng.normal(size=(N, dim_g))
    for kind in ("fwd", "bwd_x", "bwd_w"):
        for n in range(max_order(ir, kind) + 1):
            got = runtime.launch_jit(mod, kind, n, jnp.asarray(x), tuple(jnp.asarray(v) for v in vs[:n]),
                                     jnp.asarray(w), None if kind == "fwd" else jnp.asarray(g),
                                     jnp.asarray(elem, jnp.int32), block_nodes=4, interpret=True)
            width = {"fwd": dim_g, "bwd_x": dim_x, "bwd_w": ir.weight_numel}[kind]
            want = apply_tables_reference(op_tables(ir, kind, n, "ir_mul"), ir.mul, x, vs[:n], weights=w,
                                          g=g, elem=elem, num_elements=ir.num_elements, result_width=width)
            assert got.shape == want.shape, (kind, n)
            assert np.abs(want).max() > 0.1, (kind, n)  # no kernel that is all zeros could pass
            assert _rel(got, want) < 1e-13, (kind, n)


def test_kernel_source_independent_of_irreps():
    """Kernel source is a function of (kind, n, term groups, block sizes): two contractions of
    other irreps and equal degree get the same kernels, each a few lines."""
    import re

    spec_c = parse_symmetric_specs('[[symmetric_contraction]]\nname = "jsc_c"\nirreps_in = "4x0e+4x1o+4x2e+4x3o"\n'
                                   'irreps_out = "4x0e+4x1o+4x2e"\ncorrelation = 3\nnum_elements = 5\n')[0]
    a = render_files(lower(_spec("a")), block_channels=2)["pallas_kernels.py"]
    c = render_files(lower(spec_c), block_channels=2)["pallas_kernels.py"]

    def kernels(text):
        return re.findall(r"^def \w+\(.*?(?=^def |^# \(op, n\))", text, flags=re.M | re.S)

    assert kernels(a) == kernels(c) and len(kernels(a)) == 11
    assert max(len(k.strip().splitlines()) for k in kernels(a)) <= 40


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_equals_references(packages, name, dtype):
    spec, ir, ops = packages[name]
    x, w, elem = _inputs(ir)
    want = symmetric_contraction_reference(x, w, elem, ir)
    np.testing.assert_allclose(dense_reference(spec, x, w, elem), want, rtol=0, atol=1e-12 * np.abs(want).max())
    got = jax.jit(ops.symmetric_contraction)(jnp.asarray(x, dtype), jnp.asarray(w, dtype), jnp.asarray(elem))
    assert got.dtype == dtype and got.shape == want.shape
    assert _rel(got, want) < REL_TOL[dtype]
    # every output block is really computed (no all-zero block could pass)
    assert np.abs(want).min(axis=0).max() > 0 and all(np.abs(want[:, c]).max() > 1e-3 for c in range(want.shape[1]))


# ---------------------------------------------------------------- derivatives


def test_check_grads_order_2(packages):
    # the derivative tests share case "a" (correlation 3, mul_ir, two channel blocks): each
    # kernel compiles once in interpret mode (seconds each); "b" differs in column addresses only
    _, ir, ops = packages["a"]
    x, w, elem = _inputs(ir, seed=1)
    e = jnp.asarray(elem)
    f = lambda x, w: ops.symmetric_contraction(x, w, e)  # noqa: E731  (eager: each kernel compiles once)
    check_grads(f, (jnp.asarray(x) * 0.5, jnp.asarray(w)), order=2, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_force_loss_gradients_equal_jax_of_reference(packages):
    """Energy, forces (d energy / d x) and a force loss's gradients w.r.t. W and x (second
    derivatives: the jvp of fwd, d bwd_w / dx, the Hessian-vector product), float64."""
    _, ir, ops = packages["a"]
    x, w, elem = _inputs(ir, seed=2)
    e = jnp.asarray(elem)
    ref = _jnp_reference(ir)
    readout = jnp.asarray(np.random.default_rng(5).normal(size=(ir.mul * sum(ir.out_dims),)))
    target = jnp.asarray(np.random.default_rng(6).normal(size=x.shape))

    def make(contract):
        def energy(x, w):
            return jnp.sum(jnp.tanh(contract(x, w, e)) * readout)

        def loss(x, w):
            forces = -jax.grad(energy)(x, w)
            return energy(x, w) ** 2 + jnp.sum((forces - target) ** 2)

        return lambda x, w: (energy(x, w), -jax.grad(energy)(x, w), *jax.grad(loss, argnums=(0, 1))(x, w))

    got = make(ops.symmetric_contraction)(jnp.asarray(x), jnp.asarray(w))
    want = make(ref)(jnp.asarray(x), jnp.asarray(w))
    for g, r, what in zip(got, want, ("energy", "forces", "dloss/dx", "dloss/dW")):
        assert _rel(g, np.asarray(r)) < REL_TOL["float64"], what


def test_first_order_ir_mul_weight_chunks(packages, monkeypatch):
    """Case "b" (ir_mul, correlation 2, a padded lane): d<out, G>/dx and /dW equal JAX's
    derivatives of the jnp reference (float64). dW is summed on chip over chunks of
    element-sorted rows, here of 4 rows in tiles of 2 (several tiles per chunk, several chunks
    per element). Under jit a row with an element index out of range adds nothing to dW and
    gets a NaN dx."""
    from eqdsl.runtime.jax import symmetric as runtime

    monkeypatch.setattr(runtime, "CHUNK_ROWS", 4)
    _, ir, ops = packages["b"]
    rng = np.random.default_rng(12)
    n = 11
    x = jnp.asarray(rng.normal(size=(n, ir.dim_in * ir.mul)))
    w = jnp.asarray(rng.normal(size=(ir.num_elements, ir.weight_numel)))
    elem = jnp.asarray([2, 0, 2, 2, 1, 2, 2, 0, 2, 5, 2])  # element 2: 7 rows; row 9 out of range
    cot = jnp.asarray(rng.normal(size=(n, ir.mul * sum(ir.out_dims))))

    def grads(contract, x, w, e, cot):
        return jax.grad(lambda x, w: jnp.sum(contract(x, w, e) * cot), argnums=(0, 1))(x, w)

    # elem an argument of the jitted function (traced: a closed-over constant would be checked)
    sc = lambda x, w, e: ops.symmetric_contraction(x, w, e, block_nodes=2)  # noqa: E731
    gx, gw = jax.jit(lambda x, w, e: grads(sc, x, w, e, cot))(x, w, elem)
    keep = np.arange(n) != 9
    rx, rw = grads(_jnp_reference(ir), x[keep], w, elem[keep], cot[keep])
    assert _rel(np.asarray(gx)[keep], np.asarray(rx)) < REL_TOL["float64"]
    assert _rel(gw, np.asarray(rw)) < REL_TOL["float64"]
    assert np.isnan(np.asarray(gx)[9]).all()
    assert np.abs(np.asarray(rx)).max() > 0.1 and np.abs(np.asarray(rw)).max() > 0.1


def test_third_order(packages):
    """The default levels (3 for correlation 3: every order) give a third derivative in x (the
    kernels fwd_2, bwd_x_2, bwd_w_2): a directional third derivative of the energy equals the jnp
    reference's."""
    _, ir, ops = packages["a"]
    x, w, elem = _inputs(ir, seed=4)
    e, wj = jnp.asarray(elem), jnp.asarray(w)
    v = jnp.asarray(np.random.default_rng(7).normal(size=x.shape))

    def third(contract):
        en = lambda x: jnp.sum(contract(x, wj, e) ** 2)  # noqa: E731
        d1 = lambda x: jnp.vdot(jax.grad(en)(x), v)  # noqa: E731
        d2 = lambda x: jnp.vdot(jax.grad(d1)(x), v)  # noqa: E731
        return jax.grad(d2)

    got = third(ops.symmetric_contraction)(jnp.asarray(x))
    want = jax.jit(third(_jnp_reference(ir)))(jnp.asarray(x))
    assert _rel(got, np.asarray(want)) < REL_TOL["float64"]


def test_order_beyond_levels_refused(tmp_path, x64):
    (spec,) = parse_symmetric_specs('[[symmetric_contraction]]\nname = "jsc_t"\nirreps_in = "2x0e"\n'
                                    'irreps_out = "2x0e"\ncorrelation = 3\nnum_elements = 3\n')
    ir = lower(spec)
    files = render_files(ir, levels=1)
    assert "def fwd_2" not in files["pallas_kernels.py"] and "def bwd_x_1" in files["pallas_kernels.py"]
    generate_symmetric_jax(ir, tmp_path, levels=1, block_channels=2)
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        ops = importlib.import_module("jsc_t.jax_ops")
        x, w, elem = _inputs(ir)
        en = lambda x: jnp.sum(ops.symmetric_contraction(x, jnp.asarray(w), jnp.asarray(elem)) ** 3)  # noqa: E731
        h = jax.grad(lambda x: jnp.sum(jax.grad(en)(x) ** 2))  # second order: fine
        jax.make_jaxpr(h)(jnp.asarray(x))  # traced only (the rules run at trace time): no compile
        with pytest.raises(NotImplementedError, match="levels=2"):
            jax.make_jaxpr(jax.grad(lambda x: jnp.sum(h(x) ** 2)))(jnp.asarray(x))
    finally:
        sys.path.remove(str(tmp_path))


# ---------------------------------------------------------------- equivariance


@pytest.mark.parametrize("name", sorted(CASES))
def test_equivariant_under_rotation_and_inversion(packages, name, request):
    torch = pytest.importorskip("torch")
    o3 = pytest.importorskip("e3nn.o3")
    spec, ir, ops = packages[name]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn's wigner_D tables in float64
    request.addfinalizer(lambda: torch.set_default_dtype(old))
    x, w, elem = _inputs(ir, seed=8)
    f = jax.jit(ops.symmetric_contraction)
    out = np.asarray(f(jnp.asarray(x), jnp.asarray(w), jnp.asarray(elem)))
    torch.manual_seed(0)
    r = o3.rand_matrix()

    def d_matrix(irreps, mat):
        # e3nn's D acts on mul_ir rows; an ir_mul row y is the mul_ir row y @ p
        dims = tuple(mi.ir.dim for mi in o3.Irreps(irreps))
        d = o3.Irreps(irreps).D_from_matrix(mat).numpy()
        if ir.layout == "mul_ir":
            return d
        p = from_channels(to_channels(np.eye(d.shape[0]), dims, ir.mul, "ir_mul"), dims, "mul_ir")
        return p @ d @ p.T

    for mat in (r, -r, -torch.eye(3)):  # rotation, both, inversion
        a, b = d_matrix(ir.irreps_in, mat), d_matrix(ir.irreps_out, mat)
        rotated = np.asarray(f(jnp.asarray(x @ a.T), jnp.asarray(w), jnp.asarray(elem)))
        np.testing.assert_allclose(rotated, out @ b.T, rtol=0, atol=1e-11 * np.abs(out).max())


# ---------------------------------------------------------------- errors


def test_bad_arguments(packages):
    _, ir, ops = packages["a"]
    x, w, elem = (jnp.asarray(a) for a in _inputs(ir))
    sc = ops.symmetric_contraction
    with pytest.raises(ValueError, match=r"x must have shape \(num_nodes, 16\)"):
        sc(x[:, :-1], w, elem)
    with pytest.raises(ValueError, match=r"weights must have shape \(3, "):
        sc(x, w[:2], elem)
    with pytest.raises(ValueError, match=r"element must have shape \(7,\)"):
        sc(x, w, elem[:-1])
    with pytest.raises(TypeError, match="element must hold integer"):
        sc(x, w, elem.astype(jnp.float64))
    with pytest.raises(TypeError, match="one dtype"):
        sc(x, w.astype(jnp.float32), elem)
    with pytest.raises(TypeError, match="x has dtype int32"):
        sc(x.astype(jnp.int32), w, elem)
    with pytest.raises(ValueError, match=r"element indices must lie in 0..2, got min 0, max 3"):
        sc(x, w, elem.at[1].set(3))
    with pytest.raises(ValueError, match=r"element indices must lie in 0..2, got min -1"):
        sc(x, w, elem.at[1].set(-1))
    with pytest.raises(ValueError, match="block_nodes must be a power of two"):
        sc(x, w, elem, block_nodes=3)
    with pytest.raises(TypeError, match="x must be an array"):
        sc([[1.0]], w, elem)
    # under jit an index cannot be checked: that row is NaN, the others exact
    out = np.asarray(jax.jit(sc)(x, w, elem.at[1].set(3)))
    assert np.isnan(out[1]).all() and not np.isnan(np.delete(out, 1, axis=0)).any()
    want = symmetric_contraction_reference(np.asarray(x), np.asarray(w), np.asarray(elem), ir)
    assert _rel(np.delete(out, 1, axis=0), np.delete(want, 1, axis=0)) < 1e-12


def test_generator_arguments():
    ir = lower(_spec("a"))
    with pytest.raises(ValueError, match="block_channels must be a power of two"):
        render_files(ir, block_channels=3)
    with pytest.raises(ValueError, match="block_nodes must be a power of two"):
        render_files(ir, block_nodes=6)
    with pytest.raises(ValueError, match="levels must be >= 1"):
        render_files(ir, levels=0)


# ---------------------------------------------------------------- the GPU lowering


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_triton_lowering(packages, dtype):
    """The kernels of a force loss's gradients go through Pallas's Triton lowering (on the
    CPU: ``lowering_platforms=("cuda",)``; Triton's own compilation needs a GPU)."""
    _, ir, ops = packages["a"]
    s = jax.ShapeDtypeStruct
    args = (s((32, ir.dim_in * ir.mul), dtype), s((ir.num_elements, ir.weight_numel), dtype), s((32,), jnp.int32))

    def loss(x, w, e):
        en = lambda x, w: jnp.sum(ops.symmetric_contraction(x, w, e, interpret=False) ** 2)  # noqa: E731
        return jnp.sum(jax.grad(en)(x, w) ** 2) + en(x, w)

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    for name in ("fwd_0", "bwd_x_0", "bwd_w_0", "fwd_1", "bwd_x_1", "bwd_w_1"):
        assert f"jsc_a_{name}" in text, name


def test_package_files(packages):
    _, ir, ops = packages["a"]
    files = jax_files(ir)
    assert sorted(files) == ["jsc_a/jax_ops.py", "jsc_a/pallas_kernels.py"]
    assert files == jax_files(ir)  # deterministic
    assert all(t.startswith("# Generated by eqdsl") for t in files.values())
    pkg = importlib.import_module("jsc_a")
    assert (pkg.KIND, pkg.WEIGHT_NUMEL, pkg.LAYOUT) == ("symmetric_contraction", ir.weight_numel, "mul_ir")
    assert (ops.WEIGHT_NUMEL, ops.DIM_IN, ops.OUT_DIMS) == (ir.weight_numel, ir.dim_in, ir.out_dims)
    # every order: kernels up to the degree (3); bwd_x_3 is zero and absent
    kernels = importlib.import_module("jsc_a.pallas_kernels")
    assert kernels.LEVELS == kernels.DEGREE == 3 and ("fwd", 3) in kernels.KERNELS
    assert ("bwd_x", 3) not in kernels.KERNELS
