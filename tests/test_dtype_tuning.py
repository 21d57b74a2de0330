"""Per-dtype tuning of the Helion kernels (``block_b_float64`` and the like in an op's sub-table).

A spec may give one dtype's kernels of an op other blocks and warps than the op's other
dtypes (float64 values take twice the registers). The generator then writes a copy of each
affected kernel, ``<kernel>__<dtype>``, lowers that dtype's Triton code from it under the
kernel's own name, and leaves the ops and their launchers as they are. Checked here: the
spec's refusals, the kernels and Triton code written, that the glue does not change, and
that both dtypes still compute the reference's function through the Triton code and
through Helion (``EQDSL_KERNELS=helion``: the copy is dispatched by dtype).
"""

from __future__ import annotations

import ast
import importlib

import numpy as np
import pytest

from eqdsl.backends import check_tuning
from eqdsl.codegen import triton_lowering
from eqdsl.codegen.generate import generate_files
from eqdsl.errors import SpecError
from eqdsl.lower import lower
from eqdsl.reference import tensor_product_reference
from eqdsl.spec import load_spec, parse_spec

SPEC = """
[[tensor_product]]
name = "{name}"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = {dtypes}
{tuning}
"""
TUNED = """
[tensor_product.tuning.fwd]
block_b = 8
block_b_float64 = 2
num_warps_float64 = 2
"""


def _spec(name="dt_tuned", dtypes='["float32", "float64"]', tuning=TUNED):
    return SPEC.format(name=name, dtypes=dtypes, tuning=tuning)


@pytest.mark.parametrize("tuning, dtypes, message", [
    ("[tensor_product.tuning]\nblock_b_float64 = 2\n", '["float32", "float64"]', "sub-table"),
    ("[tensor_product.tuning.fwd]\nblock_b_float64 = 2\n", '["float32"]', "does not generate float64"),
    ("[tensor_product.tuning.fwd]\nblock_c_float64 = 32\n", '["float32", "float64"]', "unknown key"),
    ("[tensor_product.tuning.fwd]\nblock_b_float64 = 3\n", '["float32", "float64"]', "power of two"),
])
def test_refuses_what_it_cannot_honour(tuning, dtypes, message):
    with pytest.raises(SpecError, match=message) as e:
        for spec in parse_spec(_spec(dtypes=dtypes, tuning=tuning), "demo.toml"):
            check_tuning(spec)  # the backends own the tuning keys: checked before generating
    assert "demo.toml" in str(e.value) and "\n" not in str(e.value)


def _files(tmp_path, tuning, triton=False, name="dt_tuned"):
    path = tmp_path / f"{name}.toml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(_spec(name=name, tuning=tuning))
    return {k.split("/", 1)[1]: v for k, v in generate_files(path, tmp_path / "out", triton=triton).items()}


def _kernel_block(source: str, kernel: str) -> tuple[list[int], list[int]]:
    """The ``block_size`` literals of ``kernel``'s ``hl.tile`` loops, and its ``num_warps``."""
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == kernel)
    sizes = [kw.value.value for n in ast.walk(fn) if isinstance(n, ast.Call)
             for kw in n.keywords if kw.arg == "block_size" and isinstance(kw.value, ast.Constant)]
    warps = [kw.value.value for d in fn.decorator_list for n in ast.walk(d) if isinstance(n, ast.Call)
             for kw in n.keywords if kw.arg == "num_warps"]
    return sizes, warps


def test_writes_a_copy_per_tuned_dtype_and_keeps_the_glue(tmp_path):
    tuned = _files(tmp_path / "a", TUNED)
    plain = _files(tmp_path / "b", "[tensor_product.tuning.fwd]\nblock_b = 8\n")
    source = tuned["helion_kernels.py"]
    names = triton_lowering._helion_names(source)
    assert "tp_fwd_0__float64" in names and not any(n.endswith("__float32") for n in names)
    assert [n for n in names if "__" in n] == ["tp_fwd_0__float64"]  # only the tuned op's kernel
    assert triton_lowering.kernel_names(source) == triton_lowering.kernel_names(plain["helion_kernels.py"])
    # (rows, then the 4-channel tiles) and warps
    assert _kernel_block(source, "tp_fwd_0") == ([8, 4], [4])
    assert _kernel_block(source, "tp_fwd_0__float64") == ([2, 4], [2])
    assert triton_lowering.helion_kernel(source, "tp_fwd_0", "float64") == "tp_fwd_0__float64"
    assert triton_lowering.helion_kernel(source, "tp_fwd_0", "float32") == "tp_fwd_0"
    # the ops, launchers and outputs are every dtype's (the files differ in their header's spec hash only)
    body = lambda text: text.split('"""', 1)[1]  # noqa: E731
    assert body(tuned["torch_ops.py"]) == body(plain["torch_ops.py"])


def test_triton_code_of_each_dtype_and_the_function_it_computes(tmp_path):
    """Lowered: the float64 module comes from the copy, under the kernel's name; through
    Triton's interpreter and through Helion both dtypes compute the reference's product."""
    import torch

    from eqdsl.runtime import triton_launch
    from genutil import build_package

    pkg = build_package(tmp_path, "dt_lowered", _spec(name="dt_lowered"), triton=True)
    directory = tmp_path / "pkg_dt_lowered" / "dt_lowered" / "triton_kernels"
    index = importlib.import_module(pkg.__name__ + ".triton_kernels")
    assert not any("__" in kernel for kernel, _ in index.KERNELS)
    assert "tp_fwd_0__float64" not in index.SOURCES["helion_kernels"]
    for dtype, block in (("float32", 8), ("float64", 2)):
        tree = ast.parse((directory / f"tp_fwd_0_{dtype}.py").read_text())
        hosts = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list]
        assert hosts == ["tp_fwd_0"]
        consts = {t.id: n.value.args[0].value for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Call)
                  and ast.unparse(n.value.func) == "tl.constexpr"}
        assert block in consts.values(), (dtype, consts)

    ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    ir = lower(load_spec(tmp_path / "dt_lowered.toml")[0])
    g = torch.Generator().manual_seed(0)
    saved = ops._k
    try:
        for how in ("triton", "helion"):
            ops._k = (triton_launch._helion_kernels(pkg.__name__, "helion_kernels") if how == "helion"
                      else triton_launch.kernels(pkg.__name__, "helion_kernels"))
            for dtype, rtol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
                x1, x2, w = (torch.randn(11, d, generator=g, dtype=torch.float64).to(dtype)
                             for d in (ops.DIM_IN1, ops.DIM_IN2, ops.WEIGHT_NUMEL))
                ref = tensor_product_reference(ir, x1.double().numpy(), x2.double().numpy(), w.double().numpy())
                out = ops.tensor_product(x1, x2, w)
                np.testing.assert_allclose(out.double().numpy(), ref, rtol=rtol, atol=rtol, err_msg=f"{how} {dtype}")
    finally:
        ops._k = saved
