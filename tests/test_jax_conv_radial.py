"""``jax_ops.conv_radial``: the conv given the radial MLP's last layer (spec key ``radial_features``).

``conv_radial(x, y, rf, wr, src, dst, n)`` must be ``conv(x, y, rf @ wr, src, dst, n)`` as a
function: forward and gradients with respect to all four arrays (to second order) against
the unfused composition and the numpy oracle (``eqdsl.reference``), both layouts, ``reduce =
"mean"``, the channelwise spec's fused backward and the three-kernel one, the weights
formed on chip with a dot (blocks of 16 edges, 16-channel paths, H = 13 padded to 16) and with
the multiply-add loop (smaller tiles); the argument errors; and the real Pallas -> Triton
lowering of the radial kernels (``lowering_platforms=("cuda",)``, no GPU needed).

Packages are generated with ``test_jax_ops.build`` (``tests/genutil.py``'s generation, falling
back to the metadata and Pallas files alone if the torch backend fails to render, so that
this module tests the JAX side on its own). On the CPU the kernels run in interpret mode;
XLA optimizations are off while this module runs (compiles dominate), graphs are tiny.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from eqdsl.reference import SUBSCRIPTS, conv_reference, conv_vjp_reference, dense_cg  # noqa: E402
from test_jax_ops import TOL, build, rel_err, spec_text  # noqa: E402

# Channelwise (every path uvu, one-channel x2 blocks): the backward is the fused one. H = 3
# and 3- or 2-channel tiles: every weight tile by the multiply-add loop, padded lanes masked.
CHANNELWISE = dict(in1="3x0e+2x1o", in2="1x0e+1x1o", out="3x0e+3x1o+2x1o+2x0e",
                   instructions=[(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 2, "uvu", True),
                                 (1, 1, 3, "uvu", True)])
# Fully connected (every path uvw, one-channel x2 blocks): the fused backward too, each weight
# row formed on chip in the loop over the x1 channel.
FULLY_CONNECTED = dict(in1="3x0e+2x1o", in2="1x0e+1x1o", out="3x0e+2x1o",
                       instructions=[(0, 0, 0, "uvw", True), (0, 1, 1, "uvw", True), (1, 0, 1, "uvw", True),
                                     (1, 1, 0, "uvw", True)])
# uvu (one and 16 x2 channels: strided weight vectors), uvw and uvv, no fused backward;
# every weight tile 16 lanes, so with H = 13 (16 padded) and blocks of 16 edges each one is
# a dot (rows of H and lanes past count zeroed).
MIXED = dict(in1="16x0e+2x1o", in2="1x0e+16x1o", out="16x0e+16x1o+16x1e+16x1o",
             instructions=[(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 1, 2, "uvw", True),
                           (0, 1, 3, "uvv", True)])
DOT = 16  # edges per program and per segment step for the dot path


def radial_spec(name, irreps, *, h, reduce="sum", layout="mul_ir"):
    text = spec_text(name, irreps["in1"], irreps["in2"], irreps["out"], instructions=irreps["instructions"],
                     layout=layout)
    return text + f'conv = true\nreduce = "{reduce}"\nradial_features = {h}\n'


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jaxradial")
    return {
        "channelwise": build(radial_spec("radial_cw", CHANNELWISE, h=3), root),
        "uvw": build(radial_spec("radial_uvw", FULLY_CONNECTED, h=3, layout="ir_mul"), root),
        "mixed": build(radial_spec("radial_mixed", MIXED, h=13, reduce="mean", layout="ir_mul"), root),
        # pallas_radial_materialize: no radial kernels, conv_radial = matmul + the conv's kernels
        "materialize": build(radial_spec("radial_mat", CHANNELWISE, h=3, reduce="mean")
                             + "[tensor_product.tuning]\npallas_radial_materialize = 1\n", root),
    }


def data(ir, rng, n, e, dtype=np.float64):
    h = ir.radial_features
    x = rng.standard_normal((n, ir.dim_in1)).astype(dtype)
    y = rng.standard_normal((e, ir.dim_in2)).astype(dtype)
    rf = rng.standard_normal((e, h)).astype(dtype)
    wr = (rng.standard_normal((h, ir.weight_numel)) / np.sqrt(h)).astype(dtype)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if e >= 2:
        src[:2] = [n - 1, 1]  # node n-1 a source only (below), a self-loop at 1
        dst[:2] = [0, 1]
        dst[dst == n - 1] = 0
    return x, y, rf, wr, src, dst


def unfused(b, x, y, rf, wr, src, dst, n, **kw):
    """The composition conv_radial must equal: materialized weights, then the conv."""
    return b.ops.conv(x, y, jnp.matmul(rf, wr, precision=lax.Precision.HIGHEST), src, dst, n, **kw)


def jnp_conv(ir, x, y, w, src, dst, n):
    """``eqdsl.reference.conv_reference`` in jnp (the same dense einsums), so that JAX's own
    autodiff gives exact derivatives of every order to compare with."""
    def view(a, b):
        seg = a[:, b.offset:b.offset + b.size]
        return seg.reshape(-1, b.mul, b.dim) if b.stride_comp == 1 else seg.reshape(-1, b.dim, b.mul).transpose(0, 2, 1)

    xs = x[src]
    blocks = [jnp.zeros((y.shape[0], b.mul, b.dim), x.dtype) for b in ir.out]
    for p in ir.paths:
        b1, b2, bo = ir.in1[p.i_in1], ir.in2[p.i_in2], ir.out[p.i_out]
        sw, s1, s2, so = SUBSCRIPTS[p.mode]
        pw = w[:, p.weight_offset:p.weight_offset + p.weight_numel].reshape(-1, *p.path_shape)
        c = dense_cg(p, b1.dim, b2.dim, bo.dim)
        blocks[p.i_out] = blocks[p.i_out] + jnp.einsum(f"{sw},ijk,{s1},{s2}->{so}", pw, c, view(xs, b1), view(y, b2),
                                                       precision=lax.Precision.HIGHEST)
    msgs = jnp.concatenate([(v if b.stride_comp == 1 else v.transpose(0, 2, 1)).reshape(-1, b.size)
                            for b, v in zip(ir.out, blocks)], axis=1)
    out = jax.ops.segment_sum(msgs, jnp.asarray(dst), n)
    if ir.reduce == "mean":
        out = out / jnp.maximum(jnp.bincount(jnp.asarray(dst), length=n), 1)[:, None]
    return out


def test_generated_radial_kernels(pkgs):
    """The radial kernels take rf and wr in place of the weights and form them on chip."""
    b = pkgs["mixed"]
    k = b.ops._kernels
    assert b.ops.RADIAL_FEATURES == k.RADIAL_FEATURES == 13
    text = open(k.__file__).read()
    assert "def _radial_fwd_kernel_0(x1_ref, x2_ref, rf_ref, wr_ref, out_ref):" in text
    assert "rt.radial_vec(rf, wr_ref, 0, count=16, pad=16)" in text  # the 16-channel uvu path
    assert sum(w for _, _, w in k.RADIAL_FWD_KERNELS) == k.IDIM_OUT
    assert not hasattr(k, "RADIAL_BWD_FUSED_KERNELS") and b.ops.RADIAL_OPS.bwd is None
    c = pkgs["channelwise"].ops
    assert c.RADIAL_OPS.bwd is not None and "def _radial_bwd_fused_kernel_0(x1_ref, x2_ref, rf_ref, wr_ref, g_ref," \
        in open(c._kernels.__file__).read()


BLOCKS = {"channelwise": dict(block_edges=4, segment_edges=2), "uvw": dict(block_edges=4, segment_edges=2), "mixed": dict(block_edges=DOT, segment_edges=DOT),
          "materialize": dict(block_edges=4, segment_edges=2)}


def test_materialized_package_has_no_radial_kernels(pkgs, tmp_path):
    """``pallas_radial_materialize = 1``: no radial kernels are generated, RADIAL_OPS is None,
    and ``conv_radial`` still takes (and checks) the radial features and matrix; another value
    is refused with one line."""
    from eqdsl.backends import check_tuning
    from eqdsl.errors import SpecError
    from eqdsl.spec import load_spec

    (tmp_path / "bad.toml").write_text(radial_spec("radial_bad", CHANNELWISE, h=3)
                                       + "[tensor_product.tuning]\npallas_radial_materialize = 2\n")
    with pytest.raises(SpecError, match="pallas_radial_materialize") as e:
        check_tuning(load_spec(tmp_path / "bad.toml")[0])
    assert "\n" not in str(e.value)
    b = pkgs["materialize"]
    k = b.ops._kernels
    text = open(k.__file__).read()
    assert "def _radial_" not in text and not hasattr(k, "RADIAL_FWD_KERNELS")
    assert k.RADIAL_FEATURES == b.ops.RADIAL_FEATURES == 3 and b.ops.RADIAL_OPS is None
    rng = np.random.default_rng(6)
    x, y, rf, wr, src, dst = data(b.ir, rng, 4, 9)
    with pytest.raises(ValueError, match="radial_weight"):
        b.ops.conv_radial(x, y, rf, wr[:, :-1], src, dst, 4)


@pytest.mark.parametrize("kind", ["channelwise", "uvw", "mixed", "materialize"])
def test_forward_and_vjp_match_composition_and_reference(pkgs, kind):
    b, blocks = pkgs[kind], BLOCKS[kind]
    assert (b.ops.RADIAL_OPS is not None and b.ops.RADIAL_OPS.bwd is not None) == (kind in ("channelwise", "uvw"))
    rng = np.random.default_rng(1)
    n, e = 7, 37
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)
    g = rng.standard_normal((n, b.ir.dim_out))
    out, pull = jax.vjp(lambda *a: b.ops.conv_radial(*a, src, dst, n, **blocks), x, y, rf, wr)
    w = rf @ wr
    assert rel_err(out, conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12
    assert rel_err(out, unfused(b, x, y, rf, wr, src, dst, n)) <= 1e-12
    gx, gy, grf, gwr = pull(jnp.asarray(g))
    rx, ry, rw = conv_vjp_reference(b.ir, x, y, w, src, dst, n, g)
    for name, got, want in (("x", gx, rx), ("y", gy, ry), ("rf", grf, rw @ wr.T), ("wr", gwr, rf.T @ rw)):
        assert rel_err(got, want) <= 1e-12, name
    assert not np.any(np.asarray(out)[n - 1])  # no in-edges
    if kind in ("channelwise", "uvw"):
        return
    # float32: the weights formed by dots in full float32 precision (no TF32), same function
    args32 = [a.astype(np.float32) for a in (x, y, rf, wr)]
    out32 = b.ops.conv_radial(*args32, src, dst, n, **blocks)
    assert out32.dtype == jnp.float32
    assert rel_err(out32, conv_reference(b.ir, x, y, w, src, dst, n)) <= TOL["float32"]


@pytest.mark.parametrize("kind", ["channelwise", "materialize"])
def test_check_grads_order2_all_four_inputs(pkgs, kind):
    """Reverse mode to second order w.r.t. node features, edge attributes, radial features
    and radial weight (float64): the radial kernels, the fused backward and its VJP, the
    conv's bwd_w and its VJP (materialize: the conv's VJP through the matmul)."""
    b, blocks = pkgs[kind], BLOCKS[kind]
    rng = np.random.default_rng(0)
    n, e = 5, 11
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)

    def f(*a):
        return b.ops.conv_radial(*a, src, dst, n, **blocks)

    check_grads(f, tuple(jnp.asarray(a) for a in (x, y, rf, wr)), order=2, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_second_derivatives_match_jnp_oracle(pkgs):
    """The gradient w.r.t. all four arrays of a loss on d energy / d (x, y) (forces, as in
    force training), against JAX's autodiff of the jnp oracle with ``W = rf @ wr``: through
    the VJP rules of the three radial backward kernels (the fused backward's second order is
    ``test_check_grads_order2_all_four_inputs``'s)."""
    b, blocks = pkgs["mixed"], BLOCKS["mixed"]
    rng = np.random.default_rng(2)
    n, e = 6, 19
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)

    def loss(conv, *a):
        energy = lambda x, y: jnp.sum(conv(x, y, *a[2:]) ** 2)  # noqa: E731
        gx, gy = jax.grad(energy, argnums=(0, 1))(*a[:2])
        return jnp.sum(gx ** 2) + jnp.sum(jnp.sin(gy))

    def radial(x, y, r, w):
        return b.ops.conv_radial(x, y, r, w, src, dst, n, **blocks)

    def oracle(x, y, r, w):
        return jnp_conv(b.ir, x, y, jnp.matmul(r, w, precision=lax.Precision.HIGHEST), src, dst, n)

    args = tuple(jnp.asarray(a) for a in (x, y, rf, wr))
    assert rel_err(oracle(*args), conv_reference(b.ir, x, y, rf @ wr, src, dst, n)) <= 1e-12
    got = jax.jit(jax.grad(lambda *a: loss(radial, *a), argnums=(0, 1, 2, 3)))(*args)
    want = jax.grad(lambda *a: loss(oracle, *a), argnums=(0, 1, 2, 3))(*args)
    for name, a, c in zip(("x", "y", "rf", "wr"), got, want):
        assert rel_err(a, c) <= 1e-12, name


def test_jit_traced_indices_and_pad_graph(pkgs):
    b = pkgs["channelwise"]
    rng = np.random.default_rng(3)
    n, e = 6, 20
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)
    want = conv_reference(b.ir, x, y, rf @ wr, src, dst, n)
    got = jax.jit(lambda *a: b.ops.conv_radial(*a, n))(x, y, rf, wr, src, dst)
    assert rel_err(got, want) <= 1e-12
    p = b.ops.pad_graph(x, y, rf, src, dst, n)  # radial features padded like per-edge weights
    out = b.ops.conv_radial(p.node_features, p.edge_attr, p.weights, wr, p.src, p.dst, p.num_nodes)
    assert rel_err(out[:n], want) <= 1e-12


@pytest.mark.parametrize("bad, exc, word", [
    ("rf_rows", ValueError, "radial_features"),
    ("rf_features", ValueError, "radial_features"),
    ("wr_shape", ValueError, "radial_weight"),
    ("wr_1d", ValueError, "radial_weight"),
    ("rf_dtype", TypeError, "dtype"),
    ("wr_int", TypeError, "radial_weight"),
    ("rf_list", TypeError, "radial_features"),
    ("src_out_of_range", ValueError, "src"),
    ("num_nodes_mismatch", ValueError, "num_nodes"),
    ("edge_attr_dim", ValueError, "edge_attr"),
    ("block_edges", ValueError, "block_batch"),
])
def test_errors(pkgs, bad, exc, word):
    b = pkgs["channelwise"]
    rng = np.random.default_rng(4)
    n, e = 5, 12
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)
    args = dict(node_features=x, edge_attr=y, radial_features=rf, radial_weight=wr, src=src, dst=dst, num_nodes=n)
    kw = {}
    if bad == "rf_rows":
        args["radial_features"] = rf[:-1]
    elif bad == "rf_features":
        args["radial_features"] = rf[:, :-1]
    elif bad == "wr_shape":
        args["radial_weight"] = wr[:, :-1]
    elif bad == "wr_1d":
        args["radial_weight"] = wr.reshape(-1)
    elif bad == "rf_dtype":
        args["radial_features"] = rf.astype(np.float32)
    elif bad == "wr_int":
        args["radial_weight"] = wr.astype(np.int32)
    elif bad == "rf_list":
        args["radial_features"] = rf.tolist()
    elif bad == "src_out_of_range":
        args["src"] = np.where(np.arange(e) == 3, n, src)
    elif bad == "num_nodes_mismatch":
        args["num_nodes"] = n + 1
    elif bad == "edge_attr_dim":
        args["edge_attr"] = y[:, :-1]
    elif bad == "block_edges":
        kw["block_edges"] = 3
    with pytest.raises(exc, match=word):
        b.ops.conv_radial(**args, **kw)


def test_empty_graph_and_no_nodes(pkgs):
    b = pkgs["channelwise"]
    rng = np.random.default_rng(5)
    x, y, rf, wr, _, _ = data(b.ir, rng, 3, 0)
    z = np.zeros(0, np.int64)
    assert not np.any(np.asarray(b.ops.conv_radial(x, y, rf, wr, z, z, 3)))
    assert b.ops.conv_radial(np.zeros((0, b.ir.dim_in1)), y, rf, wr, z, z, 0).shape == (0, b.ir.dim_out)


@pytest.mark.parametrize("kind,dtype", [("mixed", "float32"), ("mixed", "float64"), ("channelwise", "float32"),
                                        ("uvw", "float32")])
def test_radial_kernels_lower_for_cuda(pkgs, kind, dtype):
    """Energy and its gradients w.r.t. all four arrays through the Pallas -> Triton lowering:
    dot tiles (mixed, blocks of 16; float64's dot needs M, K >= 16, N >= 8) and multiply-add
    tiles with the fused backward (channelwise, fully connected)."""
    b, blocks = pkgs[kind], BLOCKS[kind]
    ops = b.ops
    n, e, h = 16, 64, b.ir.radial_features
    S = jax.ShapeDtypeStruct
    shapes = (S((n, ops.DIM_IN1), dtype), S((e, ops.DIM_IN2), dtype), S((e, h), dtype),
              S((h, ops.WEIGHT_NUMEL), dtype), S((e,), jnp.int32), S((e,), jnp.int32))

    def grads(x, y, rf, wr, s, d):
        energy = lambda *a: jnp.sum(ops.conv_radial(*a, s, d, n, interpret=False, **blocks) ** 2)  # noqa: E731
        return jax.grad(energy, argnums=(0, 1, 2, 3))(x, y, rf, wr)

    text = jax.jit(grads).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    backward = ["_radial_bwd_fused_kernel"] if kind in ("channelwise", "uvw") else [
        "_radial_bwd_x1_kernel", "_radial_bwd_x2_kernel", "bwd_w_kernel"]
    for name in ["_radial_fwd_kernel"] + backward:
        assert name in text, name


def test_radial_shared_memory_estimate_and_dot_key(pkgs, tmp_path):
    """Each radial kernel names its dot columns (the shared-memory estimate): a kernel over
    the budget forms its tiles with multiply-adds instead of asking for more than the device
    has; ``pallas_radial_dot`` is validated, printed, and on the CPU keeps IEEE float32."""
    from eqdsl.backends import check_tuning
    from eqdsl.errors import SpecError
    from eqdsl.runtime.jax import tiles
    from eqdsl.spec import load_spec

    text = open(pkgs["mixed"].ops._kernels.__file__).read()
    assert "rt.radial_rows(rf_ref, count=13, pad=16, cols=" in text and "dot=1" not in text
    # mace_large's first forward kernel at 16 edges, float32: the request Triton refused on the H100
    assert tiles.radial_smem_bytes(16, 64, 1152, 4) == 311296 > tiles.SMEM_BUDGET
    rf = jnp.ones((DOT, 64), jnp.float32)
    assert tiles.radial_rows(rf, count=64, pad=64, cols=1152).tile is None  # over budget: multiply-adds
    fits = tiles.radial_rows(rf, count=64, pad=64, cols=512, dot=1)
    assert fits.tile is not None and fits.precision == lax.Precision.HIGHEST  # CPU: no TF32x3 dot
    assert tiles.radial_rows(rf.astype(jnp.float64), count=64, pad=64, cols=512).tile is None  # 8-byte: over
    spec = radial_spec("radial_dot", MIXED, h=13) + "[tensor_product.tuning]\npallas_radial_dot = 1\n"
    (tmp_path / "ok.toml").write_text(spec)
    check_tuning(load_spec(tmp_path / "ok.toml")[0])
    from eqdsl.backends.pallas.assemble import render_files
    from eqdsl.lower import lower

    s = load_spec(tmp_path / "ok.toml")[0]
    assert "dot=1)" in render_files(lower(s), "#", s.tuning)["pallas_kernels.py"]
    (tmp_path / "bad.toml").write_text(spec.replace("pallas_radial_dot = 1", "pallas_radial_dot = 2"))
    with pytest.raises(SpecError, match="pallas_radial_dot") as e:
        check_tuning(load_spec(tmp_path / "bad.toml")[0])
    assert "\n" not in str(e.value)


def test_radial_kernels_split_by_columns(tmp_path, monkeypatch):
    """A radial kernel whose dots would hold more columns of radial_weight than the
    shared-memory budget allows is split over more kernels (same function)."""
    from eqdsl.backends.pallas import plan
    from eqdsl.runtime.jax import tiles

    assert plan.RADIAL_SMEM_BUDGET == tiles.SMEM_BUDGET
    assert plan.radial_max_cols(64) == 844 and tiles.radial_smem_bytes(16, 64, 844, 4) <= tiles.SMEM_BUDGET
    # budget for 16 dot columns at H = 13 (16 padded): one 16-lane weight tile per kernel
    monkeypatch.setattr(plan, "RADIAL_SMEM_BUDGET", 4 * 16 * (16 + 4 * 16))
    b = build(radial_spec("radial_split", MIXED, h=13), tmp_path)
    k = b.ops._kernels
    assert len(k.RADIAL_FWD_KERNELS) > len(k.FWD_KERNELS) and sum(w for _, _, w in k.RADIAL_FWD_KERNELS) == k.IDIM_OUT
    rng = np.random.default_rng(3)
    n, e = 5, 32
    x, y, rf, wr, src, dst = data(b.ir, rng, n, e)
    out = b.ops.conv_radial(x, y, rf, wr, src, dst, n, block_edges=DOT, segment_edges=DOT)
    assert rel_err(out, conv_reference(b.ir, x, y, rf @ wr, src, dst, n)) <= 1e-12
