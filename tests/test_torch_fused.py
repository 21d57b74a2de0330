"""The fused backward of channelwise products (``eqdsl.backends.helion.fused``; CPU: Triton's interpreter).

``bwd_op(x1, x2, w, g)`` must equal the float64 oracle (``tensor_product_vjp_reference``,
what ``bwd_x1``, ``bwd_x2`` and ``bwd_w`` are checked against) for every kernel shape the generator makes: one
kernel with a channel loop per multiplicity (mixed multiplicities), several kernels
(``max_terms``) whose ``gx2`` partial sums the op adds, channel tiles as a grid axis
(``grid_c``, one partial-sum row per tile), and both layouts; and the atomic
convolution's (``eqdsl.backends.helion.conv.fused_conv_kernels``) against ``conv_vjp_reference``. Autograd must take it when
two or more gradients are needed and not otherwise, and its own derivative (forces, then
their gradient) must pass ``gradgradcheck`` and match e3nn.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")
pytest.importorskip("e3nn.o3")

from eqdsl.analysis import fused_bwd_reason  # noqa: E402
from eqdsl.backends.helion.fused import FUSED_MODES, fused_bwd_kernels  # noqa: E402
from eqdsl.backends.helion.tuning import tuning_for  # noqa: E402
from eqdsl.lower import lower  # noqa: E402
from eqdsl.reference import conv_vjp_reference, tensor_product_vjp_reference  # noqa: E402
from eqdsl.spec import load_spec, parse_spec  # noqa: E402
from genutil import build_package  # noqa: E402
from test_torch_grads import DEVICE, rel_err, torch_inputs  # noqa: E402
from test_torch_ops import build, e3nn_tp, spec_text  # noqa: E402

# mixed multiplicities (4 and 2 channels); x2 of one channel per irrep, as MACE / NequIP
IN1, IN2, OUT = "4x0e+4x1o+2x2e", "0e+1o+2e", "0e+1o+2e"
TUNINGS = {
    # one kernel, one channel tile per multiplicity: gx2 written directly
    "one_kernel": "",
    # several kernels (by x1 block); 2-channel tiles: the 4-channel blocks' tiles are a grid axis
    "split_grid_c": "max_terms = 16\nblock_c = 2\n",
    # the same tiles as a loop in each program, partial sums carried across it
    "split_loop": "max_terms = 16\nblock_c = 2\ngrid_c = 0\n",
}
# uvw (DiffDock, e3tools): each path's (rows, u, w) weight tiles in a loop over the output
# channel w; 3 and 2 output channels in tiles of 2 (a masked last tile)
UVW_OUT = "3x0e+2x1o+3x2e"
UVW_TUNINGS = {
    "uvw_one_kernel": "",
    "uvw_split_grid_c": "max_terms = 16\nblock_c = 2\nblock_r = 2\n",
    "uvw_split_loop": "max_terms = 16\nblock_c = 2\nblock_r = 2\ngrid_c = 0\n",
}
BATCH = 19  # not a multiple of any block_b
_built: dict = {}


def package(key: str, root, layout: str = "mul_ir"):
    k = (key, layout)
    if k not in _built:
        name = f"tf_{key}_{layout}"
        uvw = key in UVW_TUNINGS
        text = spec_text(name, IN1, IN2, UVW_OUT if uvw else OUT, mode="uvw" if uvw else "uvu", shared=False,
                         layout=layout, dtypes=("float64",))
        tuning = {**TUNINGS, **UVW_TUNINGS}[key]
        if tuning:
            text += "\n[tensor_product.tuning.bwd]\n" + tuning
        pkg, ops = build(root / name, text, name)
        ir = lower(load_spec(root / name / f"{name}.toml")[0])
        _built[k] = (pkg, ops, ir)
    return _built[k]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_fused")


def test_generator_makes_each_shape():
    """The tunings above do give one kernel, several, grid and loop partial sums (else the
    numeric tests below would not cover them)."""
    ir = lower(parse_spec(spec_text("s", IN1, IN2, OUT, mode="uvu", shared=False), "s.toml")[0])
    shapes = {}
    for key, extra in TUNINGS.items():
        pairs = tuple(("bwd." + k, int(v)) for k, v in (line.split(" = ") for line in extra.splitlines()))
        ks = fused_bwd_kernels(ir, tuning_for(pairs, "bwd"), native=True)
        shapes[key] = [(k["grid_c"], k["parts"], len(k["channel_groups"])) for k in ks]
    assert shapes["one_kernel"] == [(False, 1, 2)]
    assert len(shapes["split_grid_c"]) > 1 and (True, 2, 1) in shapes["split_grid_c"]
    assert len(shapes["split_loop"]) > 1 and all(not g for g, _, _ in shapes["split_loop"])


@pytest.mark.parametrize("key,layout", [(k, "mul_ir") for k in {**TUNINGS, **UVW_TUNINGS}]
                         + [("split_grid_c", "ir_mul"), ("uvw_split_grid_c", "ir_mul")])
def test_fused_matches_the_oracle(root, key, layout):
    pkg, ops, ir = package(key, root, layout)
    x1, x2, w, g = torch_inputs(ir, BATCH, seed=1)
    got = ops.bwd_op(x1, x2, w, g)
    want = tensor_product_vjp_reference(ir, *(t.cpu().numpy() for t in (x1, x2, w, g)))
    for a, b in zip(got, want):
        assert rel_err(a.cpu().numpy(), b) <= 1e-10


def test_autograd_takes_the_fused_op_when_two_gradients_are_needed(root, monkeypatch):
    pkg, ops, ir = package("one_kernel", root)
    called = []
    for name in ("bwd", "bwd_x1", "bwd_x2", "bwd_w"):
        real = getattr(ops, f"_launch_{name}")
        monkeypatch.setattr(ops, f"_launch_{name}", lambda *a, _n=name, _r=real: (called.append(_n), _r(*a)))
    x1, x2, w, g = torch_inputs(ir, 5, seed=2)
    for needed, launched in (((0, 1, 2), ["bwd"]), ((0, 2), ["bwd"]), ((1,), ["bwd_x2"]), ((2,), ["bwd_w"])):
        called.clear()
        args = [t.clone().requires_grad_(i in needed) for i, t in enumerate((x1, x2, w))]
        grads = torch.autograd.grad(ops.tensor_product(*args), [args[i] for i in needed], g)
        assert called == launched, needed
        want = tensor_product_vjp_reference(ir, *(t.cpu().numpy() for t in (x1, x2, w, g)))
        for i, got in zip(needed, grads):
            assert rel_err(got.cpu().numpy(), want[i]) <= 1e-10


def test_batch_zero_and_bad_operands(root):
    pkg, ops, ir = package("split_grid_c", root)
    x1, x2, w, g = torch_inputs(ir, 0)
    assert [t.shape for t in ops.bwd_op(x1, x2, w, g)] == [(0, ir.dim_in1), (0, ir.dim_in2), (0, ir.weight_numel)]
    x1, x2, w, g = torch_inputs(ir, 4)
    with pytest.raises(ValueError, match=rf"bwd: g must have shape \(4, {ir.dim_out}\)"):
        ops.bwd_op(x1, x2, w, g[:, 1:])


@pytest.mark.parametrize("key", ["one_kernel", "uvw_one_kernel"])
def test_second_order_through_the_fused_op(root, key):
    """Gradients of all three first derivatives (each term of the fused op's own
    derivative: the three ops' formulas summed), against e3nn."""
    pkg, ops, ir = package(key, root)
    x1, x2, w, c = torch_inputs(ir, 3, seed=3)
    gen = torch.Generator().manual_seed(4)
    d1, d2, dw = (torch.randn(t.shape, dtype=torch.float64, generator=gen).to(DEVICE) for t in (x1, x2, w))

    def second(tp):
        a, b, ww, cc = (t.clone().requires_grad_() for t in (x1, x2, w, c))
        g1, g2, gw = torch.autograd.grad((tp(a, b, ww) * cc).sum(), (a, b, ww), create_graph=True)
        return torch.autograd.grad((g1 * d1).sum() + (g2 * d2).sum() + (gw * dw).sum(), (a, b, ww, cc))

    for got, want in zip(second(ops.tensor_product), second(e3nn_tp(pkg).to(DEVICE))):
        assert rel_err(got.cpu().numpy(), want.cpu().numpy()) <= 1e-10


def test_opcheck(root):
    pkg, ops, ir = package("one_kernel", root)
    x1, x2, w, g = torch_inputs(ir, 3, seed=6)
    args = tuple(t.clone().requires_grad_() for t in (x1, x2, w, g))
    torch.library.opcheck(getattr(torch.ops, f"eqdsl_{ir.name}").bwd, args)


def test_stores_follow_every_load_of_a_tile(root):
    """Triton keeps the program order of loads and stores to tensors it cannot prove
    distinct: a load after a store in a channel tile would wait for it. (``uvw`` paths
    store each weight tile's gradient inside their output-channel loop, by design.)"""
    for key in TUNINGS:
        pkg, ops, ir = package(key, root)
        src = (root / f"tf_{key}_mul_ir" / "gen" / f"tf_{key}_mul_ir" / "helion_kernels.py").read_text()
        for body in re.split(r"\n(?=def )", src):
            if not body.startswith("def tp_bwd_fused_"):
                continue
            for tile in re.split(r"\n\s*for tile_c", body)[1:]:
                lines = tile.splitlines()
                stores = [i for i, line in enumerate(lines) if re.match(r"\s*(hl\.store\(|\w+\[.*\] = )", line)]
                loads = [i for i, line in enumerate(lines) if "hl.load(" in line or re.search(r"= (x1|x2|g|weights)\[", line)]
                assert stores and loads and max(loads) < min(stores), key


@pytest.mark.parametrize("change,reason", [
    ("shared_weights = true", "shared weights"),
    ('mode = "uvw"', "not a weighted uvu path"),
])
def test_not_eligible(change, reason):
    text = spec_text("s", IN1, IN2, OUT, mode="uvu", shared=False)
    key = change.split(" = ")[0]
    text = re.sub(rf"^{key} = .*$", change, text, flags=re.M)
    assert reason in fused_bwd_reason(lower(parse_spec(text, "s.toml")[0]))
    ir = lower(parse_spec(spec_text("s", IN1, "2x0e+1o", OUT, mode="uvu", shared=False), "s.toml")[0])
    assert "not 1" in fused_bwd_reason(ir)
    assert fused_bwd_reason(lower(parse_spec(spec_text("s", IN1, IN2, OUT, mode="uvu", shared=False), "s.toml")[0])) is None
    # the Helion backend's fused kernel also takes uvw paths (the Pallas one does not)
    uvw = lower(parse_spec(spec_text("s", IN1, IN2, UVW_OUT, mode="uvw", shared=False), "s.toml")[0])
    assert "not a weighted uvu path" in fused_bwd_reason(uvw)
    assert fused_bwd_reason(uvw, FUSED_MODES) is None


@pytest.mark.parametrize("mode", ["uvu", "uvw"])
def test_conv_fused_backward(root, monkeypatch, mode):
    """The atomic convolution's fused backward (``x`` gathered by src, ``G`` by dst, ``gx``
    scattered with atomics): against the oracle, taken by autograd, second order (``uvu``;
    the op's derivative is the same formula for ``uvw``)."""
    name = f"tf_conv_{mode}"
    out = UVW_OUT if mode == "uvw" else OUT
    text = spec_text(name, IN1, IN2, out, mode=mode, shared=False, layout="ir_mul", dtypes=("float64",))
    text += 'conv = true\nreduce = "sum"\ndeterministic = false\n'
    split = UVW_TUNINGS["uvw_split_grid_c"] if mode == "uvw" else TUNINGS["split_grid_c"]
    text += "\n[tensor_product.tuning.conv_bwd]\n" + split  # several kernels, grid partials
    pkg = build_package(root, name, text)
    conv = importlib.import_module(pkg.__name__ + ".torch_conv")
    ir = lower(parse_spec(text, f"{name}.toml")[0])
    rng = np.random.default_rng(0)
    n, e = 3, 7
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    s, d = torch.as_tensor(src, device=DEVICE), torch.as_tensor(dst, device=DEVICE)
    x, y, w = (torch.tensor(rng.standard_normal(shape), device=DEVICE)
               for shape in ((n, ir.dim_in1), (e, ir.dim_in2), (e, ir.weight_numel)))
    g = torch.tensor(rng.standard_normal((n, ir.dim_out)), device=DEVICE)
    want = conv_vjp_reference(ir, *(t.cpu().numpy() for t in (x, y, w)), src, dst, n, g.cpu().numpy())
    for got, ref in zip(conv.conv_bwd_op(x, y, w, g, s, d, n), want):
        assert rel_err(got.cpu().numpy(), ref) <= 1e-10

    called = []
    real = conv._launch_bwd
    monkeypatch.setattr(conv, "_launch_bwd", lambda *a: (called.append(1), real(*a)))
    args = [t.clone().requires_grad_() for t in (x, y, w)]
    grads = torch.autograd.grad(conv.conv(*args, s, d, n), args, g)
    assert called
    for got, ref in zip(grads, want):
        assert rel_err(got.cpu().numpy(), ref) <= 1e-10
    if mode == "uvw":
        return
    # second order in edge_attr and weights (force training), through the fused op's formula
    f = lambda y, w: conv.conv(x, y, w, s, d, n)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (args[1].detach().requires_grad_(), args[2].detach().requires_grad_()),
                                        fast_mode=True)
