"""The eager fast path of the generated torch entry points (``torch_runtime.eager_mode``).

On CUDA, plain eager calls skip the custom-op dispatcher: no gradient needed, the op's
implementation; one needed, its ``torch.autograd.Function`` (backward: the same formulas
as the custom ops). Here the fast path runs on CPU through Triton's interpreter
(``EAGER.device_type = "cpu"``, the test hook) and is checked to be taken exactly where
it should, to give the custom ops' results bit for bit, to differentiate to third order
like e3nn, and to raise every error the custom-op path raises. The packages are the
ones test_torch_grads / test_torch_conv build (compiled once per session).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from eqdsl.runtime import torch_runtime as rt  # noqa: E402
from test_torch_conv import graph, pkgs, tensors  # noqa: E402,F401  (pkgs: fixture)
from test_torch_grads import (  # noqa: E402,F401  (grad_root: fixture)
    DEVICE,
    fixed,
    grad_root,
    rel_err,
    torch_inputs,
)
from test_torch_ops import e3nn_tp  # noqa: E402


@pytest.fixture
def fast(monkeypatch):
    """The fast path on this machine's tensors (CPU: the interpreter stands in for CUDA)."""
    monkeypatch.setattr(rt.EAGER, "device_type", DEVICE)
    monkeypatch.setattr(rt.EAGER, "enabled", True)
    return rt.EAGER


def _off():
    return _Setting(False)


class _Setting:
    """``with _Setting(False):`` runs the custom-op path (as before the fast path)."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        self.old, rt.EAGER.enabled = rt.EAGER.enabled, self.enabled

    def __exit__(self, *exc):
        rt.EAGER.enabled = self.old


def track(mod, monkeypatch) -> list:
    """Record ``kind:name`` for every op call of generated module ``mod``: ``custom`` (the
    custom op), ``direct`` (the implementation, no graph), ``function`` (the autograd.Function),
    ``checked`` (``_fwd_checked``: tensor_product's direct call, and every run of fwd's
    implementation)."""
    log = []

    def wrap(kind, name, fn):
        def f(*a):
            log.append(f"{kind}:{name}")
            return fn(*a)

        return f

    for attr, e in list(vars(mod).items()):
        if isinstance(e, rt.EagerOp):
            name = attr.strip("_").removesuffix("_eager")
            monkeypatch.setattr(e, "op", wrap("custom", name, e.op))
            monkeypatch.setattr(e, "impl", wrap("direct", name, e.impl))
            fn = e.function
            monkeypatch.setattr(e, "function", type("F", (), {"apply": staticmethod(wrap("function", name, fn.apply))}))
    # the entry points' own calls (module globals)
    for glob, kind in (("fwd_op", "custom"), ("_fwd_checked", "checked"), ("conv_fwd_op", "custom")):
        if hasattr(mod, glob):
            name = "conv_fwd" if glob == "conv_fwd_op" else "fwd"
            monkeypatch.setattr(mod, glob, wrap(kind, name, getattr(mod, glob)))
    return log


# ---------------------------------------------------------------- eager_mode


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_eager_mode_decides(fast):
    x = torch.zeros(2, 3, device=DEVICE)
    p = torch.nn.Parameter(torch.zeros(3, device=DEVICE))
    assert rt.eager_mode((x, x, p), 2) == rt.DIRECT  # p is not among the differentiable 2
    assert rt.eager_mode((x, p), 2) == rt.DIRECT_GRAD
    with torch.no_grad():
        assert rt.eager_mode((x, p), 2) == rt.DIRECT
    with torch.inference_mode():
        assert rt.eager_mode((x, p), 2) == rt.DIRECT
    fast.device_type = "cuda" if DEVICE == "cpu" else "cpu"
    assert rt.eager_mode((x,), 1) == rt.CUSTOM_OP  # another device type
    fast.device_type = DEVICE
    fast.enabled = False
    assert rt.eager_mode((x,), 1) == rt.CUSTOM_OP
    fast.enabled = True

    class Sub(torch.Tensor):
        pass

    assert rt.eager_mode((x.as_subclass(Sub),), 1) == rt.CUSTOM_OP
    assert rt.eager_mode((x, [1.0]), 1) == rt.CUSTOM_OP  # not a tensor: the custom path's checks
    # every context that must see the op as one node
    import torch.autograd.forward_ad as fwAD
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.overrides import TorchFunctionMode

    with fwAD.dual_level():
        assert rt.eager_mode((x,), 1) == rt.CUSTOM_OP
    with FakeTensorMode():
        assert rt.eager_mode((x,), 1) == rt.CUSTOM_OP
    with TorchFunctionMode():
        assert rt.eager_mode((x,), 1) == rt.CUSTOM_OP
    seen = []
    make_fx(lambda t: (seen.append(rt.eager_mode((t,), 1)), t + 1)[1])(x)
    torch.vmap(lambda t: (seen.append(rt.eager_mode((t,), 1)), t + 1)[1])(x)
    torch.func.grad(lambda t: (seen.append(rt.eager_mode((t,), 1)), t.sum())[1])(x)
    torch.jit.trace(lambda t: (seen.append(rt.eager_mode((t,), 1)), t + 1)[1], (x,), check_trace=False)
    assert seen == [rt.CUSTOM_OP] * 4
    compiled = torch.compile(lambda t: t + rt.eager_mode((t,), 1), backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), x + rt.CUSTOM_OP)
    assert rt.eager_mode((x,), 1) == rt.DIRECT  # and back to eager


def test_check_cache_rechecks_what_it_cannot_remember():
    calls = []

    def check(a, n):
        calls.append(1)
        if a.shape[0] != n:
            raise ValueError("rows")

    cached = rt.CheckCache(check)
    x = torch.zeros(3, 2)
    cached(x, 3)
    cached(x, 3)
    cached(torch.ones(3, 2), 3)  # same metadata
    assert len(calls) == 1
    for _ in range(2):  # a failure is never remembered
        with pytest.raises(ValueError):
            cached(x, 4)
    assert len(calls) == 3
    cached(x.double(), 3)  # another dtype
    cached(x, 3.0)  # a float (the check may refuse it): every time
    cached(x, 3.0)
    assert len(calls) == 6


# ---------------------------------------------------------------- tensor_product


def test_paths_taken_and_results_equal_the_custom_ops(grad_root, fast, monkeypatch):
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, g = torch_inputs(ir, 5, seed=7)
    log = track(ops, monkeypatch)
    with _off():
        want = ops.tensor_product(x1, x2, w)
    assert log == ["custom:fwd", "checked:fwd"]
    log.clear()
    got = ops.tensor_product(x1, x2, w)
    assert log == ["checked:fwd"] and torch.equal(got, want)
    # a gradient needed: the autograd.Function; its backward launches directly (grad mode off)
    log.clear()
    a = x2.clone().requires_grad_()
    (gx2,) = torch.autograd.grad(ops.tensor_product(x1, a, w), a, g)
    assert log == ["function:fwd", "checked:fwd", "direct:bwd_x2"]
    with _off():
        log.clear()
        b = x2.clone().requires_grad_()
        (want_gx2,) = torch.autograd.grad(ops.tensor_product(x1, b, w), b, g)
        assert log == ["custom:fwd", "checked:fwd", "custom:bwd_x2"]
    assert torch.equal(gx2, want_gx2)
    # create_graph: the backward records Functions, differentiable again
    log.clear()
    a = x2.clone().requires_grad_()
    ww = w.clone().requires_grad_()
    (gx2,) = torch.autograd.grad(ops.tensor_product(x1, a, ww), a, g, create_graph=True)
    (gw,) = torch.autograd.grad(gx2.square().sum(), ww)
    assert log[:3] == ["function:fwd", "checked:fwd", "function:bwd_x2"] and "custom" not in " ".join(log)
    with _off():
        b = x2.clone().requires_grad_()
        wb = w.clone().requires_grad_()
        (want_gx2,) = torch.autograd.grad(ops.tensor_product(x1, b, wb), b, g, create_graph=True)
        (want_gw,) = torch.autograd.grad(want_gx2.square().sum(), wb)
    assert torch.equal(gx2, want_gx2) and torch.equal(gw, want_gw)


def test_tracing_and_compiling_take_the_custom_ops(grad_root, fast, monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, _ = torch_inputs(ir, 3, seed=8)
    want = ops.tensor_product(x1, x2, w)
    log = track(ops, monkeypatch)
    gm = make_fx(ops.tensor_product, tracing_mode="symbolic")(x1, x2, w)
    assert log == ["custom:fwd"]
    assert "eqdsl_tg_batch_ir_mul.fwd" in gm.code
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm.code)
        return gm.forward

    compiled = torch.compile(ops.tensor_product, backend=backend, fullgraph=True)
    assert torch.equal(compiled(x1, x2, w), want)
    assert len(graphs) == 1 and "eqdsl_tg_batch_ir_mul.fwd" in graphs[0]


def test_third_derivatives_through_the_fast_path_match_e3nn(grad_root, fast, monkeypatch):
    """d/dW -> d/dx2 -> d/dx1 through Functions only (bwd_w's derivatives: the *_lin ops)."""
    pkg, ops, ir = fixed("shared_mul_ir", grad_root)
    x1, x2, w, c = torch_inputs(ir, 7, seed=3)
    rng = torch.Generator().manual_seed(0)
    dw, d2 = (torch.randn(t.shape, generator=rng, dtype=torch.float64).to(DEVICE) for t in (w, x2))

    def chain(tp):
        a, b, ww = (t.clone().requires_grad_() for t in (x1, x2, w))
        (h1,) = torch.autograd.grad((tp(a, b, ww) * c).sum(), ww, create_graph=True)
        (h2,) = torch.autograd.grad((h1 * dw).sum(), b, create_graph=True)
        (h3,) = torch.autograd.grad((h2 * d2).sum(), a)
        return h3

    log = track(ops, monkeypatch)
    got = chain(ops.tensor_product)
    assert "custom" not in " ".join(log) and "function:bwd_x2_lin" in log
    want = chain(e3nn_tp(pkg).to(DEVICE))
    assert rel_err(got.cpu().numpy(), want.detach().cpu().numpy()) <= 1e-10


def test_gradcheck_through_the_fast_path(grad_root, fast):
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, _ = torch_inputs(ir, 3, seed=4)
    args = tuple(t.requires_grad_() for t in (x1, x2, w))
    assert torch.autograd.gradcheck(ops.tensor_product, args, fast_mode=True)
    # (higher orders: the third derivatives above, through Functions only, against e3nn)


def _bad_tp_inputs(ir, ops):
    x1, x2, w, _ = torch_inputs(ir, 4, seed=9)
    yield "x1 width", (x1[:, :-1], x2, w)
    yield "x2 rows", (x1, x2[:-1], w)
    yield "weights", (x1, x2, w[..., :-1])
    yield "dtype", (x1, x2.float(), w)
    yield "int dtype", (x1.long(), x2.long(), w.long())
    yield "1-D x1", (x1[0], x2, w)
    yield "not a tensor", (x1, x2.tolist(), w)
    if DEVICE == "cpu":
        yield "device", (x1, x2.to("meta"), w)


def test_errors_are_the_custom_paths(grad_root, fast):
    """Each bad input raises the same exception, same message, in both paths, also after
    the good metadata of the same shapes was accepted (and remembered)."""
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    ops.tensor_product(*torch_inputs(ir, 4, seed=9)[:3])
    for why, args in _bad_tp_inputs(ir, ops):
        got = []
        for enabled in (False, True, True):
            with _Setting(enabled), pytest.raises((TypeError, ValueError, RuntimeError)) as info:
                ops.tensor_product(*args)
            got.append((type(info.value), str(info.value)))
        assert got[0] == got[1] == got[2], why
    # the kernel ops' own checks, directly and from a backward
    x1, x2, w, g = torch_inputs(ir, 4, seed=9)
    for enabled in (False, True):
        with _Setting(enabled), pytest.raises(ValueError, match="g must have shape"):
            ops._bwd_x1_eager(g[:, :-1], x2, w)


# ---------------------------------------------------------------- conv


def test_conv_paths_and_results(pkgs, fast, monkeypatch):
    """Forward and edge_attr/weight gradients equal the custom ops' bit for bit: the
    deterministic variant (layout conversions, mean reduce, shared weights, *_lin ops;
    the atomic variant's path choice is the same code, its sums may reorder)."""
    conv, ir = pkgs["tc_det_shared"]
    rng = np.random.default_rng(11)
    n, e = 3, 5
    src, dst = (torch.as_tensor(a, device=DEVICE) for a in graph(rng, n, e))
    x, y, w = tensors(ir, rng, n, e)
    gout = torch.tensor(rng.standard_normal((n, ir.dim_out)), device=DEVICE)
    assert conv.DETERMINISTIC

    def run():
        out = conv.conv(x, y, w, src, dst, n)
        yy, ww = y.clone().requires_grad_(), w.clone().requires_grad_()
        out2 = conv.conv(x, yy, ww, src, dst, n)
        return (out, out2.detach(), *torch.autograd.grad(out2, (yy, ww), gout))

    log = track(conv, monkeypatch)
    with _off():
        want = run()
    assert "direct" not in " ".join(log) and "function" not in " ".join(log)
    log.clear()
    got = run()
    assert "custom" not in " ".join(log)
    assert log[0] == "direct:conv_fwd" and "function:conv_fwd" in log and "direct:conv_bwd_y" in log
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_conv_forces_then_weight_gradient_through_the_fast_path(pkgs, fast, monkeypatch):
    """Second order (forces via edge_attr, then d/dW) through Functions only, against the custom ops."""
    conv, ir = pkgs["tc_det_shared"]
    rng = np.random.default_rng(12)
    n, e = 3, 5
    src, dst = (torch.as_tensor(a, device=DEVICE) for a in graph(rng, n, e))
    x, y, w = tensors(ir, rng, n, e)

    def run():
        yy, ww = y.clone().requires_grad_(), w.clone().requires_grad_()
        energy = conv.conv(x, yy, ww, src, dst, n).square().sum()
        (force,) = torch.autograd.grad(energy, yy, create_graph=True)
        return torch.autograd.grad(force.square().sum(), ww)[0]

    log = track(conv, monkeypatch)
    got = run()
    assert log and "custom" not in " ".join(log)
    with _off():
        want = run()
    assert torch.equal(got, want)


def test_conv_errors_are_the_custom_paths(pkgs, fast):
    conv, ir = pkgs["tc_atomic"]
    rng = np.random.default_rng(4)
    n, e = 4, 6
    src, dst = (torch.as_tensor(a, device=DEVICE) for a in graph(rng, n, e))
    x, y, w = tensors(ir, rng, n, e)
    conv.conv(x, y, w, src, dst, n)
    bad_src = src.clone()
    bad_src[2] = n
    cases = {
        "range": (x, y, w, bad_src, dst, n),
        "negative": (x, y, w, src, -dst - 1, n),
        "num_nodes": (x, y, w, src, dst, n - 1),
        "float num_nodes": (x, y, w, src, dst, float(n)),
        "bool num_nodes": (x, y, w, src, dst, True),
        "edge_attr": (x, y[:-1], w, src, dst, n),
        "weights": (x, y, w[:-1], src, dst, n),
        "src dtype": (x, y, w, src.double(), dst, n),
    }
    for why, args in cases.items():
        got = []
        for enabled in (False, True, True):
            with _Setting(enabled), pytest.raises((TypeError, ValueError)) as info:
                conv.conv(*args)
            got.append((type(info.value), str(info.value)))
        assert got[0] == got[1] == got[2], why
