"""The fused graph convolution of the generated JAX/Pallas packages (``jax_ops.conv``).

``tests/test_conv.py`` compares both frameworks with the numpy oracle; this module adds
the JAX specifics: derivatives to second order (``check_grads``, also through specs with
unweighted paths and shared weights), ``jax.jit`` with traced indices, the padding
helper (same numbers, no recompilation), input errors, and GPU runs of the example
specs with ``conv = true`` (``-m gpu``, skipped without a GPU).

On the CPU the kernels run in interpret mode; XLA optimizations are turned off while
this module runs (compiles dominate) and the graphs are small.
"""

from __future__ import annotations

import contextlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from eqdsl.reference import (  # noqa: E402
    conv_reference, conv_vjp_reference, tensor_product_reference, tensor_product_vjp_reference)
from test_jax_ops import EXAMPLES, TOL, Built, build, gpu, rel_err, spec_text  # noqa: E402

# Every mode, weighted and unweighted paths (so the *_weighted kernels are exercised).
MIXED = dict(
    in1="3x0e+1x1o", in2="1x0e+2x1o", out="2x1o+1x1e+2x1o+1x1o",
    instructions=[(0, 1, 0, "uvw", True), (1, 1, 1, "uvu", False), (0, 1, 2, "uvv", True), (1, 0, 3, "uuu", False),
                  (1, 0, 2, "uvw", True)],
)
# Channelwise (every path uvu and weighted, one-channel x2 blocks, per-edge weights): the
# conv's backward is the fused one (rt.conv_backward_fused).
CHANNELWISE = dict(
    in1="2x0e+2x1o", in2="1x0e+1x1o", out="2x0e+2x1o+2x1o+2x0e",
    instructions=[(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 2, "uvu", True), (1, 1, 3, "uvu", True)],
)
# Fully connected (every path uvw and weighted, one-channel x2 blocks): the fused backward too,
# a loop over each x1 block's channels (3 output channels: masked lanes).
FULLY_CONNECTED = dict(in1="2x0e+2x1o", in2="1x0e+1x1o", out="3x0e+2x1o", mode="uvw")
# pallas_conv_max_terms = 1: the conv's own kernels, one per output group; with
# pallas_conv_fused_max_terms = 1 one fused backward kernel per path; pallas_fma = 1: the
# sums as rt.fma chains (interpret mode: a * b + c; the chains' terms and signs are tested);
# pallas_factor = 1: the sums factored first (pallas_factor), the fused backward in its q_j form
SPLIT = ("\n[tensor_product.tuning]\npallas_conv_max_terms = 1\npallas_conv_fused_max_terms = 1\npallas_fma = 1\n"
         "pallas_factor = 1\n")
# pallas_conv_max_terms_float64 = 1: a conv kernel family for float64 operands only, its fused
# backward split per path (pallas_conv_fused_max_terms_float64 = 1)
DTYPE_SPLIT = "\n[tensor_product.tuning]\npallas_conv_max_terms_float64 = 1\npallas_conv_fused_max_terms_float64 = 1\n"
BE = 4  # edges per program of the per-edge kernels in the CPU tests
SE = 2  # edges per loop step of the segment kernels where set: partly masked last steps


def conv_spec(name, *, reduce="sum", shared=False, layout="mul_ir", **irreps):
    irreps = irreps or MIXED
    text = spec_text(name, irreps["in1"], irreps["in2"], irreps["out"], instructions=irreps.get("instructions"),
                     mode=irreps.get("mode"), shared=shared, layout=layout)
    return text + f'conv = true\nreduce = "{reduce}"\n'


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("jaxconv")


@pytest.fixture(scope="module")
def pkgs(root):
    return {
        "mean": build(conv_spec("conv_mixed_mean", reduce="mean", layout="ir_mul"), root),
        "shared": build(conv_spec("conv_mixed_shared", shared=True), root),
        "channelwise": build(conv_spec("conv_channelwise_mean", reduce="mean", **CHANNELWISE), root),
        "mixed_split": build(conv_spec("conv_mixed_split", layout="ir_mul") + SPLIT, root),
        "channelwise_split": build(conv_spec("conv_channelwise_split", **CHANNELWISE) + SPLIT, root),
        "uvw": build(conv_spec("conv_uvw", layout="ir_mul", **FULLY_CONNECTED), root),
        "uvw_split": build(conv_spec("conv_uvw_split", **FULLY_CONNECTED) + SPLIT, root),
        # float64 conv calls split one output group per kernel, float32 ones run the plain product's
        "dtype_split": build(conv_spec("conv_dtype_split", **CHANNELWISE) + DTYPE_SPLIT, root),
    }


@pytest.mark.parametrize("kind", ["mixed_split", "channelwise_split"])
def test_conv_max_terms_gives_the_conv_kernels_of_its_own(pkgs, kind):
    """The conv's kernel sets are split further than the plain product's, one per output group."""
    b = pkgs[kind]
    k = b.ops._kernels
    assert "rt.fma(" in open(k.__file__).read()
    assert [len(k.CONV_FWD_KERNELS), len(k.FWD_KERNELS)] == [len(b.ir.out), 1]
    # the plain product's kernels (fma chains too) against the oracle
    rng = np.random.default_rng(5)
    x1, x2, w = (rng.standard_normal(s) for s in ((6, b.ir.dim_in1), (6, b.ir.dim_in2), (6, b.ir.weight_numel)))
    g = rng.standard_normal((6, b.ir.dim_out))
    out, pull = jax.vjp(lambda a, c, ww: b.ops.tensor_product(a, c, ww), x1, x2, w)
    assert rel_err(out, tensor_product_reference(b.ir, x1, x2, w)) <= 1e-12
    for got, want in zip(pull(jnp.asarray(g)), tensor_product_vjp_reference(b.ir, x1, x2, w, g)):
        assert rel_err(got, want) <= 1e-12
    # the kernels' column ranges tile the output row: each writes its own columns of one buffer
    firsts = [c for _, c, _ in k.CONV_FWD_KERNELS]
    assert firsts == [sum(w for _, _, w in k.CONV_FWD_KERNELS[:i]) for i in range(len(firsts))]
    assert sum(w for _, _, w in k.CONV_FWD_KERNELS) == k.IDIM_OUT
    if kind == "channelwise_split":
        # one path per fused kernel: each x1 block's two paths write partial dF/dx1 messages
        assert len(k.CONV_BWD_FUSED_KERNELS) == len(pkgs[kind].ir.paths) == 4
        assert [len(r) for r in k.CONV_FUSED_GX1_SEGMENTS] == [2, 2] and k.FUSED_GX1_SEGMENTS is None


def test_conv_kernel_family_per_dtype(pkgs, monkeypatch):
    """pallas_conv_max_terms_float64 and pallas_conv_fused_max_terms_float64: float64 calls
    launch the float64 family (one kernel per output group, its fused backward one per path,
    each x1 block's paths writing partial dF/dx1 messages), float32 calls the conv's unsplit
    family (its own: a mul_ir conv's kernels run on ir_mul rows); both dtypes agree with the
    oracle, forward and the three gradients."""
    from eqdsl.runtime.jax import launch

    b = pkgs["dtype_split"]
    k = b.ops._kernels
    assert len(k.CONV_FWD_KERNELS) == 1 and len(k.CONV_FLOAT64_FWD_KERNELS) == len(b.ir.out)
    assert len(k.CONV_FLOAT64_BWD_FUSED_KERNELS) == len(b.ir.paths) > len(b.ir.in1) > len(k.CONV_BWD_FUSED_KERNELS)
    assert [len(r) for r in k.CONV_FLOAT64_FUSED_GX1_SEGMENTS] == [2, 2] and k.CONV_FUSED_GX1_SEGMENTS is None
    launched = []
    for fn in ("launch_segments", "conv_backward_fused"):
        real = getattr(launch, fn)
        monkeypatch.setattr(launch, fn, lambda name, kernels, *a, _real=real, **kw: (
            launched.append({kk[0].__name__ for kk in kernels}), _real(name, kernels, *a, **kw))[1])
    rng = np.random.default_rng(11)
    n, e = 6, 19
    src, dst = graph(rng, n, e)
    s, d = jnp.asarray(src), jnp.asarray(dst)
    for dtype, tol, prefix in ((np.float64, 1e-12, "_conv_float64_"), (np.float32, 1e-5, "_conv_")):
        x, y, w = data(b.ir, rng, n, e, dtype)
        g = rng.standard_normal((n, b.ir.dim_out)).astype(dtype)
        launched.clear()
        out, pull = jax.vjp(lambda a, c, ww: b.ops.conv(a, c, ww, s, d, n, block_edges=BE, segment_edges=SE), x, y, w)
        got = pull(jnp.asarray(g))
        names = set().union(*launched)
        names -= {"_segment_rows"}
        assert names and all(nm.startswith(prefix) for nm in names), (dtype, names)
        assert dtype == np.float64 or not any(nm.startswith("_conv_float64_") for nm in names), names
        x, y, w, g = (np.asarray(a, np.float64) for a in (x, y, w, g))
        assert rel_err(out, conv_reference(b.ir, x, y, w, src, dst, n)) <= tol
        for name, gv, want in zip(("x", "y", "w"), got, conv_vjp_reference(b.ir, x, y, w, src, dst, n, g)):
            assert rel_err(gv, want) <= tol, (dtype, name)


@pytest.mark.parametrize("kind", ["mixed_split", "channelwise_split"])
def test_conv_kernel_set_as_one_launch_equals_the_series(pkgs, kind):
    """A conv kernel set of several kernels runs as one launch over a (node, kernel) grid
    (launch.SEGMENT_PARTS): the same sums in the same order as one launch per kernel, bitwise.
    The kernels of these mul_ir specs run on ir_mul rows (columns.ConvColumns)."""
    from eqdsl.runtime.jax import launch
    from eqdsl.runtime.jax.columns import ConvColumns
    from eqdsl.runtime.jax.graph import conv_graph

    b = pkgs[kind]
    k = b.ops._kernels
    assert len(k.CONV_FWD_KERNELS) > 1
    rng = np.random.default_rng(12)
    n, e = 7, 25
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    cg = conv_graph(jnp.asarray(src), jnp.asarray(dst), n, e, x.dtype)
    cols = ConvColumns(None, None, None)  # ir_mul rows already
    if b.ir.layout == "mul_ir":
        cols = ConvColumns.of(*([(blk.mul, blk.dim) for blk in bs] for bs in (b.ir.in1, b.ir.in2, b.ir.out)))
        assert cols.in1 is not None and cols.out is not None
    xk, yk = cols.to_kernels(jnp.asarray(x), jnp.asarray(y))
    runs = [launch.launch_segments(k.NAME, k.CONV_FWD_KERNELS, (xk, yk, jnp.asarray(w)),
                                   node_arg=0, shared_arg=None, perm=cg.perm_dst, rowptr=cg.rowptr_dst,
                                   gather=cg.gather_dst, num_nodes=n, out_width=k.IDIM_OUT, block_edges=SE,
                                   interpret=True, parts=parts) for parts in (True, False)]
    np.testing.assert_array_equal(np.asarray(runs[0]), np.asarray(runs[1]))
    assert rel_err(cols.from_kernels(runs[0]), conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12


def graph(rng, n, e):
    return rng.integers(0, n, e), rng.integers(0, n, e)


def data(ir, rng, n, e, dtype=np.float64):
    x = rng.standard_normal((n, ir.dim_in1)).astype(dtype)
    y = rng.standard_normal((e, ir.dim_in2)).astype(dtype)
    w = rng.standard_normal((ir.weight_numel,) if ir.shared_weights else (e, ir.weight_numel)).astype(dtype)
    return x, y, w


@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations while active (``jax.monitoring`` events)."""
    from jax._src import monitoring

    box = [0]

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            box[0] += 1

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield box
    finally:
        monitoring.unregister_event_duration_listener(listener)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("kind", ["mean", "shared", "channelwise"])
def test_conv_check_grads_order2(pkgs, kind):
    """Reverse mode to second order through all four conv kernels (and the weighted-only ones)."""
    b = pkgs[kind]
    rng = np.random.default_rng(0)
    n, e = 5, 11
    src, dst = graph(rng, n, e)
    src[0] = dst[0]  # a self-loop
    x, y, w = data(b.ir, rng, n, e)
    s, d = jnp.asarray(src), jnp.asarray(dst)

    def f(a, c, ww):
        return b.ops.conv(a, c, ww, s, d, n, block_edges=BE, segment_edges=SE)

    check_grads(f, (jnp.asarray(x), jnp.asarray(y), jnp.asarray(w)), order=2, modes=["rev"], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["mean", "mixed_split"])
def test_conv_vjp_matches_reference_mixed(pkgs, kind):
    b = pkgs[kind]
    rng = np.random.default_rng(1)
    n, e = 7, 23
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    g = rng.standard_normal((n, b.ir.dim_out))
    s, d = jnp.asarray(src), jnp.asarray(dst)
    out, pull = jax.vjp(lambda a, c, ww: b.ops.conv(a, c, ww, s, d, n, block_edges=BE, segment_edges=SE), x, y, w)
    assert rel_err(out, conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12
    for got, want in zip(pull(jnp.asarray(g)), conv_vjp_reference(b.ir, x, y, w, src, dst, n, g)):
        assert rel_err(got, want) <= 1e-12


@pytest.mark.parametrize("kind,segment_edges", [("channelwise", 1), ("channelwise", 2), ("channelwise_split", 2),
                                                ("uvw", 2), ("uvw_split", 1)])
def test_conv_fused_backward_matches_reference(pkgs, kind, segment_edges):
    """The channelwise (and fully connected) conv's VJP is the fused backward (per-edge dF/dx
    messages summed into their src nodes) and equals the reference, isolated nodes and a
    self-loop included; split, one path per kernel (partial dF/dx messages)."""
    b = pkgs[kind]
    assert b.ops.CONV_OPS.bwd is not None
    if kind.endswith("split"):
        assert len(b.ops._kernels.CONV_BWD_FUSED_KERNELS) == len(b.ir.paths)
    rng = np.random.default_rng(3)
    n, e = 9, 29
    src, dst = graph(rng, n, e)
    src[:3] = [8, 8, 2]  # node 8 is only a source; a self-loop at 2
    dst[:3] = [0, 1, 2]
    src[src == 7], dst[dst == 7] = 6, 6  # node 7 has no edges
    x, y, w = data(b.ir, rng, n, e)
    g = rng.standard_normal((n, b.ir.dim_out))
    s, d = jnp.asarray(src), jnp.asarray(dst)
    out, pull = jax.vjp(lambda a, c, ww: b.ops.conv(a, c, ww, s, d, n, block_edges=BE, segment_edges=segment_edges),
                        x, y, w)
    assert rel_err(out, conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12
    got = pull(jnp.asarray(g))
    for name, gv, want in zip(("x", "y", "w"), got, conv_vjp_reference(b.ir, x, y, w, src, dst, n, g)):
        assert rel_err(gv, want) <= 1e-12, name
    assert np.all(np.asarray(got[0])[7] == 0)


# ---------------------------------------------------------------- jit, traced indices


def test_conv_jit_traced_indices_drop_out_of_range_edges(pkgs):
    b = pkgs["shared"]
    rng = np.random.default_rng(2)
    n, e = 6, 20
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    f = jax.jit(lambda a, c, ww, s, d: b.ops.conv(a, c, ww, s, d, n, block_edges=BE))
    got = f(x, y, w, src, dst)
    eager = b.ops.conv(x, y, w, src, dst, n, block_edges=BE)
    assert np.array_equal(np.asarray(got), np.asarray(eager))
    assert rel_err(got, conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12
    # traced indices cannot be checked: out-of-range edges are dropped, nothing out of bounds
    bad_src, bad_dst = src.copy(), dst.copy()
    bad_src[[1, 4]] = [n, -3]
    bad_dst[[7]] = [n + 100]
    keep = np.ones(e, bool)
    keep[[1, 4, 7]] = False
    got = f(x, y, w, bad_src, bad_dst)
    want = conv_reference(b.ir, x, y[keep], w, src[keep], dst[keep], n)
    assert np.all(np.isfinite(np.asarray(got)))
    assert rel_err(got, want) <= 1e-12


def test_conv_float32_bitwise_reproducible_under_jit(pkgs):
    b = pkgs["mean"]
    rng = np.random.default_rng(3)
    n, e = 4, 40
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e, np.float32)
    f = jax.jit(lambda a, c, ww: b.ops.conv(a, c, ww, src, dst, n))
    runs = [np.asarray(f(x, y, w)) for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert rel_err(runs[0], conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-5


# ---------------------------------------------------------------- padding, compilations


def test_pad_graph_same_results_and_no_recompiles(pkgs):
    b = pkgs["mean"]
    rng = np.random.default_rng(4)

    def energy(x, y, w, s, d, n, node_mask):
        out = b.ops.conv(x, y, w, s, d, n)
        return jnp.sum((out * node_mask[:, None]) ** 2)

    step = jax.jit(jax.value_and_grad(energy, argnums=(1, 2)), static_argnums=5)
    sizes = [(9, 30), (12, 41), (10, 57), (14, 33)]  # one node bucket (16), one edge bucket (64)
    results = []
    with count_compiles() as compiles:
        for k, (n, e) in enumerate(sizes):
            src, dst = graph(rng, n, e)
            x, y, w = data(b.ir, rng, n, e)
            p = b.ops.pad_graph(x, y, w, src, dst, n)
            assert (p.num_nodes, p.edge_attr.shape[0]) == (16, 64)
            val, (gy, gw) = step(p.node_features, p.edge_attr, p.weights, p.src, p.dst, p.num_nodes, p.node_mask)
            results.append((n, e, src, dst, x, y, w, val, gy, gw))
            if k == 0:
                first = compiles[0]
        assert compiles[0] == first, "padded graphs of one bucket recompiled"
    for n, e, src, dst, x, y, w, val, gy, gw in results:
        out = conv_reference(b.ir, x, y, w, src, dst, n)
        assert abs(float(val) - np.sum(out**2)) <= 1e-10 * np.sum(out**2)
        _, gy_ref, gw_ref = conv_vjp_reference(b.ir, x, y, w, src, dst, n, 2 * out)
        assert rel_err(gy[:e], gy_ref) <= 1e-12
        assert rel_err(gw[:e], gw_ref) <= 1e-12
        assert not np.any(np.asarray(gy[e:]))  # padded edges carry zero cotangent: dummy node masked


def test_pad_graph_shared_weights_not_padded(pkgs):
    b = pkgs["shared"]
    rng = np.random.default_rng(5)
    n, e = 5, 9
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    p = b.ops.pad_graph(x, y, w, src, dst, n)
    assert p.weights.shape == w.shape
    got = b.ops.conv(p.node_features, p.edge_attr, p.weights, p.src, p.dst, p.num_nodes)[: p.num_real_nodes]
    assert rel_err(got, conv_reference(b.ir, x, y, w, src, dst, n)) <= 1e-12


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("bad, exc, word", [
    ("src_out_of_range", ValueError, "src"),
    ("dst_negative", ValueError, "dst"),
    ("num_nodes_mismatch", ValueError, "num_nodes"),
    ("num_nodes_float", TypeError, "num_nodes"),
    ("float_index", TypeError, "src"),
    ("index_2d", ValueError, "dst"),
    ("edge_attr_rows", ValueError, "src"),
    ("edge_attr_dim", ValueError, "edge_attr"),
    ("node_features_dim", ValueError, "node_features"),
    ("weights_shape", ValueError, "weights"),
    ("dtype_int", TypeError, "node_features"),
    ("dtype_mixed", TypeError, "dtype"),
])
def test_conv_errors(pkgs, bad, exc, word):
    b = pkgs["mean"]
    rng = np.random.default_rng(6)
    n, e = 5, 12
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    args = dict(node_features=x, edge_attr=y, weights=w, src=src, dst=dst, num_nodes=n)
    if bad == "src_out_of_range":
        args["src"] = np.where(np.arange(e) == 3, n, src)
    elif bad == "dst_negative":
        args["dst"] = np.where(np.arange(e) == 0, -1, dst)
    elif bad == "num_nodes_mismatch":
        args["num_nodes"] = n - 1
    elif bad == "num_nodes_float":
        args["num_nodes"] = float(n)
    elif bad == "float_index":
        args["src"] = src.astype(np.float64)
    elif bad == "index_2d":
        args["dst"] = dst.reshape(3, 4)
    elif bad == "edge_attr_rows":
        args["edge_attr"] = y[:-1]
    elif bad == "edge_attr_dim":
        args["edge_attr"] = y[:, :-1]
    elif bad == "node_features_dim":
        args["node_features"] = x[:, :-1]
    elif bad == "weights_shape":
        args["weights"] = w[:, :-1]
    elif bad == "dtype_int":
        args["node_features"] = x.astype(np.int32)
    elif bad == "dtype_mixed":
        args["edge_attr"] = y.astype(np.float32)
    with pytest.raises(exc, match=word):
        b.ops.conv(**args)


def test_conv_check_false_skips_value_check_and_drops_bad_edges(pkgs):
    b = pkgs["mean"]
    rng = np.random.default_rng(7)
    n, e = 5, 12
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    bad = src.copy()
    bad[2] = 99
    got = b.ops.conv(x, y, w, bad, dst, n, check=False, block_edges=BE)
    keep = np.arange(e) != 2
    assert rel_err(got, conv_reference(b.ir, x, y[keep], w[keep], src[keep], dst[keep], n)) <= 1e-12


def test_conv_empty_graph_and_no_nodes(pkgs):
    b = pkgs["shared"]
    rng = np.random.default_rng(8)
    x, y, w = data(b.ir, rng, 3, 0)
    z = np.zeros(0, np.int64)
    assert not np.any(np.asarray(b.ops.conv(x, y, w, z, z, 3)))
    x0 = np.zeros((0, b.ir.dim_in1))
    assert b.ops.conv(x0, y, w, z, z, 0).shape == (0, b.ir.dim_out)


# ---------------------------------------------------------------- GPU (device machine)

CONV_EXAMPLES = [p for p in EXAMPLES if p.stem in ("mace_large", "nequip_water", "nequip_toluene")]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", CONV_EXAMPLES, ids=[p.stem for p in CONV_EXAMPLES])
def test_example_conv_specs_gpu(root, path, record_property):
    """conv and its VJP on the GPU (Triton lowering) vs the float64 oracle, ~4000 edges."""
    b = Built(path, root)
    assert b.ir.conv
    rng = np.random.default_rng(9)
    n, e = 256, 4000
    src, dst = graph(rng, n, e)
    x, y, w = data(b.ir, rng, n, e)
    g = rng.standard_normal((n, b.ir.dim_out))
    want = conv_reference(b.ir, x, y, w, src, dst, n)
    want_vjp = conv_vjp_reference(b.ir, x, y, w, src, dst, n, g)
    s, d = jnp.asarray(src), jnp.asarray(dst)
    for dtype in b.ir.dtypes:
        cast = [jnp.asarray(a, dtype) for a in (x, y, w)]
        f = jax.jit(lambda a, c, ww: b.ops.conv(a, c, ww, s, d, n, interpret=False))
        with jax.default_matmul_precision("highest"):
            out, pull = jax.vjp(f, *cast)
            grads = pull(jnp.asarray(g, dtype))
        errs = [rel_err(out, want)] + [rel_err(a, r) for a, r in zip(grads, want_vjp)]
        record_property(f"max_rel_err_{dtype}", max(errs))
        print(f"{path.stem} {dtype}: max relative errors out/gx/gy/gw {errs}")
        tol = TOL[dtype] * (10 if dtype == "float32" else 1)  # ~30 edges summed per node
        assert max(errs) <= tol
