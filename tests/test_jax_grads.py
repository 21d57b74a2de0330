"""Gradients of the generated JAX/Pallas tensor products, to second order and beyond.

The tensor product is the derivative of a four-linear form (affine in the weights when
some paths are unweighted); its three backward kernels are compared with the numpy
oracle ``tensor_product_vjp_reference``, and derivatives of derivatives (which run the
same kernels with cotangents substituted for operands) with a dense ``jnp.einsum``
implementation differentiated by JAX itself, and with ``jax.test_util.check_grads``.

On the CPU the Pallas kernels run in interpret mode. Compiling interpret-mode kernels
with XLA dominates the time, so this module turns most XLA optimizations off while it
runs, uses a small batch block (``BB``: several programs, padded rows at ``BATCH``)
and draws shapes from a few fixed sizes. GPU tests (``-m gpu``) check every example
spec on the device.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from eqdsl.reference import _SUBSCRIPTS, dense_cg, tensor_product_reference, tensor_product_vjp_reference  # noqa: E402
from eqdsl.runtime.jax import launch, padding as rt  # noqa: E402
from test_jax_ops import EXAMPLES, MIXED, TOL, Built, build, gpu, inputs, random_specs, rel_err, spec_text  # noqa: E402

BB = 4  # batch rows per program in these tests
BATCH = 13  # not a multiple of BB: 3 padded rows, 4 programs

# Every mode, weighted and unweighted, multiplicity 1 (no loop) and 3 (padded to 4 lanes).
SMALL = dict(
    in1="3x0e+1x1o", in2="1x0e+3x1o", out="2x1o+1x1e+1x1o+3x1o",
    instructions=[(0, 1, 0, "uvw", True), (1, 1, 1, "uvu", False), (1, 0, 2, "uvv", True), (0, 1, 3, "uvv", False),
                  (0, 1, 3, "uuu", False), (1, 0, 2, "uvw", True), (0, 1, 3, "uvu", True)],
)


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("jaxgrads")


@pytest.fixture(scope="module")
def specs(root):
    cache = {}

    def get(name, shared, layout):
        key = (name, shared, layout)
        if key not in cache:
            kw = {"mixed": MIXED, "small": SMALL}[name]
            cache[key] = build(spec_text(name, **kw, shared=shared, layout=layout), root)
        return cache[key]

    return get


def jnp_tensor_product(ir, x1, x2, w):
    """The IR as dense einsums in jnp (differentiable by JAX to any order, any mode)."""
    batch = x1.shape[0]
    if ir.shared_weights:
        w = jnp.broadcast_to(w, (batch, ir.weight_numel))

    def view(x, b):
        seg = x[:, b.offset:b.offset + b.size]
        if b.stride_comp == 1:
            return seg.reshape(batch, b.mul, b.dim)
        return seg.reshape(batch, b.dim, b.mul).transpose(0, 2, 1)

    outs = [jnp.zeros((batch, b.mul, b.dim), x1.dtype) for b in ir.out]
    for p in ir.paths:
        b1, b2, bo = ir.in1[p.i_in1], ir.in2[p.i_in2], ir.out[p.i_out]
        sw, s1, s2, so = _SUBSCRIPTS[p.mode]
        c = jnp.asarray(dense_cg(p, b1.dim, b2.dim, bo.dim), x1.dtype)
        pw = (w[:, p.weight_offset:p.weight_offset + p.weight_numel].reshape(batch, *p.path_shape) if p.has_weight
              else jnp.ones((batch, *p.path_shape), x1.dtype))
        outs[p.i_out] = outs[p.i_out] + jnp.einsum(f"{sw},ijk,{s1},{s2}->{so}", pw, c, view(x1, b1), view(x2, b2))
    return jnp.concatenate(
        [(o if b.stride_comp == 1 else o.transpose(0, 2, 1)).reshape(batch, -1) for o, b in zip(outs, ir.out)], axis=1)


def grad_out(ir, batch, seed=7):
    return np.random.default_rng(seed).normal(size=(batch, ir.dim_out))


def check_vjp(b: Built, batch: int, dtype: str, *, block_batch=BB, seed=0):
    """The three backward kernels (run directly) against the numpy oracle."""
    x1, x2, w = inputs(b.ir, batch, seed=seed)
    g = grad_out(b.ir, batch, seed=seed + 1)
    want = tensor_product_vjp_reference(b.ir, x1, x2, w, g)
    got = b.ops.tensor_product_vjp(*(jnp.asarray(a, dtype) for a in (x1, x2, w, g)), block_batch=block_batch)
    for name, a, c in zip(("grad_x1", "grad_x2", "grad_weights"), got, want):
        assert a.shape == c.shape and a.dtype == jnp.dtype(dtype), name
        err = rel_err(a, c)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3e}"


# ---------------------------------------------------------------- first order vs the oracle


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("shared", [False, True])
def test_backward_kernels_match_reference_mixed(specs, shared, layout):
    """All four modes, unweighted paths, mixed multiplicities; padded rows (BATCH % BB != 0)."""
    b = specs("mixed", shared, layout)
    check_vjp(b, BATCH, "float64")
    if shared == (layout == "ir_mul"):  # float32 on two of the four (each dtype compiles its own kernels)
        check_vjp(b, BATCH, "float32")


@pytest.mark.parametrize("shared,layout", [(False, "ir_mul"), (True, "mul_ir")])
def test_backward_kernels_match_reference_small(specs, shared, layout):
    b = specs("small", shared, layout)
    check_vjp(b, BATCH, "float64")
    check_vjp(b, 5, "float32", block_batch=None)  # default block: one program, most rows padded


# ---------------------------------------------------------------- higher orders


def _second_order(tp, args, r, vs):
    """(grad L, grad <v, grad L>) for L = sum(r * tp(args)**2): first order through the
    custom_vjp of the forward, second order through those of every kernel."""
    def loss(*a):
        return jnp.sum(r * tp(*a) ** 2)

    def gv(*a):
        return sum(jnp.vdot(v, gi) for v, gi in zip(vs, jax.grad(loss, argnums=(0, 1, 2))(*a)))

    return jax.jit(lambda *a: (jax.grad(loss, argnums=(0, 1, 2))(*a), jax.grad(gv, argnums=(0, 1, 2))(*a)))(*args)


@pytest.mark.parametrize("name,shared,layout", [("mixed", False, "mul_ir"), ("mixed", True, "ir_mul"),
                                                ("small", True, "mul_ir")])
def test_first_and_second_order_match_dense_jnp(specs, name, shared, layout):
    """Gradients and Hessian-vector products through the kernels equal those of dense
    einsums (float64); the first order is also checked against the numpy oracle."""
    b = specs(name, shared, layout)
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, BATCH, seed=3))
    rng = np.random.default_rng(4)
    r = jnp.asarray(rng.normal(size=(BATCH, b.ir.dim_out)))
    vs = [jnp.asarray(rng.normal(size=a.shape)) for a in (x1, x2, w)]
    got = _second_order(lambda a, c, d: b.ops.tensor_product(a, c, d, block_batch=BB), (x1, x2, w), r, vs)
    want = _second_order(lambda a, c, d: jnp_tensor_product(b.ir, a, c, d), (x1, x2, w), r, vs)
    out = tensor_product_reference(b.ir, *(np.asarray(t) for t in (x1, x2, w)))
    oracle = tensor_product_vjp_reference(b.ir, x1, x2, w, 2 * np.asarray(r) * out)
    for a, c, o in zip(got[0], want[0], oracle):
        assert rel_err(a, o) <= 1e-12 and rel_err(c, o) <= 1e-12
    for a, c in zip(got[1], want[1]):
        assert rel_err(a, c) <= 1e-10


def test_third_order_matches_dense_jnp(specs):
    """Second derivatives of tensor_product_vjp (third of the tensor product): VJPs of every kernel."""
    b = specs("small", False, "mul_ir")
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 5, seed=5))
    g = jnp.asarray(grad_out(b.ir, 5))
    rng = np.random.default_rng(6)
    rs = [jnp.asarray(rng.normal(size=a.shape)) for a in (x1, x2, w)]
    v = [jnp.asarray(rng.normal(size=a.shape)) for a in (x1, x2, w, g)]

    def scalar(vjp):
        def s(*a):  # a nonlinear scalar of the three gradients
            return sum(jnp.sum(ri * gi ** 2) for ri, gi in zip(rs, vjp(*a)))

        def sv(*a):
            return sum(jnp.vdot(vi, gi) for vi, gi in zip(v, jax.grad(s, argnums=(0, 1, 2, 3))(*a)))

        return jax.jit(jax.grad(sv, argnums=(0, 1, 2, 3)))(x1, x2, w, g)

    def dense_vjp(a, c, d, e):
        return jax.vjp(lambda *t: jnp_tensor_product(b.ir, *t), a, c, d)[1](e)

    got = scalar(lambda a, c, d, e: b.ops.tensor_product_vjp(a, c, d, e, block_batch=BB))
    want = scalar(dense_vjp)
    for a, c in zip(got, want):
        assert rel_err(a, c) <= 1e-10


def test_check_grads_order_2_fixed(specs):
    b = specs("small", True, "ir_mul")
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 5, seed=8))
    check_grads(jax.jit(lambda a, c, d: b.ops.tensor_product(a, c, d, block_batch=BB)), (x1, x2, w), order=2,
                modes=["rev"])


@st.composite
def small_specs(draw):
    """Random small specs: multiplicities up to 3, l up to 2, a few paths (compiles stay cheap)."""
    irr = [(l, p) for l in range(3) for p in (1, -1)]
    block = st.tuples(st.integers(1, 3), st.sampled_from(irr))
    in1 = draw(st.lists(block, min_size=1, max_size=2))
    in2 = draw(st.lists(block, min_size=1, max_size=2))
    out, ins = [], []
    for _ in range(draw(st.integers(1, 3))):
        i, j = draw(st.integers(0, len(in1) - 1)), draw(st.integers(0, len(in2) - 1))
        (m1, (l1, p1)), (m2, (l2, p2)) = in1[i], in2[j]
        lo = draw(st.integers(abs(l1 - l2), min(l1 + l2, 2)))
        mode = draw(st.sampled_from(["uvw", "uvu", "uvv"] + (["uuu"] if m1 == m2 else [])))
        mul = {"uvw": draw(st.integers(1, 3)), "uvu": m1, "uvv": m2, "uuu": m1}[mode]
        if any(x[:2] == (i, j) and x[3] == mode for x in ins):
            continue
        out.append((mul, (lo, p1 * p2)))
        ins.append((i, j, len(out) - 1, mode, mode == "uvw" or draw(st.booleans())))
    fmt = lambda bl: "+".join(f"{m}x{l}{'e' if p == 1 else 'o'}" for m, (l, p) in bl)  # noqa: E731
    return dict(in1=fmt(in1), in2=fmt(in2), out=fmt(out), instructions=ins, shared=draw(st.booleans()),
                layout=draw(st.sampled_from(["mul_ir", "ir_mul"])))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(kw=small_specs())
def test_check_grads_order_2_random_specs(root, kw):
    b = build(spec_text("cg", **kw), root)
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 5, seed=9))
    check_grads(jax.jit(lambda a, c, d: b.ops.tensor_product(a, c, d, block_batch=BB)), (x1, x2, w), order=2,
                modes=["rev"])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(kw=random_specs(), batch=st.sampled_from([1, 5, BATCH]), dtype=st.sampled_from(["float32", "float64"]),
       block=st.sampled_from([BB, None]))
def test_random_specs_backward_match_reference(root, kw, batch, dtype, block):
    from eqdsl.errors import SpecError

    try:
        b = build(spec_text("rnd", **kw), root)
    except SpecError:  # e.g. a mode shorthand that gives no path for these irreps
        return
    check_vjp(b, batch, dtype, block_batch=block, seed=batch)


# ---------------------------------------------------------------- transformations


@pytest.mark.parametrize("shared", [False, True])
def test_jit_and_vmap_of_gradients(specs, shared):
    """vmap over a leading axis of grad, of tensor_product_vjp, and of a second derivative
    (with unbatched shared weights their gradients are per mapped example, as JAX does)."""
    b = specs("small", shared, "ir_mul")
    ir, n, batch = b.ir, 2, 5
    rng = np.random.default_rng(11)
    x1 = jnp.asarray(rng.normal(size=(n, batch, ir.dim_in1)))
    x2 = jnp.asarray(rng.normal(size=(n, batch, ir.dim_in2)))
    w = jnp.asarray(rng.normal(size=(ir.weight_numel,) if shared else (n, batch, ir.weight_numel)))
    g = jnp.asarray(rng.normal(size=(n, batch, ir.dim_out)))
    w_axis = None if shared else 0
    wi = lambda i: w if shared else w[i]  # noqa: E731

    def loss(a, c, d):
        return jnp.sum(b.ops.tensor_product(a, c, d, block_batch=BB) ** 2)

    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, 0, w_axis)))(x1, x2, w)
    vjps = jax.vmap(lambda a, c, d, e: b.ops.tensor_product_vjp(a, c, d, e, block_batch=BB),
                    in_axes=(0, 0, w_axis, 0))(x1, x2, w, g)
    # a derivative of a derivative under vmap; with shared weights unbatched, JAX sums
    # the weight cotangents over the mapped axis
    hv = jax.vmap(jax.grad(lambda a, c, d: jnp.sum(jax.grad(loss, argnums=1)(a, c, d) ** 2), argnums=(0, 2)),
                  in_axes=(0, 0, w_axis))(x1, x2, w)
    for i in range(n):
        xi = [np.asarray(t[i]) for t in (x1, x2)]
        out = tensor_product_reference(ir, *xi, np.asarray(wi(i)))
        want = tensor_product_vjp_reference(ir, *xi, np.asarray(wi(i)), 2 * out)
        for a, c in zip(grads, want):
            assert rel_err(a[i], c) <= 1e-10
        want = tensor_product_vjp_reference(ir, *xi, np.asarray(wi(i)), np.asarray(g[i]))
        for a, c in zip(vjps, want):
            assert rel_err(a[i], c) <= 1e-10
        dense = jax.grad(lambda a, c, d: jnp.sum(jax.grad(
            lambda a, c, d: jnp.sum(jnp_tensor_product(ir, a, c, d) ** 2), argnums=1)(a, c, d) ** 2), argnums=(0, 2))
        d1, d3 = dense(x1[i], x2[i], wi(i))
        assert rel_err(hv[0][i], d1) <= 1e-10
        assert rel_err(hv[1][i], d3) <= 1e-10


def test_forward_mode_is_refused_clearly(specs):
    """custom_vjp has no forward mode: jax.jvp / jacfwd raise JAX's TypeError (documented)."""
    b = specs("small", False, "mul_ir")
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 5))
    with pytest.raises(TypeError, match="forward-mode autodiff .*custom_vjp"):
        jax.jvp(b.ops.tensor_product, (x1, x2, w), (x1, x2, w))
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jacfwd(lambda c: b.ops.tensor_product(x1, c, w))(x2)
    assert "forward mode" in b.ops.__doc__.lower() and "jax.jvp" in b.ops.__doc__


# ---------------------------------------------------------------- kernel level


def _padded(b: Built, batch: int, rows: int, seed=0):
    """Kernel operands: the spec's rows padded with zero rows, weights as the kernels take them."""
    ops = b.ops
    x1, x2, w = inputs(b.ir, batch, seed=seed)
    g = grad_out(b.ir, batch, seed=seed)
    a, c, e = (rt.pad_rows(jnp.asarray(t), rows) for t in (x1, x2, g))
    d = rt.kernel_weights(jnp.asarray(w), ops.WEIGHT_NUMEL, ops.SHARED_WEIGHTS, rows)
    return (x1, x2, w, g), (a, c, d, e)


@pytest.mark.parametrize("shared", [False, True])
def test_kernel_outputs_are_zero_in_padded_rows(specs, shared):
    """Zero rows past the batch give zero rows (so kernel outputs can be fed back as
    operands, as derivatives of derivatives do), and the real rows are the oracle's: the
    kernels read and write the spec's rows in place (``mul_ir`` here: tiles split on chip)."""
    b = specs("small", shared, "mul_ir")
    rows = 16
    (x1, x2, w, g), (a, c, d, e) = _padded(b, BATCH, rows)
    K = b.ops.KERNEL_OPS
    want = dict(zip(("fwd", "bwd_x1", "bwd_x2", "bwd_w"),
                    (tensor_product_reference(b.ir, x1, x2, w),) + tensor_product_vjp_reference(b.ir, x1, x2, w, g)))
    outs = {"fwd": K.fwd(a, c, d, BB, True), "bwd_x1": K.bwd_x1(e, c, d, BB, True),
            "bwd_x2": K.bwd_x2(a, e, d, BB, True), "bwd_w": K.bwd_w(a, c, e, BB, True)}
    for name, y in outs.items():
        y = np.asarray(y)
        assert np.all(np.isfinite(y)), name
        if name == "bwd_w" and shared:
            assert y.shape == (1, b.ir.weight_numel)
            assert rel_err(y[0], want[name]) <= 1e-12, name
            continue
        assert y.shape[0] == rows and np.all(y[BATCH:] == 0.0), f"{name}: nonzero padded rows"
        assert rel_err(y[:BATCH], want[name]) <= 1e-12, name


def test_shared_weight_reduction_over_several_launches(specs, monkeypatch):
    """The batch sum of shared-weight gradients, split over launches of one program each."""
    b = specs("small", True, "mul_ir")
    k = b.ops._kernels
    rows = 16
    (x1, x2, w, g), (a, c, d, e) = _padded(b, BATCH, rows, seed=2)
    whole = np.asarray(k.backward_w(a, c, e, block_batch=BB, interpret=True))
    monkeypatch.setattr(launch, "REDUCE_MIN_PROGRAMS", 1)
    monkeypatch.setattr(launch, "REDUCE_PARTIAL_ELEMS", 1)
    split = np.asarray(k.backward_w(a, c, e, block_batch=BB, interpret=True))
    np.testing.assert_allclose(split, whole, rtol=1e-13, atol=1e-13)
    gw = rt.user_weights(jnp.asarray(split), b.ir.weight_numel, True, BATCH)
    assert rel_err(gw, tensor_product_vjp_reference(b.ir, x1, x2, w, g)[2]) <= 1e-12


def test_vjp_input_errors_and_empty_batch(specs):
    b = specs("mixed", False, "mul_ir")
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 5))
    g = jnp.asarray(grad_out(b.ir, 5))
    with pytest.raises(ValueError, match="grad_out"):
        b.ops.tensor_product_vjp(x1, x2, w, g[:, 1:])
    with pytest.raises(TypeError, match="grad_out"):
        b.ops.tensor_product_vjp(x1, x2, w, g.astype(jnp.float32))
    with pytest.raises(ValueError, match="weights"):
        b.ops.tensor_product_vjp(x1, x2, w[0], g)
    x1, x2, w = (jnp.asarray(a) for a in inputs(b.ir, 0))
    gx1, gx2, gw = b.ops.tensor_product_vjp(x1, x2, w, jnp.zeros((0, b.ir.dim_out)))
    assert gx1.shape == x1.shape and gx2.shape == x2.shape and gw.shape == w.shape
    # the gradient of an empty batch through tensor_product is empty too
    gr = jax.grad(lambda a: jnp.sum(b.ops.tensor_product(a, x2, w)))(x1)
    assert gr.shape == x1.shape


# ---------------------------------------------------------------- GPU (device machine)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_specs_gradients_gpu(tmp_path_factory, path, record_property):
    """Every example spec on the GPU (Triton lowering), float32 and float64: the forward and
    the three backward kernels vs the float64 oracle (batch 1001: padded rows), and a
    Hessian-vector product (every kernel, and the weighted-only ones) vs dense einsums."""
    b = Built(path, tmp_path_factory.mktemp("gpugrads"))
    ir, batch = b.ir, 1001
    x1, x2, w = inputs(ir, batch)
    g = grad_out(ir, batch)
    want = (tensor_product_reference(ir, x1, x2, w),) + tensor_product_vjp_reference(ir, x1, x2, w, g)
    fwd = jax.jit(lambda a, c, d: b.ops.tensor_product(a, c, d, interpret=False))
    vjp = jax.jit(lambda a, c, d, e: b.ops.tensor_product_vjp(a, c, d, e, interpret=False))
    for dtype in ir.dtypes:
        args = [jnp.asarray(t, dtype) for t in (x1, x2, w, g)]
        got = (fwd(*args[:3]),) + tuple(vjp(*args))
        for name, a, c in zip(("out", "grad_x1", "grad_x2", "grad_weights"), got, want):
            err = rel_err(a, c)
            record_property(f"{name}_max_rel_err_{dtype}", err)
            print(f"{path.stem} {dtype} {name}: max relative error {err:.3e}")
            assert err <= TOL[dtype], name
    if "float64" in ir.dtypes:
        small = 257
        xs = [jnp.asarray(t[:small]) for t in (x1, x2)] + [jnp.asarray(w if ir.shared_weights else w[:small])]
        rng = np.random.default_rng(12)
        r = jnp.asarray(rng.normal(size=(small, ir.dim_out)))
        vs = [jnp.asarray(rng.normal(size=t.shape)) for t in xs]
        got = _second_order(lambda a, c, d: b.ops.tensor_product(a, c, d, interpret=False), xs, r, vs)
        with jax.default_matmul_precision("highest"):
            ref = _second_order(lambda a, c, d: jnp_tensor_product(ir, a, c, d), xs, r, vs)
        for order, gs, rs in ((1, got[0], ref[0]), (2, got[1], ref[1])):
            for name, a, c in zip(("x1", "x2", "weights"), gs, rs):
                err = rel_err(a, c)
                print(f"{path.stem} float64 order {order} d/d{name}: max relative error {err:.3e}")
                assert err <= 1e-9, (order, name)
