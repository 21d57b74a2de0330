"""``conv_radial`` in PyTorch (``<pkg>.torch_conv.conv_radial``): the convolution given the
radial MLP's last layer, ``conv(x, y, radial_features @ radial_weight, ...)`` with each edge's
weights formed on chip.

Three packages: channelwise with 16 channels (the on-chip product is a ``tl.dot``; the fused
radial backward; ``mul_ir``, atomics, sum), the same with the radial node scatters tuned to
segment reductions (``segment = 1``), and a deterministic ``mean`` one with 2 channels and
``uvv`` paths (segment reductions, the product as multiply-adds, ``ir_mul``; its ``bwd_x``
reads 3-D weight tiles, so that op materializes the weights). CPU runs use Triton's
interpreter, whose cost is Helion compiling each kernel once per dtype and size bucket (0, 1,
2 or more): tiny graphs of at least 2 nodes and edges.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings, strategies as st  # noqa: E402

from eqdsl.lower import lower  # noqa: E402
from eqdsl.reference import conv_reference, conv_vjp_reference  # noqa: E402
from eqdsl.spec import parse_spec  # noqa: E402
from genutil import build_package  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SPECS = {
    # channelwise, 16 channels: 16-row x 16-column weight tiles, a dot; H = 12 padded to 16
    "rad_dot": """
[[tensor_product]]
name = "rad_dot"
irreps_in1 = "16x0e"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float32", "float64"]
conv = true
radial_features = 12
""",
    # rad_dot with segment reductions for speed (deterministic = false): the node scatters of
    # conv_radial_fwd / conv_radial_bwd_x on graphs of at least 10 edges (sorted), below that
    # their atomic kernels (*_small); the conv's own ops stay atomic. Its fused backward is the
    # conv's at W = rf @ Wr (materialize = 1)
    "rad_seg": """
[[tensor_product]]
name = "rad_seg"
irreps_in1 = "16x0e"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
radial_features = 12

[tensor_product.tuning]
segment_min_edges = 10

[tensor_product.tuning.conv_radial_fwd]
segment = 1

[tensor_product.tuning.conv_radial_bwd_x]
segment = 1

[tensor_product.tuning.conv_radial_bwd]
materialize = 1
""",
    # rad_dot with materialize = 1 in every radial op: no radial kernels; conv_radial is the
    # composition conv(x, y, rf @ Wr) (autograd keeps W, as the unfused path)
    "rad_mat": """
[[tensor_product]]
name = "rad_mat"
irreps_in1 = "16x0e"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
reduce = "mean"
radial_features = 12

[tensor_product.tuning.conv_radial_fwd]
materialize = 1

[tensor_product.tuning.conv_radial_bwd_x]
materialize = 1

[tensor_product.tuning.conv_radial_bwd_y]
materialize = 1

[tensor_product.tuning.conv_radial_bwd]
materialize = 1
""",
    # deterministic mean, ir_mul, 2 channels: segment reductions of 16 edges a step, 2-column
    # weight tiles (multiply-adds); uvv paths: dF/dx reduces over their (u, v) weight tiles, so
    # conv_radial_bwd_x forms W with a matmul and runs conv_bwd_x (the others: on chip)
    "rad_det": """
[[tensor_product]]
name = "rad_det"
irreps_in1 = "2x0e"
irreps_in2 = "2x0e+1x1o"
irreps_out = "2x0e+1x1o"
instructions = [[0, 0, 0, "uvv", true], [0, 1, 1, "uvv", true]]
shared_weights = false
layout = "ir_mul"
dtypes = ["float64"]
conv = true
reduce = "mean"
deterministic = true
radial_features = 3
""",
}


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_conv_radial")
    out = {}
    for name, text in SPECS.items():
        pkg = build_package(root, name, text)
        out[name] = (importlib.import_module(pkg.__name__ + ".torch_conv"), lower(parse_spec(text)[0]), pkg)
    return out


def operands(ir, rng, n, e, dtype=torch.float64, grad=True):
    """x, y, radial_features, radial_weight, src, dst of a random graph (a node may be isolated)."""
    def t(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE).requires_grad_(grad)

    src, dst = (torch.as_tensor(rng.integers(0, n, e), device=DEVICE) for _ in range(2))
    return (t(n, ir.dim_in1), t(e, ir.dim_in2), t(e, ir.radial_features), t(ir.radial_features, ir.weight_numel),
            src, dst)


def close(a, b, rtol):
    a, b = (np.asarray(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v) for v in (a, b))
    assert a.shape == b.shape
    if b.size:
        assert np.abs(a - b).max() <= rtol * max(1.0, np.abs(b).max())


def test_generated_kernels(pkgs):
    """The radial kernels exist where the weight tiles allow one product (and read no
    ``weights``); IEEE float32 products; metadata; a dot exactly where the tiles have 16 rows
    and columns."""
    kinds = {"rad_dot": ("fwd", "bwd_x", "bwd_y", "bwd"), "rad_seg": ("fwd", "bwd_x", "bwd_y"),
             "rad_det": ("fwd", "bwd_y"), "rad_mat": ()}
    for name, (conv, ir, pkg) in pkgs.items():
        assert pkg.RADIAL_FEATURES == conv.RADIAL_FEATURES == ir.radial_features
        assert conv._RADIAL.fused_ops == kinds[name], name
        source = (Path(pkg.__file__).parent / "helion_conv_kernels.py").read_text()
        for kernel in re.findall(r"\ndef (conv_radial_\w+)\((.*?)\) -> None:", source, re.S):
            params = kernel[1]
            assert "radial_features" in params and "radial_weight" in params and "weights" not in params
        assert source.count('dot_precision="ieee"') == len(re.findall(r"\ndef conv_radial_", source))
        assert (len(re.findall(r"\ndef conv_radial_", source)) > 0) == bool(kinds[name]), name
    dot = (Path(pkgs["rad_dot"][2].__file__).parent / "helion_conv_kernels.py").read_text()
    assert "torch.matmul(rfh, hl.load(radial_weight, [hl.arange(16)[:, None], " in dot
    det = (Path(pkgs["rad_det"][2].__file__).parent / "helion_conv_kernels.py").read_text()
    assert "torch.matmul" not in det and "(rfh[:, :, None] * " in det


@settings(max_examples=4)
@given(n=st.integers(2, 4), e=st.one_of(st.just(0), st.integers(2, 19)), seed=st.integers(0, 2**16))
def test_matches_unfused_composition(pkgs, n, e, seed):
    """``conv_radial`` and its four gradients equal ``conv(x, y, rf @ Wr)``'s, float64 (``rad_dot``:
    every radial kernel; ``rad_det`` is compared with the numpy oracle below, which costs no
    compilation of its conv kernels)."""
    conv, ir, _ = pkgs["rad_dot"]
    x, y, rf, wr, s, d = operands(ir, np.random.default_rng(seed), n, e)
    got = conv.conv_radial(x, y, rf, wr, s, d, n)
    want = conv.conv(x, y, rf @ wr, s, d, n)
    close(got, want, 1e-12)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (x, y, rf, wr), g), torch.autograd.grad(want, (x, y, rf, wr), g)):
        close(a, b, 1e-12)


@pytest.mark.parametrize("e", [6, 17])
def test_segment_key(pkgs, e):
    """``segment = 1`` in the radial ops' sub-tables (``rad_seg``): their kernels are segment
    reductions over the sorted graph (17 edges), and their atomic ``*_small`` copies below
    ``segment_min_edges`` (6 edges, not sorted); values and all four gradients equal
    ``conv(x, y, rf @ Wr)``'s either way, and ``bwd_x``'s own op (not only the fused backward)."""
    conv, ir, pkg = pkgs["rad_seg"]
    assert conv._OPS.graph_names == ("src", "dst", "dst_order", "dst_ptr", "src_order", "src_ptr")
    assert conv._RADIAL.segment == {"fwd": 2, "bwd_x": 4} and conv._OPS.segment == {}
    assert conv._RADIAL.ops["bwd"] is conv.conv_radial_bwd_op  # materialize = 1: the conv's fused backward
    source = (Path(pkg.__file__).parent / "helion_conv_kernels.py").read_text()
    assert "conv_radial_bwd_fused" not in source
    for op in ("fwd", "bwd_x1"):
        assert re.search(rf"\ndef conv_radial_{op}_0\(\s*order: torch.Tensor,\s*ptr: torch.Tensor,", source)
        assert re.search(rf"\ndef conv_radial_{op}_0_small\(\s*src: torch.Tensor,\s*dst: torch.Tensor,", source)
    n = 4
    x, y, rf, wr, s, d = operands(ir, np.random.default_rng(e), n, e)
    graph = conv.graph_tensors(s, d, n)
    assert (graph[2].numel() > 0) == (e >= 10)
    got = conv.conv_radial(x, y, rf, wr, s, d, n)
    want = conv.conv(x, y, rf @ wr, s, d, n)
    close(got, want, 1e-12)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (x, y, rf, wr), g), torch.autograd.grad(want, (x, y, rf, wr), g)):
        close(a, b, 1e-12)
    h = torch.randn_like(y)
    close(conv.conv_radial_bwd_x_op(g, y, rf, wr, *graph, n), conv.conv_bwd_x_op(g, y, rf @ wr, *graph, n), 1e-12)
    close(conv.conv_radial_fwd_op(x, h, rf, wr, *graph, n), conv.conv_fwd_op(x, h, rf @ wr, *graph, n), 1e-12)
    for a, b in zip(conv.conv_radial_bwd_op(x, y, rf, wr, g, *graph, n), conv.conv_bwd_op(x, y, rf @ wr, g, *graph, n)):
        close(a, b, 1e-12)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_matches_reference(pkgs, name):
    """Forward and VJP against the numpy oracle at ``W = rf @ Wr`` (17 edges: a partial tile of 16);
    deterministic: bitwise reproducible."""
    conv, ir, _ = pkgs[name]
    rng = np.random.default_rng(1)
    n, e = 4, 17
    x, y, rf, wr, s, d = operands(ir, rng, n, e)
    out = conv.conv_radial(x, y, rf, wr, s, d, n)
    if ir.deterministic:  # segment reductions in a fixed order: the same bits every run
        assert torch.equal(out, conv.conv_radial(x, y, rf, wr, s, d, n))
    arrs = [t.detach().cpu().numpy() for t in (x, y)]
    rfn, wrn = rf.detach().cpu().numpy(), wr.detach().cpu().numpy()
    close(out, conv_reference(ir, *arrs, rfn @ wrn, s.cpu().numpy(), d.cpu().numpy(), n), 1e-10)
    g = rng.standard_normal((n, ir.dim_out))
    got = torch.autograd.grad(out, (x, y, rf, wr), torch.tensor(g, device=DEVICE))
    gx, gy, gw = conv_vjp_reference(ir, *arrs, rfn @ wrn, s.cpu().numpy(), d.cpu().numpy(), n, g)
    for a, b in zip(got, (gx, gy, gw @ wrn.T, rfn.T @ gw)):
        close(a, b, 1e-10)


def test_float32(pkgs):
    """float32 (the dot in IEEE float32): the float64 op's values and gradients to float32 rounding
    (TF32 would round the products' operands to 10 mantissa bits: ~1e-3)."""
    conv, ir, _ = pkgs["rad_dot"]
    args = operands(ir, np.random.default_rng(2), 5, 23)
    s, d = args[4:]
    a64 = [t.detach().requires_grad_() for t in args[:4]]
    a32 = [t.detach().float().requires_grad_() for t in args[:4]]
    got, want = conv.conv_radial(*a32, s, d, 5), conv.conv_radial(*a64, s, d, 5)
    assert got.dtype == torch.float32
    close(got, want, 1e-5)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, a32, g.float()), torch.autograd.grad(want, a64, g)):
        close(a, b, 1e-5)


def test_materialized_everywhere_is_the_composition(pkgs):
    """``materialize = 1`` in every radial op (``rad_mat``): the package has no radial kernels
    and ``conv_radial`` runs ``conv(x, y, rf @ Wr)`` (the same autograd graph: the conv's ops
    and a matmul), after checking the radial arguments."""
    conv, ir, pkg = pkgs["rad_mat"]
    assert conv._RADIAL.composed and not conv._RADIAL.fused_ops
    assert "\ndef conv_radial_" not in (Path(pkg.__file__).parent / "helion_conv_kernels.py").read_text()
    x, y, rf, wr, s, d = operands(ir, np.random.default_rng(7), 4, 9)
    out = conv.conv_radial(x, y, rf, wr, s, d, 4)
    close(out, conv.conv(x, y, rf @ wr, s, d, 4), 0.0)

    def nodes(fn, seen):
        if fn is not None and fn not in seen:
            seen.add(fn)
            for nxt, _ in fn.next_functions:
                nodes(nxt, seen)
        return {type(f).__name__ for f in seen}

    # the matmul is in the autograd graph (its output W saved for the backward), not inside an op
    assert "MmBackward0" in nodes(out.grad_fn, set())
    assert "MmBackward0" not in nodes(pkgs["rad_seg"][0].conv_radial(x, y, rf, wr, s, d, 4).grad_fn, set())
    with pytest.raises(ValueError, match=r"rad_mat\.conv_radial: radial_weight must have shape \(12, 32\)"):
        conv.conv_radial(x, y, rf, wr[:, :-1], s, d, 4)


@pytest.mark.parametrize("name", ["rad_dot", "rad_seg", "rad_det", "rad_mat"])
def test_gradients_of_every_order(pkgs, name):
    """gradcheck (float64) with respect to all four tensors, through the radial ops,
    ``conv_bwd_w`` and the matmuls (``rad_dot``: the fused radial backward; ``rad_seg``: the
    conv's fused backward at ``W = rf @ Wr``; ``rad_det``: the segment kernels and an op that
    materializes the weights); gradgradcheck for ``rad_dot`` and ``rad_seg`` (the same
    formulas; the interpreter runs ``rad_det``'s segment kernels ~5x slower)."""
    conv, ir, _ = pkgs[name]
    x, y, rf, wr, s, d = operands(ir, np.random.default_rng(3), 3, 5)

    def f(x, y, rf, wr):
        return conv.conv_radial(x, y, rf, wr, s, d, 3)

    assert torch.autograd.gradcheck(f, (x, y, rf, wr), fast_mode=True)
    if name != "rad_det":
        assert torch.autograd.gradgradcheck(f, (x, y, rf, wr), fast_mode=True)


def test_bad_arguments(pkgs):
    """One clear error per bad argument, naming it."""
    conv, ir, _ = pkgs["rad_det"]
    x, y, rf, wr, s, d = operands(ir, np.random.default_rng(4), 3, 5, grad=False)
    cases = [
        ((x, y, rf[:, :2], wr, s, d, 3), ValueError, r"rad_det\.conv_radial: radial_features must have shape \(5, 3\)"),
        ((x, y, rf[:4], wr, s, d, 3), ValueError, r"radial_features must have shape \(5, 3\)"),
        ((x, y, rf, wr.T, s, d, 3), ValueError, r"radial_weight must have shape \(3, 6\)"),
        ((x, y, rf.float(), wr, s, d, 3), TypeError, r"radial_features must have dtype in \(torch.float64\)"),
        ((x, y, rf, wr.numpy() if DEVICE == "cpu" else 1.0, s, d, 3), TypeError,
         r"radial_weight must be a torch.Tensor"),
        ((x, y, rf, wr, s, d, 4), ValueError, r"num_nodes=4 does not match node_features"),
        ((x, y, rf, wr, s, d[:4], 3), ValueError, r"src and dst must have one entry per edge"),
        ((x, y, rf, wr, s, d + 3, 3), ValueError, r"dst holds node indices outside"),
    ]
    assert ir.weight_numel == 6
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            conv.conv_radial(*args)


def test_radial_dot_key(tmp_path):
    """``radial_dot = 1`` (top level or an op's sub-table) sets ``dot_precision="tf32x3"`` on
    that op's radial kernels only; the default stays IEEE; a bad value is one SpecError line."""
    from eqdsl.backends import check_tuning
    from eqdsl.backends.helion.conv import fused_radial_kernels, radial_kernel_context
    from eqdsl.errors import SpecError

    base = SPECS["rad_dot"] + "[tensor_product.tuning.conv_radial_fwd]\nradial_dot = {}\n"
    spec = parse_spec(base.format(1))[0]
    check_tuning(spec)
    ir = lower(spec)
    ctx = radial_kernel_context(ir, spec.tuning)
    assert {k["settings"] for k in ctx["radial_fwd"]} == {'dot_precision="tf32x3"'}
    others = [k for op, ks in ctx.items() if op != "radial_fwd" for k in ks] + fused_radial_kernels(ir, spec.tuning)
    assert others and {k["settings"] for k in others} == {'dot_precision="ieee"'}
    with pytest.raises(SpecError, match="radial_dot") as e:
        check_tuning(parse_spec(base.format(2))[0])
    assert "\n" not in str(e.value)
