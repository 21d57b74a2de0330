"""Inside one worker process: generate a candidate's package and time one op on the GPU.

``measure`` compiles first, outside the machine-wide GPU lock (``LOCK``), and times while
holding it, so that the workers compile side by side while exactly one job uses the GPU.
Torch ops are timed with CUDA events; the Pallas ops (jitted forward + backward of the JAX
``tensor_product``, or of ``conv`` for ``pallas_conv``) by wall clock around
``block_until_ready`` (JAX has no CUDA events).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .grid import CONV_OPS, FUSED_CONV_OPS, FUSED_OPS, PALLAS_CONV_OPS, PALLAS_OPS, TP_OPS

__all__ = ["LOCK", "WARMUP_CALLS", "TIMED_CALLS", "measure", "cuda_median_us", "jax_median_us"]

LOCK = Path(tempfile.gettempdir()) / "eqdsl_tune_gpu.lock"
WARMUP_CALLS, TIMED_CALLS = 3, 30
JAX_GROUP_CALLS, JAX_GROUPS = 10, 7  # pallas timing: calls per block_until_ready, groups (median)


def _op_call(ops, conv, op: str, batch: int, dtype: str):
    """A no-argument call of one op of the imported package on random CUDA inputs."""
    import torch

    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=dt)

    x1, x2 = rand(batch, ops.DIM_IN1), rand(batch, ops.DIM_IN2)
    w = rand(ops.WEIGHT_NUMEL) if ops.SHARED_WEIGHTS else rand(batch, ops.WEIGHT_NUMEL)
    if op in TP_OPS + FUSED_OPS:
        g = rand(batch, ops.DIM_OUT)
        args = {"fwd": (x1, x2, w), "bwd_x1": (g, x2, w), "bwd_x2": (x1, g, w), "bwd_w": (x1, x2, g), "bwd": (x1, x2, w, g)}[op]
        fn = getattr(ops, f"{op}_op")
        return lambda: fn(*args)
    nodes = max(1, batch // 64)
    src = torch.randint(0, nodes, (batch,), generator=gen, device=dev)
    dst = torch.sort(torch.randint(0, nodes, (batch,), generator=gen, device=dev)).values
    # node operands only: a per-edge cotangent would be (edges, DIM_OUT), 4 GB for
    # mace_large at 114,688 edges, times the workers sharing the GPU
    xn, gn = rand(nodes, ops.DIM_IN1), rand(nodes, ops.DIM_OUT)
    args = {"conv_fwd": (xn, x2, w), "conv_bwd_x": (gn, x2, w), "conv_bwd_y": (xn, gn, w), "conv_bwd_w": (xn, x2, gn),
            "conv_bwd": (xn, x2, w, gn)}[op]
    fn = getattr(conv, f"{op}_op")
    graph = conv.graph_tensors(src, dst, nodes)  # with the sort orders of segment scatters
    return lambda: fn(*args, *graph, nodes)


def _jax_call(jax_ops, batch: int, dtype: str):
    """A no-argument call of the jitted forward + backward (``jax.vjp`` of
    ``tensor_product``) of the imported package on random inputs, returning the output and
    the three gradients (the output too, so that XLA cannot drop the forward kernel)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    dt = jnp.dtype(dtype)

    def rand(key, *shape):
        return jax.random.normal(key, shape, dt)

    x1, x2, g = rand(keys[0], batch, jax_ops.DIM_IN1), rand(keys[1], batch, jax_ops.DIM_IN2), rand(keys[2], batch, jax_ops.DIM_OUT)
    w = rand(keys[3], jax_ops.WEIGHT_NUMEL) if jax_ops.SHARED_WEIGHTS else rand(keys[3], batch, jax_ops.WEIGHT_NUMEL)

    @jax.jit
    def fwd_bwd(x1, x2, w, g):
        out, vjp = jax.vjp(jax_ops.tensor_product, x1, x2, w)
        return out, vjp(g)

    return lambda: fwd_bwd(x1, x2, w, g)


def _jax_conv_call(jax_ops, batch: int, dtype: str):
    """A no-argument call of the jitted forward + backward (``jax.vjp`` of ``conv`` with respect
    to the node features, edge attributes and weights) on a random graph of ``batch`` edges
    and ``batch // 64`` nodes (as the Helion conv ops), returning the output and the gradients."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    dt = jnp.dtype(dtype)
    nodes = max(1, batch // 64)

    def rand(key, *shape):
        return jax.random.normal(key, shape, dt)

    x, y = rand(keys[0], nodes, jax_ops.DIM_IN1), rand(keys[1], batch, jax_ops.DIM_IN2)
    w = rand(keys[2], jax_ops.WEIGHT_NUMEL) if jax_ops.SHARED_WEIGHTS else rand(keys[2], batch, jax_ops.WEIGHT_NUMEL)
    g = rand(keys[3], nodes, jax_ops.DIM_OUT)
    src = jax.random.randint(keys[4], (batch,), 0, nodes)
    dst = jax.random.randint(keys[5], (batch,), 0, nodes)

    @jax.jit
    def fwd_bwd(x, y, w, g, src, dst):
        out, vjp = jax.vjp(lambda a, b, c: jax_ops.conv(a, b, c, src, dst, nodes, check=False), x, y, w)
        return out, vjp(g)

    return lambda: fwd_bwd(x, y, w, g, src, dst)


def jax_median_us(call, warmup: int, groups: int, per_group: int) -> float:
    """Median microseconds per call of ``call()`` over ``groups`` groups of ``per_group`` calls,
    each group ended by ``block_until_ready`` (wall clock: JAX has no CUDA events)."""
    import time

    import jax

    for _ in range(warmup):
        jax.block_until_ready(call())
    times = []
    for _ in range(groups):
        t0 = time.perf_counter()
        for _ in range(per_group):
            out = call()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / per_group)
    return sorted(times)[len(times) // 2] * 1e6


def cuda_median_us(call, warmup: int, reps: int) -> float:
    """Median microseconds of ``call()`` over ``reps`` CUDA-event intervals after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in events)
    return ms[len(ms) // 2] * 1e3


def measure(spec_file: str, package_dir: str, op: str, batch: int, dtype: str, lock: str) -> float:
    """Time one op of one candidate's package.

    Generates the package of ``spec_file`` into ``package_dir`` (no Triton code: the Helion
    kernels are called), calls ``op`` once to compile it (outside the lock), then times it
    holding an exclusive ``flock`` on the file ``lock``.

    Args:
        spec_file: the candidate's spec (one ``[[tensor_product]]``).
        package_dir: an empty directory for the generated package.
        op: one of ``grid.ALL_OPS``; the Helion ops run on CUDA torch tensors, the Pallas ops on
            jax's default device.
        batch: rows (edges for the conv ops and ``pallas_conv``, on a random graph of
            ``batch // 64`` nodes).
        dtype: ``"float32"`` or ``"float64"``.
        lock: the GPU lock's path (``LOCK`` in ``eqdsl tune``).

    Returns:
        The median call in microseconds.
    """
    import fcntl
    import importlib

    from ..codegen.generate import generate_files, write_package

    files = generate_files(spec_file, package_dir, triton=False)
    write_package(Path(package_dir), files)
    name = next(iter(files)).split("/")[0]
    sys.path.insert(0, package_dir)
    if op in PALLAS_OPS:
        make = _jax_conv_call if op in PALLAS_CONV_OPS else _jax_call
        call = make(importlib.import_module(f"{name}.jax_ops"), batch, dtype)
        call()  # compiles

        def timed() -> float:
            return jax_median_us(call, WARMUP_CALLS, JAX_GROUPS, JAX_GROUP_CALLS)
    else:
        import torch

        ops = importlib.import_module(f"{name}.torch_ops")
        conv = importlib.import_module(f"{name}.torch_conv") if op in CONV_OPS + FUSED_CONV_OPS else None
        call = _op_call(ops, conv, op, batch, dtype)
        call()  # compiles
        torch.cuda.synchronize()

        def timed() -> float:
            return cuda_median_us(call, WARMUP_CALLS, TIMED_CALLS)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            return timed()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
