"""The fused graph convolution in PyTorch (``<pkg>.torch_conv``): gradients of every
order, no recompilation for new graph sizes, bitwise reproducibility of the
deterministic variant, input errors; on a GPU, the example specs on ~4000 edges.

The CPU runs go through Triton's interpreter (slow): tiny graphs only.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from eqdsl.lower import lower  # noqa: E402
from eqdsl.reference import conv_reference, conv_vjp_reference  # noqa: E402
from eqdsl.spec import load_spec, parse_spec  # noqa: E402
from genutil import build_package  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "specs"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# every mode, unweighted paths (F affine in W: the *_lin ops), a uvw reduction loop
SPEC = """
[[tensor_product]]
name = "{name}"
irreps_in1 = "2x0e+1x1o"
irreps_in2 = "3x0e+1x1o"
irreps_out = "1x0e+1x1o+1x1o+1x1e"
instructions = [
  [0, 0, 0, "uvw", true],
  [1, 1, 0, "uvw", true],
  [0, 1, 1, "uvv", true],
  [1, 0, 1, "uvw", true, 0.5],
  [1, 0, 2, "uvu", false],
  [0, 1, 2, "uvv", false],
  [1, 1, 3, "uuu", true],
]
shared_weights = {shared}
layout = "{layout}"
dtypes = ["float32", "float64"]
conv = true
reduce = "{reduce}"
deterministic = {det}
{tuning}"""
# the forward's scatter as a segment reduction (on graphs of at least one edge; fewer than
# segment_min_edges: atomics), the backward's node gradient by atomics
SEGMENT_FWD = "[tensor_product.tuning.conv_fwd]\nsegment = 1\nsegment_min_edges = 1\n"
VARIANTS = {
    # name: (layout, reduce, deterministic, shared, tuning)
    "tc_atomic": ("ir_mul", "sum", "false", "false", ""),
    "tc_det_shared": ("mul_ir", "mean", "true", "true", ""),
    "tc_segment_fwd": ("mul_ir", "mean", "false", "false", SEGMENT_FWD),
}


def _text(name: str) -> str:
    layout, reduce, det, shared, tuning = VARIANTS[name]
    return SPEC.format(name=name, layout=layout, reduce=reduce, det=det, shared=shared, tuning=tuning)


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_conv")
    out = {}
    for name in VARIANTS:
        pkg = build_package(root, name, _text(name))
        out[name] = (importlib.import_module(pkg.__name__ + ".torch_conv"), lower(parse_spec(_text(name))[0]))
    return out


def graph(rng, n, e):
    return rng.integers(0, n, e), rng.integers(0, n, e)


def tensors(ir, rng, n, e, dtype=torch.float64, device=DEVICE, grad=False):
    x = torch.tensor(rng.standard_normal((n, ir.dim_in1)), dtype=dtype, device=device)
    y = torch.tensor(rng.standard_normal((e, ir.dim_in2)), dtype=dtype, device=device)
    shape = (ir.weight_numel,) if ir.shared_weights else (e, ir.weight_numel)
    w = torch.tensor(rng.standard_normal(shape), dtype=dtype, device=device)
    return [t.requires_grad_(grad) for t in (x, y, w)]


def n_compiled(mod) -> int:
    """Helion compilations so far of the module's conv kernels (one bound kernel per specialization)."""
    kernels = importlib.import_module(mod.__name__.rsplit(".", 1)[0] + ".helion_conv_kernels")
    return sum(len(getattr(k, "_bound_kernels", {})) for name, k in vars(kernels).items() if name.startswith("conv_"))


def check_forward_and_vjp(conv, ir, seed: int):
    """Forward and VJP of ``conv.conv`` on a 3-node, 5-edge graph (a node may be isolated; 5
    edges: a partial tile) against the numpy oracle, float64; returns the operands."""
    rng = np.random.default_rng(seed)
    n, e = 3, 5
    src, dst = graph(rng, n, e)
    s, d = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
    x, y, w = tensors(ir, rng, n, e, grad=True)
    out = conv.conv(x, y, w, s, d, n)
    arrs = [t.detach().cpu().numpy() for t in (x, y, w)]
    want = conv_reference(ir, *arrs, src, dst, n)
    assert np.abs(out.detach().cpu().numpy() - want).max() <= 1e-10 * max(1.0, np.abs(want).max())
    g = rng.standard_normal((n, ir.dim_out))
    got = torch.autograd.grad(out, (x, y, w), torch.tensor(g, device=DEVICE))
    for a, b in zip(got, conv_vjp_reference(ir, *arrs, src, dst, n, g)):
        assert np.abs(a.cpu().numpy() - b).max() <= 1e-10 * max(1.0, np.abs(b).max())
    return x, y, w, s, d, n


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_reference_and_gradients_of_every_order(pkgs, variant):
    """Forward and VJP against the numpy oracle; gradcheck and gradgradcheck in float64
    (double backward goes through bwd_x/bwd_y/bwd_w and, with unweighted paths, the *_lin ops)."""
    conv, ir = pkgs[variant]
    check_forward_and_vjp(conv, ir, seed=0)
    # the gradchecks evaluate the ops dozens of times and the segment kernels walk their
    # node's edges one by one (interpreter time ~ edges): 3 edges, with a node of two
    # in-edges, one of one and one of none, and likewise for out-edges (src: the segments
    # of the deterministic backward); every tile is partial (block_b 16)
    s, d, n = torch.tensor([1, 1, 0], device=DEVICE), torch.tensor([0, 0, 2], device=DEVICE), 3
    x, y, w = tensors(ir, np.random.default_rng(0), n, 3, grad=True)
    f = lambda x, y, w: conv.conv(x, y, w, s, d, n)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w), fast_mode=True)
    # second order with respect to edge_attr and weights (what force training needs; the
    # interpreter is slow, so node features stay fixed here: their first order is checked above)
    assert torch.autograd.gradgradcheck(lambda y, w: f(x.detach(), y, w), (y, w), fast_mode=True)


def test_segment_forward_takes_atomic_kernels_on_small_graphs(pkgs, monkeypatch):
    """A ``segment = 1`` forward without ``deterministic``: below ``SEGMENT_MIN_EDGES`` edges
    ``graph_tensors`` sorts nothing and the op launches the ``*_small`` atomic kernels; from
    it on, the sorted segment kernels. Both against the numpy oracle (mean reduce: the
    in-degree from the row pointers or, unsorted, from ``bincount``)."""
    conv, ir = pkgs["tc_segment_fwd"]
    kernels = importlib.import_module(conv.__name__.rsplit(".", 1)[0] + ".helion_conv_kernels")
    assert hasattr(kernels, "conv_fwd_0_small") and conv.SEGMENT_MIN_EDGES == 1
    s, d = torch.tensor([0, 1, 2, 1, 0]), torch.tensor([1, 1, 0, 2, 1])
    # check_forward_and_vjp's graph has 5 edges too: under 6 the atomic path, from 5 the segment one
    for threshold, sorted_ in ((6, False), (5, True)):
        monkeypatch.setattr(conv._OPS, "segment_min_edges", threshold)  # what SEGMENT_MIN_EDGES set
        graph = conv.graph_tensors(s, d, 3)
        assert [g.numel() > 0 for g in graph[2:]] == [sorted_, sorted_]
        check_forward_and_vjp(conv, ir, seed=3)


def test_deterministic_per_edge_uvw_weights(tmp_path):
    """Segment kernels reading per-edge uvw weights of the sorted edges: a gathered row
    (``eid``) against a two-axis weight column (``eqdsl.backends.helion.printer`` broadcasts it); forward
    and VJP against the numpy oracle."""
    text = SPEC.format(name="tc_det_edge", layout="ir_mul", reduce="sum", det="true", shared="false", tuning="")
    pkg = build_package(tmp_path, "tc_det_edge", text)
    conv, ir = importlib.import_module(pkg.__name__ + ".torch_conv"), lower(parse_spec(text)[0])
    kernels = Path(pkg.__file__).parent / "helion_conv_kernels.py"
    assert "weights[eid[:, None, None], " in kernels.read_text()
    check_forward_and_vjp(conv, ir, seed=7)


# one channel group of 3 channels (node features and every output block), a uvw path (a
# tile_r reduction inside a 2-D grid's program) and uvu paths; edge attributes: 2 and 1
# channels (bwd_y keeps its channel loops)
GRID_C_SPEC = """
[[tensor_product]]
name = "{name}"
irreps_in1 = "3x0e+3x1o"
irreps_in2 = "2x0e+1x1o"
irreps_out = "3x0e+3x1o"
instructions = [[0, 0, 0, "uvw", true], [1, 1, 0, "uvu", true], [1, 0, 1, "uvw", true], [0, 1, 1, "uvu", true]]
shared_weights = {shared}
layout = "{layout}"
dtypes = ["float64"]
conv = true
reduce = "{reduce}"
deterministic = {det}

[tensor_product.tuning]
block_b = 4
block_c = 2
"""


def _kernel_sources(path: Path) -> dict[str, str]:
    """Kernel name -> its source, of a generated ``helion_*kernels.py``."""
    return dict(chunk.split("(", 1) for chunk in path.read_text().split("\ndef ")[1:])


@pytest.mark.parametrize("det, shared, layout, reduce", [("false", "false", "mul_ir", "sum"),
                                                         ("true", "true", "ir_mul", "mean")])
def test_channel_grid_axis_matches_reference(det, shared, layout, reduce, tmp_path):
    """``grid_c``: the conv kernels whose one channel group spans several channel tiles
    take the tiles as a second grid axis: ``hl.tile([channels, edges])`` for the atomic and
    per-edge kernels, ``hl.tile([channels, nodes], block_size=[bc, 1])`` for the segment
    reductions (one program per node and channel tile; the channel tiles of a node are
    independent). Forward and VJP against the oracle with 5 edges (``block_b`` 4) and 3
    channels (``block_c`` 2): partial tiles on both axes."""
    name = f"tc_grid_c_{det}"
    text = GRID_C_SPEC.format(name=name, shared=shared, layout=layout, reduce=reduce, det=det)
    pkg = build_package(tmp_path, name, text)
    conv, ir = importlib.import_module(pkg.__name__ + ".torch_conv"), lower(parse_spec(text)[0])
    kernels = _kernel_sources(Path(pkg.__file__).parent / "helion_conv_kernels.py")
    rows = "out.size(0)], block_size=[2, 1])" if det == "true" else "src.size(0)], block_size=[2, 4])"
    scatters = {"conv_fwd_0": rows, "conv_bwd_x1_0": rows.replace("out.", "gx.")}
    for kernel, header in scatters.items():
        assert f"hl.tile([3, {header}:" in kernels[kernel], kernel
        assert "for tile_c in" not in kernels[kernel], kernel
    # edge attributes have 2 and 1 channels (two channel groups); shared weights: partial sums
    assert "for tile_c in hl.tile(2, block_size=2)" in kernels["conv_bwd_x2_0"]
    if shared == "true":
        assert "hl.tile([" not in kernels["conv_bwd_w_0"]
    else:
        assert "for tile_c, tile_b in hl.tile([3, src.size(0)], block_size=[2, 4]):" in kernels["conv_bwd_w_0"]
    check_forward_and_vjp(conv, ir, seed=11)


# A MACE-like channelwise conv in mul_ir with multi-channel l > 0 blocks (whose two layouts
# differ): each op converts its operands to the kernels' ir_mul rows and its result back inside
# its implementation, in the forward's atomic and segment kernels and in the fused backward
MUL_IR_SPEC = """
[[tensor_product]]
name = "tc_mul_ir"
irreps_in1 = "2x0e+2x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
output_order = "sorted"
instruction_order = "output"
cg_convention = "e3nn-0.5"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
reduce = "sum"

[tensor_product.tuning.conv_fwd]
segment = 1
segment_min_edges = 6
"""


def test_mul_ir_conv_converts_inside_its_ops(tmp_path):
    """Forward and VJP (the fused backward) of a ``mul_ir`` channelwise conv against the
    oracle, on a 5-edge graph (under ``segment_min_edges``: the atomic forward) and a 6-edge
    one (at it: the sorted segment forward), all three gradients together (the fused backward) and
    one at a time; then second order: gradcheck of the forces ``dE/dy`` with respect to the
    edge attributes and weights."""
    pkg = build_package(tmp_path, "tc_mul_ir", MUL_IR_SPEC)
    conv, ir = importlib.import_module(pkg.__name__ + ".torch_conv"), lower(parse_spec(MUL_IR_SPEC)[0])
    assert conv._OPS.fused is not None and conv._OPS.segment_min_edges == 6
    # 6 edges, not more: the second-order gradcheck below runs on this graph, and the segment
    # forward walks a node's edges one by one (interpreter time ~ edges)
    for seed, (n, e) in ((5, (3, 5)), (6, (3, 6))):
        rng = np.random.default_rng(seed)
        src, dst = graph(rng, n, e)
        s, d = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
        x, y, w = tensors(ir, rng, n, e, grad=True)
        out = conv.conv(x, y, w, s, d, n)
        arrs = [t.detach().cpu().numpy() for t in (x, y, w)]
        want = conv_reference(ir, *arrs, src, dst, n)
        assert np.abs(out.detach().cpu().numpy() - want).max() <= 1e-10 * max(1.0, np.abs(want).max())
        g = rng.standard_normal((n, ir.dim_out))
        got = torch.autograd.grad(out, (x, y, w), torch.tensor(g, device=DEVICE))
        for a, b in zip(got, conv_vjp_reference(ir, *arrs, src, dst, n, g)):
            assert np.abs(a.cpu().numpy() - b).max() <= 1e-10 * max(1.0, np.abs(b).max())
        # one gradient at a time: the unfused ops (bwd_x, bwd_y, bwd_w), which convert too
        for i, want in enumerate(conv_vjp_reference(ir, *arrs, src, dst, n, g)):
            (one,) = torch.autograd.grad(conv.conv(x, y, w, s, d, n), (x, y, w)[i], torch.tensor(g, device=DEVICE))
            assert np.abs(one.cpu().numpy() - want).max() <= 1e-10 * max(1.0, np.abs(want).max())
    # second order through every op's derivative: forces (dE/dy), then their gradient wrt the weights
    forces = lambda y_, w_: torch.autograd.grad((conv.conv(x, y_, w_, s, d, n) ** 2).sum(), y_,  # noqa: E731
                                                create_graph=True)[0]
    assert torch.autograd.gradcheck(forces, (y, w), fast_mode=True)


def test_forces_then_weight_gradient(pkgs):
    """The pattern of an interatomic potential: forces = -dE/d(edge_attr), then d(forces)/dW."""
    conv, ir = pkgs["tc_atomic"]
    rng = np.random.default_rng(1)
    n, e = 3, 5
    src, dst = graph(rng, n, e)
    s, d = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
    x, y, w = tensors(ir, rng, n, e, grad=True)
    energy = (conv.conv(x, y, w, s, d, n) ** 2).sum()
    (fy,) = torch.autograd.grad(energy, y, create_graph=True)
    (gw,) = torch.autograd.grad((fy**2).sum(), w)
    assert torch.isfinite(gw).all() and gw.shape == w.shape and gw.abs().max() > 0

    def forces(y_, w_):
        return torch.autograd.grad((conv.conv(x, y_, w_, s, d, n) ** 2).sum(), y_, create_graph=True)[0]

    assert torch.autograd.gradcheck(forces, (y, w), fast_mode=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_new_graph_sizes_do_not_recompile(pkgs, variant):
    """Graphs of four sizes: forward + backward compile each kernel once. The sizes cross the
    integer specializations a kernel could key on (odd, even, multiples of 16 and not, for
    nodes and edges)."""
    conv, ir = pkgs[variant]
    rng = np.random.default_rng(2)
    sizes = [(3, 7), (8, 16), (5, 17), (16, 32)]
    before = n_compiled(conv)
    counts = []
    for n, e in sizes:
        src, dst = graph(rng, n, e)
        x, y, w = tensors(ir, rng, n, e, grad=True)
        out = conv.conv(x, y, w, torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE), n)
        out.backward(torch.ones_like(out))
        counts.append(n_compiled(conv))
    first = counts[0]
    print(f"{variant}: {first - before} compilations for the first graph, {counts[-1] - first} for the others")
    assert counts[-1] == first, counts


def test_deterministic_is_bitwise_reproducible(pkgs):
    """Many edges into few nodes: forward and all gradients identical every run."""
    conv, ir = pkgs["tc_det_shared"]
    rng = np.random.default_rng(3)
    n, e = 3, 20  # ~7 edges a node; the segment kernels walk them one by one (interpreter: time ~ e)
    src, dst = graph(rng, n, e)
    s, d = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
    x, y, w = tensors(ir, rng, n, e, grad=True)
    runs = []
    for _ in range(3):
        out = conv.conv(x, y, w, s, d, n)
        gx, gy, gw = torch.autograd.grad(out, (x, y, w), torch.ones_like(out))
        runs.append([out.detach(), gx, gy, gw])
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)
    # a permutation of the edge list sums each node's edges in another order, still close
    p = torch.as_tensor(rng.permutation(e), device=DEVICE)
    out2 = conv.conv(x, y[p], w, s[p], d[p], n)
    torch.testing.assert_close(out2, runs[0][0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "bad, exc, word",
    [
        ("src_out_of_range", ValueError, "src"),
        ("dst_negative", ValueError, "dst"),
        ("num_nodes_mismatch", ValueError, "num_nodes"),
        ("num_nodes_not_int", TypeError, "num_nodes"),
        ("float_src", TypeError, "src"),
        ("src_2d", ValueError, "src"),
        ("dst_length", ValueError, "dst"),
        ("edge_attr_rows", ValueError, "edge_attr"),
        ("edge_attr_width", ValueError, "edge_attr"),
        ("node_features_width", ValueError, "node_features"),
        ("weights_rows", ValueError, "weights"),
        ("dtype_mismatch", TypeError, "dtype"),
        ("int_features", TypeError, "node_features"),
        ("not_a_tensor", TypeError, "edge_attr"),
    ],
)
def test_bad_inputs_are_named_before_any_kernel(pkgs, bad, exc, word, monkeypatch):
    conv, ir = pkgs["tc_atomic"]
    rng = np.random.default_rng(4)
    n, e = 4, 6
    src, dst = (torch.as_tensor(a, device=DEVICE) for a in graph(rng, n, e))
    x, y, w = tensors(ir, rng, n, e)
    if bad == "src_out_of_range":
        src = src.clone(); src[2] = n
    elif bad == "dst_negative":
        dst = dst.clone(); dst[0] = -1
    elif bad == "num_nodes_mismatch":
        n = n - 1
    elif bad == "num_nodes_not_int":
        n = float(n)
    elif bad == "float_src":
        src = src.double()
    elif bad == "src_2d":
        src = src[:, None]
    elif bad == "dst_length":
        dst = dst[:-1]
    elif bad == "edge_attr_rows":
        y = y[:-1]
    elif bad == "edge_attr_width":
        y = y[:, :-1]
    elif bad == "node_features_width":
        x = x[:, :-1]
    elif bad == "weights_rows":
        w = w[:-1]
    elif bad == "dtype_mismatch":
        y = y.float()
    elif bad == "int_features":
        x = x.long()
    elif bad == "not_a_tensor":
        y = y.tolist()

    def no_kernels(*a, **k):
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(conv, "conv_fwd_op", no_kernels)
    with pytest.raises(exc) as info:
        conv.conv(x, y, w, src, dst, n)
    assert word in str(info.value), str(info.value)


def test_check_false_skips_the_range_check(pkgs, monkeypatch):
    conv, ir = pkgs["tc_atomic"]
    rng = np.random.default_rng(5)
    n, e = 4, 6
    src, dst = (torch.as_tensor(a, device=DEVICE) for a in graph(rng, n, e))
    x, y, w = tensors(ir, rng, n, e)
    want = conv.conv(x, y, w, src, dst, n)

    def sync(*a):
        raise AssertionError("range check ran")

    monkeypatch.setattr(conv._OPS, "check_range", sync)
    with pytest.raises(AssertionError, match="range check"):
        conv.conv(x, y, w, src, dst, n)
    torch.testing.assert_close(conv.conv(x, y, w, src, dst, n, check=False), want)


# ------------------------------------------------------------------ GPU: example specs


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (the interpreter is far too slow for these sizes)")
@pytest.mark.parametrize("example", ["mace_large", "nequip_water", "nequip_toluene"])
def test_example_specs_on_gpu(tmp_path, example):
    spec_path = EXAMPLES / f"{example}.toml"
    spec = load_spec(spec_path)[0]
    assert spec.conv
    pkg = build_package(tmp_path, example, spec_path.read_text())
    conv = importlib.import_module(pkg.__name__ + ".torch_conv")
    ir = lower(spec)
    rng = np.random.default_rng(6)
    n, e = 400, 4000
    src, dst = graph(rng, n, e)
    s, d = torch.as_tensor(src, device="cuda"), torch.as_tensor(dst, device="cuda")
    x, y, w = tensors(ir, rng, n, e, dtype=torch.float64, device="cuda", grad=True)
    out = conv.conv(x, y, w, s, d, n)
    arrs = [t.detach().cpu().numpy() for t in (x, y, w)]
    want = conv_reference(ir, *arrs, src, dst, n)
    scale = max(1.0, np.abs(want).max())
    assert np.abs(out.detach().cpu().numpy() - want).max() <= 1e-9 * scale
    g = rng.standard_normal((n, ir.dim_out))
    got = torch.autograd.grad(out, (x, y, w), torch.tensor(g, device="cuda"))
    for a, b in zip(got, conv_vjp_reference(ir, *arrs, src, dst, n, g)):
        assert np.abs(a.cpu().numpy() - b).max() <= 1e-9 * max(1.0, np.abs(b).max())
    # float32, the dtype of production runs
    out32 = conv.conv(x.float(), y.float(), w.float(), s, d, n)
    assert np.abs(out32.detach().cpu().numpy() - want).max() <= 1e-4 * scale
