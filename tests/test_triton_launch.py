"""The kernels' shipped Triton code (``codegen.triton_lowering``) and its launcher
(``runtime.triton_launch``): the default torch path.

One small package (a uvu product with a fused convolution, float64) is generated with its
Triton code. Through Triton's interpreter, the ops launched from that code give bit for
bit what the same ops give through Helion (``EQDSL_KERNELS=helion``, what the other
tests run), for the forward, gradients, second-order gradients and the conv; a fresh
process runs them without importing Helion; ``eqdsl check`` sees the code fresh and
notices a changed Helion kernel; lowering again gives the same bytes.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")

from eqdsl.codegen import triton_lowering  # noqa: E402
from eqdsl.codegen.generate import check  # noqa: E402
from eqdsl.runtime import triton_launch  # noqa: E402
from genutil import build_package  # noqa: E402

SPEC = """
[[tensor_product]]
name = "tl_small"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
"""


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_launch")
    p = build_package(root, "tl_small", SPEC, triton=True)
    ops = importlib.import_module(p.__name__ + ".torch_ops")
    conv = importlib.import_module(p.__name__ + ".torch_conv")
    return root, ops, conv


def _use(mod, how):
    package = mod.__package__
    source = "helion_conv_kernels" if mod.__name__.endswith("torch_conv") else "helion_kernels"
    if how == "helion":
        mod._k = triton_launch._helion_kernels(package, source)
    else:
        mod._k = _triton_kernels(package, source)


def _triton_kernels(package, source):
    old = os.environ.get("EQDSL_KERNELS")
    os.environ["EQDSL_KERNELS"] = "triton"
    try:
        return triton_launch.kernels(package, source)
    finally:
        if old is None:
            del os.environ["EQDSL_KERNELS"]
        else:
            os.environ["EQDSL_KERNELS"] = old


def _results(ops, conv, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    n, nodes, edges = 5, 4, 9
    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device).requires_grad_()

    x1, x2, w = randn(n, ops.DIM_IN1), randn(n, ops.DIM_IN2), randn(n, ops.WEIGHT_NUMEL)
    out = ops.tensor_product(x1, x2, w)
    grads = torch.autograd.grad((out * out.detach().cumsum(1)).sum(), (x1, x2, w), create_graph=True)
    (second,) = torch.autograd.grad((grads[1] ** 2).sum(), w)
    x, y, we = randn(nodes, conv.DIM_IN1), randn(edges, conv.DIM_IN2), randn(edges, conv.WEIGHT_NUMEL)
    src = torch.randint(0, nodes, (edges,), generator=g).to(device)
    dst = torch.randint(0, nodes, (edges,), generator=g).to(device)
    c = conv.conv(x, y, we, src, dst, nodes)
    cg = torch.autograd.grad(c.square().sum(), (x, y, we))
    return [out, *grads, second, c, *cg]


CUDA = torch.cuda.is_available()


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])],
)
def test_triton_code_gives_helions_bits(pkg, device):
    """On CUDA also twice through the Triton code: the second call finds the variants in
    Triton's cache and must give the same bits."""
    if device == "cpu" and CUDA:
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 (this run compiles for the GPU)")
    _, ops, conv = pkg
    assert (Path(ops.__file__).parent / "triton_kernels" / "tp_fwd_0_float64.py").is_file()
    saved = ops._k, conv._k
    try:
        for mod in (ops, conv):
            _use(mod, "triton")
        assert all(isinstance(k, triton_launch._Kernel) for k in vars(ops._k).values())
        via_triton = _results(ops, conv, device=device)
        runs = [via_triton]
        if device == "cuda":
            runs.append(_results(ops, conv, device=device))
        for mod in (ops, conv):
            _use(mod, "helion")
        via_helion = _results(ops, conv, device=device)
    finally:
        ops._k, conv._k = saved
    for run in runs:
        # the conv's atomics may add in another order on a GPU: its results to rounding there
        for i, (a, b) in enumerate(zip(run, via_helion)):
            if device == "cuda" and i >= 5:
                torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)
            else:
                assert torch.equal(a.detach(), b.detach()), i


def test_runs_without_importing_helion(pkg):
    """A fresh process with the default ``EQDSL_KERNELS`` runs forward, backward and the
    conv from the Triton code and never imports Helion."""
    root, ops, _ = pkg
    code = (
        "import sys, torch\n"
        f"import {ops.__package__}.torch_ops as ops, {ops.__package__}.torch_conv as conv\n"
        "x1 = torch.randn(3, ops.DIM_IN1, dtype=torch.float64, requires_grad=True)\n"
        "x2 = torch.randn(3, ops.DIM_IN2, dtype=torch.float64)\n"
        "w = torch.randn(3, ops.WEIGHT_NUMEL, dtype=torch.float64)\n"
        "ops.tensor_product(x1, x2, w).sum().backward()\n"
        "x = torch.randn(2, conv.DIM_IN1, dtype=torch.float64)\n"
        "i = torch.tensor([0, 1, 1])\n"
        "conv.conv(x, x2, w, i, i, 2)\n"
        "bad = sorted(m for m in sys.modules if m == 'helion' or m.startswith('helion.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EQDSL_KERNELS"}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(root) + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_check_sees_the_triton_code_and_its_staleness(pkg, tmp_path, monkeypatch):
    root, ops, _ = pkg
    spec, out = root / "tl_small.toml", root / "pkg_tl_small"
    assert check([spec], out) == []
    monkeypatch.setenv("EQDSL_CACHE_DIR", str(tmp_path / "empty_cache"))  # no lowered code to reuse
    assert check([spec], out, full=True) == []  # lowered again, in another process: the same bytes
    assert len(list((tmp_path / "empty_cache" / "lowered").glob("*.py"))) == 10  # 10 kernels, float64
    monkeypatch.undo()
    module = Path(ops.__file__).parent / "triton_kernels" / "tp_fwd_0_float64.py"
    text = module.read_text()
    lines = text.splitlines(True)
    module.write_text("".join(lines[:2] + [lines[2].replace("sha256 ", "sha256 0")] + lines[3:]))
    try:
        problems = check([spec], out)
        assert len(problems) == 1 and "tp_fwd_0_float64.py: stale" in problems[0]
    finally:
        module.write_text(text)


def test_launch_override_records_instead_of_launching(pkg):
    _, ops, _ = pkg
    saved = ops._k
    seen = []
    try:
        _use(ops, "triton")
        x1 = torch.randn(4, ops.DIM_IN1, dtype=torch.float64)
        x2 = torch.randn(4, ops.DIM_IN2, dtype=torch.float64)
        w = torch.randn(4, ops.WEIGHT_NUMEL, dtype=torch.float64)
        out = torch.full((4, ops.DIM_OUT), 7.0, dtype=torch.float64)
        with triton_launch.launch_override(lambda fn, grid, args, options: seen.append((fn, grid, args, options))):
            ops._k.tp_fwd_0(x1, x2, w, out)
    finally:
        ops._k = saved
    assert len(seen) == 1
    fn, grid, args, options = seen[0]
    assert args[:4] == (x1, x2, w, out) and isinstance(grid, tuple)
    assert options["num_warps"] >= 1 and "num_stages" in options
    assert bool((out == 7.0).all())  # nothing ran


def test_refuses_operands_beyond_32_bit_indexing(pkg):
    _, ops, _ = pkg
    k = _triton_kernels(ops.__package__, "helion_kernels").tp_fwd_0
    rows = 2**31 // ops.DIM_IN1 + 1
    big = torch.zeros(1, 1, dtype=torch.float64).expand(rows, ops.DIM_IN1)  # > 2**31 elements, no memory
    small = [torch.zeros(1, 1, dtype=torch.float64).expand(rows, d) for d in (ops.DIM_IN2, ops.WEIGHT_NUMEL, ops.DIM_OUT)]
    with pytest.raises(ValueError, match="tp_fwd_0: an operand has .* 32-bit indexing"):
        k(big, *small)


_HELION_IMPORT = "from helion.runtime import default_launcher as _default_launcher\n"


@pytest.mark.parametrize(
    "snippet, message",
    [
        ("import helion.language as hl\ndef k(x, *, _launcher=None):\n    pass\n", "imports 'import helion.language as hl'"),
        ("from torch._inductor.runtime import triton_helpers\ndef k(x, *, _launcher=None):\n    pass\n", "imports"),
        (_HELION_IMPORT + "def other(x, *, _launcher=_default_launcher):\n    pass\n", "no host function k"),
        (_HELION_IMPORT + "def k(x, *, grid=None, _launcher=_default_launcher):\n    pass\n", "keywords"),
        # a keyword that does not default to Helion's launcher is not taken for it
        (_HELION_IMPORT + "def k(x, *, _launcher=None):\n    pass\n", "expected one defaulting to Helion's launcher"),
        (_HELION_IMPORT + "def k(x, *, go=_default_launcher):\n    launcher = 1\n", "already uses the name 'launcher'"),
        (_HELION_IMPORT + "def k(x, *, go=_default_launcher):\n    go(_default_launcher)\n", "uses \\['_default_launcher'\\]"),
    ],
)
def test_restructure_refuses_what_needs_helion(snippet, message):
    with pytest.raises(triton_lowering.LoweringError, match=message):
        triton_lowering._restructure(snippet, "k", {})


@pytest.mark.parametrize("name", ["_launcher", "launch_fn"])
def test_restructure_is_structural(name):
    """Helion's keyword, whatever Helion names it, becomes the required ``launcher``."""
    code = (
        "from __future__ import annotations\nimport torch\nimport triton\n" + _HELION_IMPORT
        + f"def k(x: torch.Tensor, *, {name}=_default_launcher):\n    {name}(k, (1,), x, num_warps=4, num_stages=1)\n"
    )
    out = triton_lowering._restructure(code, "k", {"maxnreg": 256})
    assert "helion" not in out and name not in out
    ns: dict = {}
    exec(out, ns)
    calls = []
    ns["k"](torch.zeros(1), **{triton_lowering.LAUNCHER: lambda *a, **kw: calls.append((a, kw))})
    assert calls and calls[0][1] == {"num_warps": 4, "num_stages": 1}
    assert ns["TRITON_OPTIONS"] == {"maxnreg": 256}
    with pytest.raises(TypeError):
        ns["k"](torch.zeros(1))  # the launcher is required
