"""Generated torch ops run on their tensors' device and refuse operands on several devices.

On the CPU (CI): tensors on the ``meta`` device next to CPU tensors reach every device
check (they pass the dtype and shape checks) and must raise a ``ValueError`` naming the
arguments and their devices before any kernel runs: ``tensor_product`` and ``conv``,
the kernel ops called directly (custom ops and their implementations).

On a machine with two GPUs (marked ``gpu``): operands on ``cuda:1`` while device 0 is
current give what they give on ``cuda:0`` (forward, gradients, the gradient of forces),
through the shipped Triton code and through Helion (``EQDSL_KERNELS=helion``), for the tensor
product and the fused convolution; ``cuda:0`` with ``cuda:1`` operands is refused.

CUDA graphs and ``torch.compile(mode="reduce-overhead")``: ``tests/test_cuda_graphs.py``.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from eqdsl.runtime.torch import checks as rt  # noqa: E402
from genutil import build_package  # noqa: E402

# the NequIP/MACE edge product in small: channelwise (uvu) with per-edge weights (so a
# fused backward), mul_ir rows (the conv's layout conversions run too)
SPEC = """
[[tensor_product]]
name = "{name}"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float32", "float64"]
conv = true
reduce = "mean"
"""

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """(torch_ops, torch_conv) of the package (mean reduce: the in-degree is computed too)."""
    p = build_package(tmp_path_factory.mktemp("torch_device"), "td_mean", SPEC.format(name="td_mean"))
    return importlib.import_module(p.__name__ + ".torch_ops"), importlib.import_module(p.__name__ + ".torch_conv")


def _tp_inputs(ops, batch, device, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((batch, ops.DIM_IN1), (batch, ops.DIM_IN2), (batch, ops.WEIGHT_NUMEL))
    return [torch.randn(s, generator=g, dtype=dtype).to(device) for s in shapes]


def _conv_inputs(conv, nodes, edges, device, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, conv.DIM_IN1, generator=g, dtype=dtype)
    y = torch.randn(edges, conv.DIM_IN2, generator=g, dtype=dtype)
    w = torch.randn(edges, conv.WEIGHT_NUMEL, generator=g, dtype=dtype)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    return [t.to(device) for t in (x, y, w, src, dst)]


@pytest.fixture
def no_kernels(pkg, monkeypatch):
    """Every Helion launch of both modules raises: a device error must come before any."""

    def refuse(*args):
        raise AssertionError("a kernel ran")

    for mod in pkg:
        for name in vars(mod._k):
            monkeypatch.setattr(mod._k, name, refuse)


def _assert_names(info, *parts):
    msg = str(info.value)
    for part in parts:
        assert part in msg, (part, msg)


# ---------------------------------------------------------------- CPU: mixed devices refused


@pytest.mark.parametrize("odd", [0, 1, 2])
def test_tensor_product_refuses_mixed_devices(pkg, no_kernels, odd):
    """One of x1, x2, weights on ``meta``, the others on the CPU."""
    ops, _ = pkg
    args = _tp_inputs(ops, 3, "cpu")
    args[odd] = args[odd].to("meta")
    with pytest.raises(ValueError, match="must be on one device") as info:
        ops.tensor_product(*args)
    names = ("x1", "x2", "weights")
    _assert_names(info, "tensor_product", *(f"{n} on {'meta' if i == odd else 'cpu'}" for i, n in enumerate(names)))


def test_kernel_ops_refuse_mixed_devices(pkg, no_kernels, monkeypatch):
    """The kernel-layout ops called directly (custom ops and their implementations), the
    fused backward among them."""
    ops, _ = pkg
    x1, x2, w = _tp_inputs(ops, 3, "cpu")
    g = torch.randn(3, ops.DIM_OUT, dtype=torch.float64)
    cases = [
        ("fwd", (x1, x2, w.to("meta")), "weights on meta"),
        ("bwd_x1", (g.to("meta"), x2, w), "g on meta"),
        ("bwd_x2", (x1, g, w.to("meta")), "weights on meta"),
        ("bwd_w", (x1, x2.to("meta"), g), "x2 on meta"),
        ("bwd", (x1, x2, w, g.to("meta")), "g on meta"),
    ]
    assert hasattr(ops, "bwd_op")  # channelwise, per-edge weights: a fused backward
    for name, args, odd in cases:
        for call in (getattr(ops, f"{name}_op"), ops._OPS.impls[name]):
            with pytest.raises(ValueError, match="must be on one device") as info:
                call(*args)
            _assert_names(info, f"::{name}", odd, "x1 on cpu" if name != "bwd_x1" else "x2 on cpu")


@pytest.mark.parametrize("odd", ["node_features", "edge_attr", "weights", "src", "dst"])
def test_conv_refuses_mixed_devices(pkg, no_kernels, odd):
    _, conv = pkg
    names = ("node_features", "edge_attr", "weights", "src", "dst")
    args = _conv_inputs(conv, 4, 6, "cpu")
    i = names.index(odd)
    args[i] = args[i].to("meta")
    for check in (True, False):  # before the index check, and without it
        with pytest.raises(ValueError, match="must be on one device") as info:
            conv.conv(*args, 4, check=check)
        _assert_names(info, "conv", *(f"{n} on {'meta' if n == odd else 'cpu'}" for n in names))


def test_conv_ops_refuse_mixed_devices(pkg, no_kernels, monkeypatch):
    """The conv's kernel ops called directly: their implementations and their fake
    implementations (the custom op dispatches a meta operand to it)."""
    _, conv = pkg
    x, y, w, src, dst = _conv_inputs(conv, 4, 6, "cpu")
    graph = conv.graph_tensors(src, dst, 4)
    g_node = torch.randn(4, conv.DIM_OUT, dtype=torch.float64)
    meta = lambda t: t.to("meta")  # noqa: E731
    cases = [
        ("conv_fwd", (x, y, meta(w)), graph, "weights on meta"),
        ("conv_bwd_x", (g_node, meta(y), w), graph, "y on meta"),
        ("conv_bwd_y", (x, g_node, w), (graph[0], meta(graph[1]), *graph[2:]), "dst on meta"),
        ("conv_bwd_w", (meta(x), y, g_node), graph, "x on meta"),
        ("conv_bwd", (x, y, w, meta(g_node)), graph, "g on meta"),
    ]
    for name, operands, gr, odd in cases:
        for call in (getattr(conv, f"{name}_op"), conv._OPS.impls[name.removeprefix("conv_")]):
            with pytest.raises(ValueError, match="must be on one device") as info:
                call(*operands, *gr, 4)
            _assert_names(info, f"::{name}", odd, "src on ")


def test_same_device_check_messages():
    a, b = torch.zeros(2), torch.zeros(2, device="meta")
    rt.check_same_device("op", ("a", "b"), (a, a))
    with pytest.raises(ValueError, match=r"^op: a, b and c must be on one device, got a on cpu, b on meta, c on cpu$"):
        rt.check_same_device("op", ("a", "b", "c"), (a, b, a))


# ---------------------------------------------------------------- two GPUs


def _on(device, tensors, grad=False):
    return [t.detach().to(device).requires_grad_(grad and t.is_floating_point()) for t in tensors]


def _tp_results(ops, args):
    """forward, the three gradients of <out, cot>, and d(|dE/dx2|^2)/dW (the forces pattern)."""
    x1, x2, w = args
    out = ops.tensor_product(x1, x2, w)
    cot = torch.ones_like(out).cumsum(1)
    grads = torch.autograd.grad(out, (x1, x2, w), cot, create_graph=True)
    (gw2,) = torch.autograd.grad((grads[1] ** 2).sum(), w)
    return [out.detach(), *[g.detach() for g in grads], gw2]


def _conv_results(conv, args, nodes):
    x, y, w, src, dst = args
    out = conv.conv(x, y, w, src, dst, nodes)
    cot = torch.ones_like(out).cumsum(1)
    grads = torch.autograd.grad(out, (x, y, w), cot, create_graph=True)
    (gw2,) = torch.autograd.grad((grads[1] ** 2).sum(), w)
    return [out.detach(), *[g.detach() for g in grads], gw2]


def _paths(mod):
    """(label, setup) for each way a call can launch: the shipped Triton code, Helion."""
    from eqdsl.runtime import triton_launch

    package, source = mod.__package__, "helion_conv_kernels" if mod.__name__.endswith("torch_conv") else "helion_kernels"

    def triton():
        mod._k = triton_launch.kernels(package, source)

    def helion():
        mod._k = triton_launch._helion_kernels(package, source)

    return [("triton", triton), ("helion", helion)]


@pytest.fixture
def restore_launch(pkg):
    saved = [(mod, mod._k) for mod in pkg]
    yield
    for mod, k in saved:
        mod._k = k


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_tensor_product_on_the_second_gpu(pkg, restore_launch):
    ops, conv = pkg
    torch.cuda.set_device(0)
    base = _tp_inputs(ops, 37, "cpu")
    want = _tp_results(ops, _on("cuda:0", base, grad=True))
    for label, setup in _paths(ops):
        setup()
        got = _tp_results(ops, _on("cuda:1", base, grad=True))
        assert torch.cuda.current_device() == 0, label
        for a, b in zip(got, want):
            assert a.device == torch.device("cuda:1"), label
            torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-12, atol=1e-12, msg=label)
    with pytest.raises(ValueError, match="weights on cuda:1"):
        ops.tensor_product(*_on("cuda:0", base[:2]), base[2].to("cuda:1"))


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_conv_on_the_second_gpu(pkg, restore_launch):
    ops, conv = pkg
    torch.cuda.set_device(0)
    nodes = 50
    base = _conv_inputs(conv, nodes, 400, "cpu")
    want = _conv_results(conv, _on("cuda:0", base, grad=True), nodes)
    for label, setup in _paths(conv):
        setup()
        got = _conv_results(conv, _on("cuda:1", base, grad=True), nodes)
        assert torch.cuda.current_device() == 0, label
        for a, b in zip(got, want):
            assert a.device == torch.device("cuda:1"), label
            # atomics: the summation order (the last bits) may differ
            torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-12, atol=1e-12, msg=label)
    args = _on("cuda:1", base)
    bad = args[4].clone()
    bad[3] = nodes
    with pytest.raises(ValueError, match="dst holds node indices outside"):
        conv.conv(*args[:4], bad, nodes)
    with pytest.raises(ValueError, match="src on cuda:0"):
        conv.conv(*args[:3], args[3].to("cuda:0"), args[4], nodes)
