"""The JAX ops on several devices: batch-sharded ``jax.jit``, ``jax.shard_map``, data parallelism.

Four CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``) exist only if the
flag is set before jax starts, and other test files of a pytest process import jax first:
the checks run in one subprocess (this file run as a script, ``--worker OUT``), which
writes its measurements as JSON; the tests below assert on them. Specs are tiny; XLA
optimizations are off in the worker (interpret-mode compiles dominate).

Checked, against the same op on unsharded inputs (float64; row-local results exact,
sums over devices within 1e-12):

* ``jax.jit`` with inputs sharded over the batch (``Auto`` mesh axes, as
  ``jax.sharding.Mesh`` makes them, and ``Explicit`` ones, ``jax.make_mesh``'s default):
  the compiled HLO has no ``all-gather``; outputs and row gradients are sharded like the
  inputs, shared weights and their gradient replicated (one all-reduce: the psum).
* ``jax.shard_map``: ``tensor_product`` and ``conv``, forward and gradients (interpret mode
  needs ``check_vma=False``, see ``eqdsl.runtime.jax.launch.run``); with the default ``check_vma=True``
  the compiled-kernel route (``interpret=False``) traces and lowers for CUDA (typed
  outputs and cotangents), and interpret mode raises its one-line error.
* ``examples/train_jax_dp.py``: one data-parallel step (``shard_map`` + ``pmean``) equals
  one device over the same graphs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVICES = 4

SHARED = """[[tensor_product]]
name = "sh_shared"
irreps_in1 = "2x0e+1x1o"
irreps_in2 = "0e+1o"
irreps_out = "2x0e+1x1o"
mode = "uvw"
shared_weights = true
dtypes = ["float64"]
conv = true
"""

PER_ROW = """[[tensor_product]]
name = "sh_rows"
irreps_in1 = "2x0e+2x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
dtypes = ["float64"]
conv = true
"""


# ------------------------------------------------------------------ worker (subprocess)


def _worker(out_dir: Path) -> None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={DEVICES}").strip()
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "examples")]
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_disable_most_optimizations", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from genutil import build_package

    res: dict = {"devices": jax.device_count()}
    pkgs = {k: build_package(out_dir / "pkgs", f"sh_{k}", text) for k, text in (("shared", SHARED), ("rows", PER_ROW))}
    ops = {k: __import__(p.__name__ + ".jax_ops", fromlist=["x"]) for k, p in pkgs.items()}
    rng = np.random.default_rng(0)
    batch = 36  # 9 rows per device: each device pads its own rows to the batch block

    def diff(a, b):
        return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))

    def tp_inputs(op):
        x1, x2 = rng.normal(size=(batch, op.DIM_IN1)), rng.normal(size=(batch, op.DIM_IN2))
        w = rng.normal(size=(op.WEIGHT_NUMEL,) if op.SHARED_WEIGHTS else (batch, op.WEIGHT_NUMEL))
        return x1, x2, w

    def fwd_grad(op):
        def f(a, b, c):
            loss = lambda *x: jnp.sum(jnp.sin(op.tensor_product(*x)))  # noqa: E731
            return op.tensor_product(a, b, c), jax.grad(loss, argnums=(0, 1, 2))(a, b, c)

        return f

    # jit with batch-sharded inputs, Auto (both specs) and Explicit (shared weights) axes
    for kind, types, keys in (("auto", AxisType.Auto, ("shared", "rows")), ("explicit", AxisType.Explicit, ("shared",))):
        mesh = jax.make_mesh((DEVICES,), ("b",), axis_types=(types,))
        for key in keys:
            op = ops[key]
            host = tp_inputs(op)
            ref_out, ref_grads = jax.jit(fwd_grad(op))(*host)
            rows = NamedSharding(mesh, P("b", None))
            wsh = NamedSharding(mesh, P()) if op.SHARED_WEIGHTS else rows
            args = [jax.device_put(a, s) for a, s in zip(host, (rows, rows, wsh))]
            f = jax.jit(fwd_grad(op))
            hlo = f.lower(*args).compile().as_text()
            out, grads = f(*args)
            res[f"jit_{kind}_{key}"] = {
                "all_gather": hlo.count("all-gather"), "all_reduce": hlo.count("all-reduce"),
                "out_spec": [str(e) for e in out.sharding.spec],
                "grad_specs": [[str(e) for e in g.sharding.spec] for g in grads],
                "out_diff": diff(out, ref_out), "grad_diffs": [diff(g, r) for g, r in zip(grads, ref_grads)],
            }

    mesh = jax.make_mesh((DEVICES,), ("b",), axis_types=(AxisType.Auto,))

    # shard_map, tensor_product (shared weights: P() in, gradient summed over devices)
    op = ops["shared"]
    host = tp_inputs(op)
    ref_out, ref_grads = jax.jit(fwd_grad(op))(*host)
    tp_map = jax.shard_map(lambda a, b, c: op.tensor_product(a, b, c), mesh=mesh, in_specs=(P("b"), P("b"), P()),
                           out_specs=P("b"), check_vma=False)
    # the gradient of the shard_map'ed op: the replicated weights' gradient summed over devices
    out, grads = jax.jit(lambda *a: (tp_map(*a), jax.grad(lambda *x: jnp.sum(jnp.sin(tp_map(*x))),
                                                          argnums=(0, 1, 2))(*a)))(*host)
    res["shard_map_tp"] = {"out_diff": diff(out, ref_out), "grad_diffs": [diff(g, r) for g, r in zip(grads, ref_grads)]}

    # shard_map, conv: one graph per device (per-edge weights, the fused conv backward)
    op = ops["rows"]
    nodes, edges = 5, 12
    x = rng.normal(size=(DEVICES, nodes, op.DIM_IN1))
    y = rng.normal(size=(DEVICES, edges, op.DIM_IN2))
    w = rng.normal(size=(DEVICES, edges, op.WEIGHT_NUMEL))
    src, dst = rng.integers(0, nodes, size=(2, DEVICES, edges))

    def conv_loss(x, y, w, s, d):
        return jnp.sum(jnp.sin(op.conv(x, y, w, s, d, nodes, check=False)))

    def per_device(x, y, w, s, d):
        value, g = jax.value_and_grad(conv_loss, argnums=(0, 1, 2))(x[0], y[0], w[0], s[0], d[0])
        return value[None], tuple(a[None] for a in g)

    cm = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("b"),) * 5, out_specs=(P("b"), (P("b"),) * 3),
                               check_vma=False))
    values, grads = cm(x, y, w, src, dst)
    one = jax.jit(jax.value_and_grad(conv_loss, argnums=(0, 1, 2)))
    refs = [one(x[i], y[i], w[i], src[i], dst[i]) for i in range(DEVICES)]
    res["shard_map_conv"] = {
        "value_diff": diff(values, [r[0] for r in refs]),
        "grad_diffs": [diff(grads[k], np.stack([r[1][k] for r in refs])) for k in range(3)],
    }

    # shard_map with the default check_vma=True: compiled kernels lower for CUDA; interpret raises
    amesh = jax.sharding.AbstractMesh((DEVICES,), ("b",), axis_types=(AxisType.Auto,))
    tp = ops["shared"]
    sds = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float64)  # noqa: E731
    f = jax.shard_map(lambda a, b, c: jax.lax.psum(jnp.sum(jnp.sin(tp.tensor_product(a, b, c, interpret=False))), "b"),
                      mesh=amesh,
                      in_specs=(P("b"), P("b"), P()), out_specs=P())
    text = jax.jit(jax.grad(f, argnums=(0, 1, 2))).trace(
        sds(batch, tp.DIM_IN1), sds(batch, tp.DIM_IN2), sds(tp.WEIGHT_NUMEL)).lower(lowering_platforms=("cuda",)).as_text()
    res["vma_cuda_tp"] = {"triton_calls": text.count("__gpu$xla.gpu.triton"), "all_reduce": text.count("all_reduce")}
    g = jax.shard_map(lambda *a: jax.lax.psum(jnp.sum(jnp.sin(op.conv(a[0][0], a[1][0], a[2][0], a[3][0], a[4][0],
                                                                       nodes, check=False, interpret=False))), "b"),
                      mesh=amesh, in_specs=(P("b"),) * 5, out_specs=P())
    ints = jax.ShapeDtypeStruct((DEVICES, edges), jnp.int32)
    text = jax.jit(jax.grad(g, argnums=(0, 1, 2))).trace(
        sds(DEVICES, nodes, op.DIM_IN1), sds(DEVICES, edges, op.DIM_IN2), sds(DEVICES, edges, op.WEIGHT_NUMEL),
        ints, ints).lower(lowering_platforms=("cuda",)).as_text()
    res["vma_cuda_conv"] = {"triton_calls": text.count("__gpu$xla.gpu.triton")}
    try:
        jax.jit(jax.shard_map(lambda a, b, c: tp.tensor_product(a, b, c), mesh=mesh,
                              in_specs=(P("b"), P("b"), P()), out_specs=P("b"))).trace(*tp_inputs(tp))
        res["vma_interpret_error"] = None
    except ValueError as e:
        res["vma_interpret_error"] = str(e)

    # the data-parallel training example: one step against one device
    import train_jax_dp

    res["train_dp"] = train_jax_dp.check(pkgs["rows"], ops["rows"], devices=DEVICES, atoms=4)
    (out_dir / "result.json").write_text(json.dumps(res))


# ------------------------------------------------------------------ tests

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_sharding")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, __file__, "--worker", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "result.json").read_text())


EXACT = 1e-12  # row-local results are exact; a sum over devices rounds differently


def test_four_devices(res):
    assert res["devices"] == DEVICES


@pytest.mark.parametrize("case", ["jit_auto_shared", "jit_auto_rows", "jit_explicit_shared"])
def test_jit_partitions_the_batch(res, case):
    r = res[case]
    assert r["all_gather"] == 0  # no operand gathered: each device runs the kernels on its rows
    assert r["out_spec"][0] == "b"  # the output stays sharded like the inputs
    shared = case.endswith("shared")
    assert [s[0] if s else "None" for s in r["grad_specs"]] == ["b", "b", "None" if shared else "b"]
    # shared weights: the only collective is the psum of their gradient
    assert (r["all_reduce"] >= 1) if shared else (r["all_reduce"] == 0)
    assert r["out_diff"] <= EXACT
    assert max(r["grad_diffs"]) <= EXACT


def test_shard_map_tensor_product(res):
    r = res["shard_map_tp"]
    assert r["out_diff"] <= EXACT and max(r["grad_diffs"]) <= EXACT


def test_shard_map_conv(res):
    r = res["shard_map_conv"]
    assert r["value_diff"] <= EXACT and max(r["grad_diffs"]) <= EXACT


def test_shard_map_check_vma(res):
    # compiled route: forward, three backward kernels; the shared-weight gradient psum'ed
    assert res["vma_cuda_tp"]["triton_calls"] >= 4 and res["vma_cuda_tp"]["all_reduce"] >= 1
    assert res["vma_cuda_conv"]["triton_calls"] >= 2
    assert "check_vma=False" in (res["vma_interpret_error"] or "")


def test_data_parallel_training_example(res):
    r = res["train_dp"]
    assert r["devices"] == DEVICES and np_isfinite(r["loss"])
    assert r["loss_rel"] <= EXACT and r["grad_rel"] <= 1e-10


def np_isfinite(v) -> bool:
    return v == v and abs(v) != float("inf")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: test_jax_sharding.py --worker OUT (run by pytest)")
