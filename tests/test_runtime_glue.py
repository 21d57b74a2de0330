"""The runtime and the generated glue around it (``eqdsl/runtime``, ``torch_ops.py``,
``torch_conv.py``, ``jax_ops.py``): one direction of imports, thin generated modules that
bind metadata and kernels to the runtime, and the public API they expose (operator
schemas, entry-point signatures), which users and compiled graphs depend on."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from genutil import build_package

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "eqdsl" / "runtime"

# channelwise (fused backward), per-edge weights, mul_ir (the conv converts layouts), a
# segment-reduced forward (graph tensors beyond src/dst)
SPEC = """
[[tensor_product]]
name = "rg"
irreps_in1 = "2x0e+2x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
reduce = "mean"

[tensor_product.tuning.conv_fwd]
segment = 1
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """``(module imported, name imported or None)`` of each import in ``path``, absolute."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                yield base, alias.name


def test_runtime_imports_flow_one_way():
    """The runtime imports no code generation, no private name of another module, and its
    modules import each other without a cycle."""
    modules = {_module_name(p): p for p in RUNTIME.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for module, imported in _imports(path):
            assert not module.startswith(("eqdsl.codegen", "eqdsl.backends")), (name, module)
            if module.startswith("eqdsl") and imported is not None:
                assert not imported.startswith("_"), f"{name} imports {module}.{imported}"
            target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
            if target in modules and target != name:
                deps.add(target)
        graph[name] = deps
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in graph[node]:
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path + [dep])
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert {"eqdsl.runtime.torch.ops", "eqdsl.runtime.jax.ops", "eqdsl.runtime.jax.launch"} <= set(graph)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    return build_package(tmp_path_factory.mktemp("runtime_glue"), "rg", SPEC)


# what each generated module may define itself: kernel launchers and the documented entry points
GLUE_FUNCTIONS = {
    "torch_ops.py": {"tensor_product"},
    "torch_conv.py": {"conv"},
    "jax_ops.py": {"tensor_product", "tensor_product_vjp", "conv", "pad_graph"},
}


@pytest.mark.parametrize("module", sorted(GLUE_FUNCTIONS))
def test_generated_glue_is_thin(pkg, module):
    """A glue module defines launchers (one kernel call each, or the small-graph branch) and
    entry points that delegate to the runtime in one statement; no other function or class."""
    tree = ast.parse((Path(pkg.__file__).parent / module).read_text(encoding="utf-8"))
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not [n.name for n in functions if isinstance(n, ast.ClassDef)]
    launchers = [f for f in functions if f.name.startswith("_launch_")]
    entries = [f for f in functions if not f.name.startswith("_launch_")]
    assert {f.name for f in entries} <= GLUE_FUNCTIONS[module]
    for f in entries:
        body = f.body[1:] if isinstance(f.body[0], ast.Expr) else f.body  # after the docstring
        assert len(body) == 1 and isinstance(body[0], ast.Return), f.name
    for f in launchers:
        calls = [n for n in ast.walk(f) if isinstance(n, ast.Call)]
        assert calls and all(ast.unparse(c.func).startswith(("_k.", "order.numel")) for c in calls), f.name
    assert (module == "jax_ops.py") == (not launchers)  # Pallas kernel sets launch themselves


def test_torch_operator_schemas(pkg):
    """The operators' schemas (names and argument names: ``torch.ops.<ns>.<op>(x1=...)``,
    serialized graphs) are what the generated modules have always defined."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    ops = importlib.import_module(pkg.__name__ + ".torch_ops")
    conv = importlib.import_module(pkg.__name__ + ".torch_conv")
    ns = torch.ops.eqdsl_rg
    tp = "(Tensor x1, Tensor x2, Tensor weights) -> Tensor"
    want = {
        "fwd": tp,
        "bwd_x1": "(Tensor g, Tensor x2, Tensor weights) -> Tensor",
        "bwd_x2": "(Tensor x1, Tensor g, Tensor weights) -> Tensor",
        "bwd_w": "(Tensor x1, Tensor x2, Tensor g) -> Tensor",
        "bwd": "(Tensor x1, Tensor x2, Tensor weights, Tensor g) -> (Tensor, Tensor, Tensor)",
    }
    graph = "Tensor src, Tensor dst, Tensor dst_order, Tensor dst_ptr, SymInt num_nodes"
    want.update({
        "conv_fwd": f"(Tensor x, Tensor y, Tensor weights, {graph}) -> Tensor",
        "conv_bwd_x": f"(Tensor g, Tensor y, Tensor weights, {graph}) -> Tensor",
        "conv_bwd_y": f"(Tensor x, Tensor g, Tensor weights, {graph}) -> Tensor",
        "conv_bwd_w": f"(Tensor x, Tensor y, Tensor g, {graph}) -> Tensor",
        "conv_bwd": f"(Tensor x, Tensor y, Tensor weights, Tensor g, {graph}) -> (Tensor, Tensor, Tensor)",
    })
    for op, schema in want.items():
        module = conv if op.startswith("conv_") else ops
        assert getattr(module, op + "_op") is getattr(ns, op).default
        assert str(getattr(ns, op).default._schema) == f"eqdsl_rg::{op}{schema}"
    assert str(inspect.signature(ops.tensor_product)) == (
        "(x1: torch.Tensor, x2: torch.Tensor, weights: torch.Tensor) -> torch.Tensor")
    assert str(inspect.signature(conv.conv)) == (
        "(node_features: torch.Tensor, edge_attr: torch.Tensor, weights: torch.Tensor, src: torch.Tensor, "
        "dst: torch.Tensor, num_nodes: int, *, check: bool = True) -> torch.Tensor")
    assert ops.conv is conv.conv and conv.SEGMENT_MIN_EDGES == 8192


def test_jax_entry_point_signatures(pkg):
    pytest.importorskip("jax")
    ops = importlib.import_module(pkg.__name__ + ".jax_ops")
    assert str(inspect.signature(ops.tensor_product)) == (
        "(x1, x2, weights, *, interpret: 'bool | None' = None, block_batch: 'int | None' = None)")
    assert str(inspect.signature(ops.tensor_product_vjp)) == (
        "(x1, x2, weights, grad_out, *, interpret: 'bool | None' = None, block_batch: 'int | None' = None)")
    assert str(inspect.signature(ops.conv)) == (
        "(node_features, edge_attr, weights, src, dst, num_nodes: 'int', *, check: 'bool' = True, "
        "interpret: 'bool | None' = None, block_edges: 'int | None' = None, segment_edges: 'int | None' = None)")
    assert ops.KERNEL_OPS.bwd is not None and ops.CONV_OPS is not None  # channelwise: fused backward wired
