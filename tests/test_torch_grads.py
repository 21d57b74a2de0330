"""Gradients of the generated PyTorch ops, to second order and beyond (CPU: Triton's interpreter).

The tensor product is ``dF/dg`` of ``F(x1, x2, W, g) = sum W C x1 x2 g``; each package
has four custom ops (``fwd``, ``bwd_x1``, ``bwd_x2``, ``bwd_w``) on rows in ``KERNEL_LAYOUT``,
each the derivative of ``F`` with respect to one argument and differentiable through
the others. Checked here:

* each kernel against the numpy oracle (``tensor_product_reference`` /
  ``tensor_product_vjp_reference``), float64 to 1e-10 and float32 to 1e-5 relative, for
  every mode, both layouts, shared and per-batch weights, unweighted paths, a user path
  weight, mixed multiplicities, batch sizes that are not a multiple of any tile (and,
  with shared weights, more than one partial-sum program);
* the ``*_lin`` kernels (weighted paths only: unweighted paths make ``F`` affine in
  ``W``, and the derivatives of ``bwd_w`` must leave them out) against the oracle of
  the weighted paths;
* autograd through ``tensor_product`` (layout conversion included) against the oracle,
  third derivatives against e3nn, and ``gradcheck`` / ``gradgradcheck`` in float64 on
  fixed and hypothesis-drawn specs;
* ``torch.library.opcheck`` of the four ops and of the layout op;
* no recompilation for a new batch size, in any kernel.

Each (spec, dtype) compiles four kernels once (a few seconds each in the interpreter),
so the specs are small, built once per session and shared. GPU tests (``-m gpu``)
compare all four kernels with the oracle for every example spec.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")
o3 = pytest.importorskip("e3nn.o3")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from eqdsl.codegen.generate import generate_files, write_package  # noqa: E402
from eqdsl.lower import lower  # noqa: E402
from eqdsl.reference import tensor_product_reference, tensor_product_vjp_reference, to_layout  # noqa: E402
from eqdsl.spec import load_spec  # noqa: E402
from test_torch_ops import build, e3nn_tp, random_specs, spec_text  # noqa: E402
from tolerances import REL_TOL  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
EXAMPLES = [p for p in sorted((Path(__file__).resolve().parents[1] / "examples" / "specs").glob("*.toml"))
            if load_spec(p)]  # tensor products
TOL = {getattr(torch, name): tol for name, tol in REL_TOL.items()}  # tests/tolerances.py
_counter = itertools.count()

# Every mode; an unweighted uvu (its dx2 reduces over the channel x1 and g share) and
# uvv (dx1: the same); a user path weight; uvw reducing over x2 (3 > 2: a masked tile)
# and over x1 (1 >= 1); several paths into one output block; two output blocks of one
# irrep; an output block that differs between layouts (2x1e). Multiplicities stay
# small: each kernel compiles in a few seconds.
MODES_INSTRUCTIONS = [
    (0, 0, 0, "uvw", True, None),
    (1, 1, 4, "uvw", True, None),
    (0, 1, 1, "uvv", True, None),
    (1, 0, 1, "uvw", True, 0.5),
    (1, 0, 2, "uvu", False, None),
    (0, 1, 2, "uvv", False, None),
    (1, 1, 3, "uuu", True, None),
]
IRREPS = dict(in1="2x0e+1x1o", in2="3x0e+1x1o", out="1x0e+1x1o+1x1o+1x1e+2x1e")
FIXED = {
    # shared weights, e3nn's layout
    "shared_mul_ir": dict(IRREPS, instructions=MODES_INSTRUCTIONS, shared=True, layout="mul_ir"),
    # per-batch weights, channel-innermost layout, norm / path normalizations
    "batch_ir_mul": dict(IRREPS, instructions=MODES_INSTRUCTIONS, shared=False, layout="ir_mul",
                         irrep_norm="norm", path_norm="path"),
}
# 19 rows: 16 + 3 (and 4 x 4 + 3 for kernels with 3-D tiles); 70 rows with shared
# weights: two partial-sum programs of 64 rows, the second partial.
BATCH = {"shared_mul_ir": 70, "batch_ir_mul": 19}
_built: dict[str, tuple] = {}


@pytest.fixture(scope="session")
def grad_root(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_grads")


def fixed(key: str, root: Path):
    if key not in _built:
        kw = dict(FIXED[key])
        name = f"tg_{key}"
        pkg, ops = build(root / key, spec_text(name, kw.pop("in1"), kw.pop("in2"), kw.pop("out"), **kw), name)
        ir = lower(load_spec(root / key / f"{name}.toml")[0])
        _built[key] = (pkg, ops, ir)
    return _built[key]


# ---------------------------------------------------------------- helpers


def numpy_inputs(ir, batch: int, seed: int = 0):
    """float64 x1, x2, weights, g (cotangent of out) in the IR's layout."""
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((batch, ir.dim_in1))
    x2 = rng.standard_normal((batch, ir.dim_in2))
    w = rng.standard_normal((ir.weight_numel,) if ir.shared_weights else (batch, ir.weight_numel))
    g = rng.standard_normal((batch, ir.dim_out))
    return x1, x2, w, g


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    if want.size == 0:
        return 0.0
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1.0))


def weighted_only(ir):
    """The IR of ``F_W``: the weighted paths alone (what the ``*_lin`` kernels compute)."""
    return dataclasses.replace(ir, paths=tuple(p for p in ir.paths if p.has_weight))


KERNEL_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")


def kernel_results(ir, ops, x1, x2, w, g, dtype, device=DEVICE, lin=False, names=KERNEL_OPS):
    """The kernel ops ``names`` (``*_lin`` if ``lin``) on rows in their layout; results in the
    IR's layout, float64 numpy, as a tuple in the order of ``names``."""
    kl = ops.KERNEL_LAYOUT

    def t(a, blocks):
        a = to_layout(a, blocks, ir.layout, kl) if blocks is not None else a
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    def back(r, blocks):
        assert r.dtype == dtype
        r = r.detach().double().cpu().numpy()
        return to_layout(r, blocks, kl, ir.layout) if blocks is not None else r

    a, b, c, wt = t(x1, ir.in1), t(x2, ir.in2), t(g, ir.out), t(w, None)
    sfx = "_lin" if lin else ""
    run = {
        "fwd": lambda: back(getattr(ops, f"fwd{sfx}_op")(a, b, wt), ir.out),
        "bwd_x1": lambda: back(getattr(ops, f"bwd_x1{sfx}_op")(c, b, wt), ir.in1),
        "bwd_x2": lambda: back(getattr(ops, f"bwd_x2{sfx}_op")(a, c, wt), ir.in2),
        "bwd_w": lambda: back(ops.bwd_w_op(a, b, c), None),
    }
    return tuple(run[n]() for n in names)


def check_kernels(ir, ops, dtype, batch, seed=0, device=DEVICE, lin=False, names=KERNEL_OPS) -> float:
    """The kernels ``names`` (default all four) against the oracle; with ``lin`` the ``*_lin``
    ones against ``F_W``'s."""
    x1, x2, w, g = numpy_inputs(ir, batch, seed)
    ref_ir = weighted_only(ir) if lin else ir
    want = dict(zip(KERNEL_OPS, (tensor_product_reference(ref_ir, x1, x2, w),
                                 *tensor_product_vjp_reference(ref_ir, x1, x2, w, g))))
    got = kernel_results(ir, ops, x1, x2, w, g, dtype, device, lin, names)
    errs = {}
    for name, a in zip(names, got):
        b = want[name]
        assert a.shape == b.shape, (name, a.shape, b.shape)
        errs[name] = rel_err(a, b)
    assert max(errs.values()) <= TOL[dtype], f"{ir.name} {dtype} batch {batch} lin={lin}: {errs}"
    return max(errs.values())


def torch_inputs(ir, batch, seed=0, dtype=torch.float64, device=DEVICE):
    return tuple(torch.from_numpy(a).to(device=device, dtype=dtype) for a in numpy_inputs(ir, batch, seed))


# ---------------------------------------------------------------- kernels vs the oracle


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("key", sorted(FIXED))
def test_kernels_match_reference(key, dtype, grad_root):
    pkg, ops, ir = fixed(key, grad_root)
    # the 70 rows of shared weights are for bwd_w's partial sums alone; the row-tiled
    # kernels take 19 (several tiles, the last partial, as with per-batch weights): the
    # interpreter's time grows with the programs (5 tiles of 16 rows at 70, 2 at 19)
    rows = BATCH["batch_ir_mul"]
    if ir.shared_weights:
        check_kernels(ir, ops, dtype, rows, names=("fwd", "bwd_x1", "bwd_x2"))
        check_kernels(ir, ops, dtype, BATCH[key], names=("bwd_w",))
    else:
        check_kernels(ir, ops, dtype, rows)
    if dtype == torch.float64:  # the weighted-only kernels (same generator; float64 suffices)
        check_kernels(ir, ops, dtype, rows, lin=True)


def test_autograd_matches_reference(grad_root):
    """First derivatives through ``tensor_product`` (layout conversion included)."""
    for key in sorted(FIXED):
        pkg, ops, ir = fixed(key, grad_root)
        x1, x2, w, g = torch_inputs(ir, BATCH[key], seed=1)
        x1, x2, w = (t.requires_grad_() for t in (x1, x2, w))
        out = ops.tensor_product(x1, x2, w)
        got = torch.autograd.grad(out, (x1, x2, w), g)
        want = tensor_product_vjp_reference(ir, *(t.detach().cpu().numpy() for t in (x1, x2, w, g)))
        for a, b in zip(got, want):
            assert rel_err(a.cpu().numpy(), b) <= 1e-10, key


def test_only_needed_gradients_are_computed(grad_root, monkeypatch):
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, _ = torch_inputs(ir, 5, seed=2)
    x2.requires_grad_()
    called = []
    for name in ("bwd_x1", "bwd_x2", "bwd_w"):
        real = getattr(ops, f"_launch_{name}")
        monkeypatch.setattr(ops, f"_launch_{name}", lambda *a, _n=name, _r=real: (called.append(_n), _r(*a)))
    ops.tensor_product(x1, x2, w).sum().backward()
    assert called == ["bwd_x2"]


def test_third_derivatives_match_e3nn(grad_root):
    """Two chains of three derivatives of ``<c, TP>``, against e3nn.

    d/dx1 -> d/dx2 -> d/dW runs fwd -> bwd_x1 -> bwd_x2 -> bwd_w; d/dW -> d/dx2 -> d/dx1
    runs fwd -> bwd_w -> bwd_x2_lin -> bwd_x1_lin (the spec has unweighted paths, which
    must not contribute once a weight cotangent stands in for the weights).
    """
    pkg, ops, ir = fixed("shared_mul_ir", grad_root)
    x1, x2, w, c = torch_inputs(ir, 7, seed=3)
    rng = torch.Generator().manual_seed(0)
    d1, d2, dw = (torch.randn(t.shape, generator=rng, dtype=torch.float64).to(DEVICE) for t in (x1, x2, w))

    def chains(tp):
        a, b, ww = (t.clone().requires_grad_() for t in (x1, x2, w))
        (g1,) = torch.autograd.grad((tp(a, b, ww) * c).sum(), a, create_graph=True)
        (g2,) = torch.autograd.grad((g1 * d1).sum(), b, create_graph=True)
        (g3,) = torch.autograd.grad((g2 * d2).sum(), ww)
        a, b, ww = (t.clone().requires_grad_() for t in (x1, x2, w))
        (h1,) = torch.autograd.grad((tp(a, b, ww) * c).sum(), ww, create_graph=True)
        (h2,) = torch.autograd.grad((h1 * dw).sum(), b, create_graph=True)
        (h3,) = torch.autograd.grad((h2 * d2).sum(), a)
        return g3, h3

    got, want = chains(ops.tensor_product), chains(e3nn_tp(pkg).to(DEVICE))
    for a, b in zip(got, want):
        assert rel_err(a.cpu().numpy(), b.cpu().numpy()) <= 1e-10


def test_gradcheck_and_gradgradcheck(grad_root):
    # (shared weights: the third derivatives above, exactly against e3nn; and the random specs)
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, _ = torch_inputs(ir, 3, seed=4)
    args = tuple(t.requires_grad_() for t in (x1, x2, w))
    assert torch.autograd.gradcheck(ops.tensor_product, args, fast_mode=True)
    assert torch.autograd.gradgradcheck(ops.tensor_product, args, fast_mode=True)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kw=random_specs(max_l=2, max_mul=2, max_instructions=2))
def test_random_specs_gradcheck(kw, tmp_path_factory):
    name = f"tg_random_{next(_counter)}"
    root = tmp_path_factory.mktemp("grad_random")
    pkg, ops = build(root, spec_text(name, kw.pop("in1"), kw.pop("in2"), kw.pop("out"), **kw), name)
    ir = lower(load_spec(root / f"{name}.toml")[0])
    check_kernels(ir, ops, torch.float64, 5, seed=5)
    if hasattr(ops, "fwd_lin_op"):
        check_kernels(ir, ops, torch.float64, 5, seed=5, lin=True)
    x1, x2, w, _ = torch_inputs(ir, 2, seed=6)
    if ir.weight_numel:
        f, args = ops.tensor_product, (x1, x2, w)
    else:  # every path unweighted: no weight gradient, and gradcheck refuses empty (stride-0) inputs
        f, args = (lambda a, b: ops.tensor_product(a, b, w)), (x1, x2)
    args = tuple(t.requires_grad_() for t in args)
    assert torch.autograd.gradcheck(f, args, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, args, fast_mode=True)


def test_gradcheck_without_weights(tmp_path):
    """Every path unweighted (weight_numel == 0; the spec hypothesis drew in a CI-like run):
    first and second derivatives with respect to both inputs."""
    name = "tg_no_weights"
    text = spec_text(name, "1x0e+2x0e", "1x0e+1x0e", "2x0e+1x0e", shared=False, layout="ir_mul",
                     instructions=[(1, 0, 0, "uvu", False, None), (0, 1, 1, "uuu", False, 0.5)])
    pkg, ops = build(tmp_path, text, name)
    ir = lower(load_spec(tmp_path / f"{name}.toml")[0])
    assert ir.weight_numel == 0
    check_kernels(ir, ops, torch.float64, 5, seed=5)
    x1, x2, w, _ = torch_inputs(ir, 2, seed=6)
    args = (x1.requires_grad_(), x2.requires_grad_())
    f = lambda a, b: ops.tensor_product(a, b, w)  # noqa: E731
    assert torch.autograd.gradcheck(f, args, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, args, fast_mode=True)


# ---------------------------------------------------------------- ops


def test_opcheck(grad_root):
    pkg, ops, ir = fixed("shared_mul_ir", grad_root)
    x1, x2, w, g = torch_inputs(ir, 3, seed=7)
    ns = getattr(torch.ops, f"eqdsl_{ir.name}")
    for op, args in (
        (ns.fwd, (x1, x2, w)),
        (ns.bwd_x1, (g, x2, w)),
        (ns.bwd_x2, (x1, g, w)),
        (ns.bwd_w, (x1, x2, g)),
    ):
        args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(op, args)


def test_ops_reject_bad_operands(grad_root):
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    x1, x2, w, g = torch_inputs(ir, 4, seed=8)
    with pytest.raises(ValueError, match=rf"bwd_x1: g must have shape \(4, {ir.dim_out}\)"):
        ops.bwd_x1_op(g[:, :-1], x2, w)
    with pytest.raises(ValueError, match=rf"bwd_w: x2 must have shape \(4, {ir.dim_in2}\)"):
        ops.bwd_w_op(x1, x2[:3], g)
    with pytest.raises(TypeError, match="share one dtype"):
        ops.bwd_x2_op(x1, g.float(), w)


def test_batch_zero(grad_root):
    for key in sorted(FIXED):
        pkg, ops, ir = fixed(key, grad_root)
        x1, x2, w, g = torch_inputs(ir, 0)
        assert ops.bwd_x1_op(g, x2, w).shape == (0, ir.dim_in1)
        assert ops.bwd_x2_op(x1, g, w).shape == (0, ir.dim_in2)
        gw = ops.bwd_w_op(x1, x2, g)
        assert gw.shape == ((ir.weight_numel,) if ir.shared_weights else (0, ir.weight_numel))
        assert not gw.abs().sum()


def test_new_batch_size_does_not_recompile(grad_root):
    pkg, ops, ir = fixed("batch_ir_mul", grad_root)
    kernels = [getattr(ops._k, n) for n in vars(ops._k) if n.startswith("tp_")]
    assert len(kernels) == 7  # fwd, bwd_x1, bwd_x2, bwd_w and the three *_lin
    for lin in (False, True):
        check_kernels(ir, ops, torch.float64, 19, lin=lin)
    before = [len(k._bound_kernels) for k in kernels]
    for batch in (3, 17):
        for lin in (False, True):
            check_kernels(ir, ops, torch.float64, batch, seed=batch, lin=lin)
    assert [len(k._bound_kernels) for k in kernels] == before


# ---------------------------------------------------------------- GPU (device machine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("op", KERNEL_OPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_all_kernels_on_gpu(spec_path, dtype, op, tmp_path):
    """Each kernel of every example against the oracle on CUDA (one dtype and kernel op per
    test, so the device run can compile them in parallel processes)."""
    out = tmp_path / "gen"
    files = generate_files(spec_path, out, triton=False)
    write_package(out, files)
    sys.path.insert(0, str(out))
    try:
        for spec in load_spec(spec_path):
            ir = lower(spec)
            if spec.name in sys.modules:  # imported by another test of this process
                ops = importlib.import_module(f"{spec.name}.torch_ops")
            else:
                importlib.import_module(spec.name)
                ops = importlib.import_module(f"{spec.name}.torch_ops")
            lins = (False, True) if hasattr(ops, "fwd_lin_op") else (False,)
            errs = [check_kernels(ir, ops, dtype, b, seed=b, device="cuda", lin=lin, names=(op,))
                    for b in (1, 1000, 4099) for lin in lins]
            print(f"{spec.name} {dtype}: max relative error of {op} {max(errs):.3g}")
    finally:
        sys.path.remove(str(out))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("key", sorted(FIXED))
def test_gradgradcheck_on_gpu(key, grad_root):
    pkg, ops, ir = fixed(key, grad_root)
    x1, x2, w, _ = torch_inputs(ir, 37, seed=9, device="cuda")
    args = tuple(t.requires_grad_() for t in (x1, x2, w))
    assert torch.autograd.gradcheck(ops.tensor_product, args, fast_mode=True)
    assert torch.autograd.gradgradcheck(ops.tensor_product, args, fast_mode=True)
    check_kernels(ir, ops, torch.float32, 4099, device="cuda")
    check_kernels(ir, ops, torch.float64, 4099, device="cuda", lin=True)


def test_spec_tuning_table_pins_the_kernels(tmp_path):
    """A ``[tensor_product.tuning]`` table reaches the generated kernels (tile sizes, warps,
    maxnreg) and the tuned kernels still agree with the oracle in all four derivatives."""
    name = "tg_tuned"
    text = spec_text(name, "3x0e+2x1o+1x2e", "0e+1o", "0e+1o+2e", mode="uvu", shared=False) + (
        "[tensor_product.tuning]\nblock_b = 2\nblock_c = 2\nnum_warps = 8\nmaxnreg_partials = 0\n"
        "hoist_weights = 1\nhoist_components = 0\n"
        "[tensor_product.tuning.bwd_x1]\nnum_warps = 2\n"
    )
    pkg, ops = build(tmp_path, text, name)
    ir = lower(load_spec(tmp_path / f"{name}.toml")[0])
    source = (tmp_path / "gen" / name / "helion_kernels.py").read_text()
    assert "block_size=2)" in source and "block_size=16)" not in source
    assert "num_warps=8" in source and "num_warps=4" not in source
    configs = {k: c for c, k in re.findall(r"helion\.Config\((num_warps=\d+)[^)]*\),\n\)\ndef (\w+)\(", source)}
    # (a channelwise spec: the fused backward too, tuned by the top-level table)
    assert {k.rsplit("_", 1)[0] for k in configs} == {"tp_fwd", "tp_bwd_x1", "tp_bwd_x2", "tp_bwd_w", "tp_bwd_fused"}
    # hoist_weights: every weight tile of a forward channel tile is loaded before its first
    # store; without it (the default) some are loaded where first used, after a store
    def first_store(src):
        return min(i for i in (src.find("] = acc"), src.find("hl.store(")) if i >= 0)

    def weight_tiles(src):  # the channel tiles of the forward kernel that load weights
        fwd = src[src.index("def tp_fwd_0("):src.index("@helion.kernel", src.index("def tp_fwd_0("))]
        return [t for t in fwd.split("for tile_c")[1:] if "= weights[" in t]

    assert weight_tiles(source) and all(t.rindex("= weights[") < first_store(t) for t in weight_tiles(source))
    (tmp_path / "plain.toml").write_text(text.replace("hoist_weights = 1\n", ""))
    plain = generate_files(tmp_path / "plain.toml", tmp_path / "plain", triton=False)[f"{name}/helion_kernels.py"]
    assert any(t.rindex("= weights[") > first_store(t) for t in weight_tiles(plain))
    assert all(c == ("num_warps=2" if k.startswith("tp_bwd_x1") else "num_warps=8") for k, c in configs.items())
    assert "TRITON_OPTIONS = {\n}" in source  # maxnreg_partials = 0 turns the bwd_x2 pin off
    for batch in (1, 5):
        check_kernels(ir, ops, torch.float64, batch, seed=batch)


# one channel group of 3 channels (x1 blocks and every output block: 3 channels), a uvw
# path (a tile_r reduction inside the 2-D grid's program) and uvu paths
GRID_C_INSTRUCTIONS = [(0, 0, 0, "uvw", True, None), (1, 1, 0, "uvu", True, None),
                       (1, 0, 1, "uvw", True, None), (0, 1, 1, "uvu", True, None)]


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_channel_grid_axis_matches_reference(layout, tmp_path):
    """``grid_c``: kernels with one channel group of several channel tiles get the channel
    tiles as a second grid axis (``hl.tile([channels, batch])``), the others keep the
    1-D grid; all four derivatives agree with the oracle for a batch (5) that is not a
    multiple of ``block_b`` (4) and a channel count (3) that is not a multiple of
    ``block_c`` (2): partial tiles on both grid axes."""
    name = f"tg_grid_c_{layout}"
    text = spec_text(name, "3x0e+3x1o", "2x0e+1x1o", "3x0e+3x1o", instructions=GRID_C_INSTRUCTIONS,
                     shared=False, layout=layout, dtypes=("float64",))
    pkg, ops = build(tmp_path, text + "[tensor_product.tuning]\nblock_b = 4\nblock_c = 2\n", name)
    ir = lower(load_spec(tmp_path / f"{name}.toml")[0])
    source = (tmp_path / "gen" / name / "helion_kernels.py").read_text()
    grid_2d = "for tile_c, tile_b in hl.tile([3, "
    kernels = dict(chunk.split("(", 1) for chunk in source.split("\ndef ")[1:])
    for kernel in ("tp_fwd_0", "tp_bwd_x1_0", "tp_bwd_w_0"):
        assert grid_2d in kernels[kernel], kernel
        assert "for tile_c in" not in kernels[kernel], kernel
    # x2's blocks have 2 and 1 channels: two channel groups, the channel loops stay
    assert grid_2d not in kernels["tp_bwd_x2_0"] and "for tile_c in hl.tile(2" in kernels["tp_bwd_x2_0"]
    for batch in (5, 1):
        check_kernels(ir, ops, torch.float64, batch, seed=batch)
