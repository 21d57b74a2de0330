"""CUDA-graph capture of the generated torch ops, and ``torch.compile(mode="reduce-overhead")``.

What the docs promise (``torch_conv.conv``'s docstring, README "Several GPUs"), checked on a
GPU with a small channelwise package (``uvu``, per-edge weights, so the fused backward
kernels run too; ``mul_ir`` rows, so the conv's layout conversions are captured as well):

* the conv forward, captured with ``torch.cuda.graph`` after an eager warm-up and replayed
  on new values (features, edge attributes, weights and indices) copied into the static
  inputs, equals an eager call: to 1e-12 on graphs below ``SEGMENT_MIN_EDGES`` (the
  forward scatters with atomics: the summation order varies), bitwise above it (the
  segment kernel sums each node's edges in a fixed order);
* energy and forces (positions -> edge vectors -> e3nn spherical harmonics and radial
  weights -> conv -> energy = sum of the scalar outputs; forces = -d energy / d positions
  by ``torch.autograd.grad`` inside the captured region): replay equals eager;
* ``torch.compile(mode="reduce-overhead")`` of the same energy function, with forces by
  autograd through the compiled graph: equals eager over 3 calls, and no CUDA graph was
  skipped;
* the index check (``check=True``, the default) reads nothing on the host while a graph
  is captured (capture succeeds with it on), an eager call with ``check=False`` makes no
  synchronizing call at all (``torch.cuda.set_sync_debug_mode("error")``), and an eager
  warm-up validates the graph: an out-of-range index raises ``ValueError`` there, before
  or after a capture;
* the plain ``tensor_product``, forward and backward (the three gradients) in one captured
  graph: replay equals eager bitwise (no atomics in its kernels).

The package is generated with its Triton code and launched through it (the default
runtime path, ``eqdsl.runtime.triton_launch``), not through Helion.

All tests need a CUDA GPU and are skipped without one (nothing is generated then). On an
H100 the file is meant to take well under 2 minutes, most of it generating and compiling
the small package; float64 only, so that "equals" can mean 1e-12.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CUDA graphs are CUDA-only)")]

from genutil import build_package  # noqa: E402

# The MACE/NequIP edge product in small. The conv forward's segment kernel from 256 edges
# on, so one package has both forward paths: atomics (fewer edges) and segments.
SEGMENT_MIN_EDGES = 256
SPEC = f"""
[[tensor_product]]
name = "cg_graphs"
irreps_in1 = "4x0e+4x1o+4x2e"
irreps_in2 = "0e+1o+2e"
irreps_out = "0e+1o+2e"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true

[tensor_product.tuning.conv_fwd]
segment = 1
segment_min_edges = {SEGMENT_MIN_EDGES}
"""
F64 = torch.float64
SMALL_EDGES = 150  # < SEGMENT_MIN_EDGES: the atomic forward
LARGE_EDGES = 400  # >= SEGMENT_MIN_EDGES: the segment forward
NODES = 24


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """(package metadata, torch_ops, torch_conv), launched as users run them: through the
    package's shipped Triton code (conftest defaults the other tests to Helion's path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EQDSL_KERNELS", "triton")  # read when the generated modules are imported
        p = build_package(tmp_path_factory.mktemp("cuda_graphs"), "cg_graphs", SPEC, triton=True)
        conv = importlib.import_module(p.__name__ + ".torch_conv")
        ops = importlib.import_module(p.__name__ + ".torch_ops")
    assert (Path(p.__file__).parent / "triton_kernels").is_dir()
    assert conv.SEGMENT_MIN_EDGES == SEGMENT_MIN_EDGES, "the spec's segment_min_edges did not reach torch_conv"
    return p, ops, conv


# ---------------------------------------------------------------- helpers


def scalar_columns(irreps_out: str) -> list[int]:
    """Columns of the ``0e`` blocks of an output row (contiguous in both layouts: 2l+1 = 1)."""
    cols, offset = [], 0
    for term in irreps_out.split("+"):
        mul, ir = term.split("x") if "x" in term else ("1", term)
        width = int(mul) * (2 * int(ir[:-1]) + 1)
        if ir == "0e":
            cols += range(offset, offset + width)
        offset += width
    return cols


def graph(nodes: int, edges: int, seed: int):
    """Random directed edges without self-loops (their edge vector would be zero), on CUDA."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = (src + torch.randint(1, nodes, (edges,), generator=g)) % nodes
    return src.cuda(), dst.cuda()


def conv_inputs(conv, nodes: int, edges: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, conv.DIM_IN1, generator=g, dtype=F64)
    y = torch.randn(edges, conv.DIM_IN2, generator=g, dtype=F64)
    w = torch.randn(edges, conv.WEIGHT_NUMEL, generator=g, dtype=F64)
    return [x.cuda(), y.cuda(), w.cuda(), *graph(nodes, edges, seed + 100)]


def warm_up(fn, *args, calls: int = 3):
    """Eager calls on a side stream, as ``torch.cuda.graph`` capture wants: kernels compiled
    and loaded, per-metadata checks cached, the indices checked (``check=True``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)


def copy_into(static, values):
    with torch.no_grad():
        for s, v in zip(static, values):
            s.copy_(v)


def assert_close_tight(got, want, rel: float = 1e-12):
    """Equal up to summation order: ``rel`` relative to the largest entry (float64)."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=rel, atol=rel * max(scale, 1e-300))


class EnergyModel:
    """``energy(pos)``: edge vectors -> e3nn spherical harmonics (the package's
    ``IRREPS_IN2``) and radial weights ``sin(k r) / r @ theta`` -> conv of fixed node
    features -> sum of the scalar (``0e``) outputs. Forces depend on the positions through
    the edge attributes and the weights (the fused backward's two edge gradients)."""

    def __init__(self, meta, conv, nodes: int, edges: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.meta, self.conv, self.nodes = meta, conv, nodes
        self.src, self.dst = graph(nodes, edges, seed + 1)
        self.h = torch.randn(nodes, conv.DIM_IN1, generator=g, dtype=F64).cuda()
        self.theta = (torch.randn(6, conv.WEIGHT_NUMEL, generator=g, dtype=F64) / 6).cuda()
        self.freq = torch.arange(1, 7, dtype=F64).cuda()
        self.scalars = torch.tensor(scalar_columns(meta.IRREPS_OUT)).cuda()
        assert len(self.scalars) > 0

    def positions(self, seed: int):
        g = torch.Generator().manual_seed(1000 + seed)
        return (torch.rand(self.nodes, 3, generator=g, dtype=F64) * 4.0).cuda()

    def energy(self, pos):
        from e3nn import o3

        vec = pos[self.dst] - pos[self.src]
        sh = o3.spherical_harmonics(self.meta.IRREPS_IN2, vec, normalize=True, normalization="component")
        r = vec.norm(dim=1, keepdim=True)
        w = (torch.sin(self.freq * r) / r) @ self.theta
        out = self.conv.conv(self.h, sh, w, self.src, self.dst, self.nodes)  # check=True: skipped while capturing
        return out.index_select(1, self.scalars).sum()

    def energy_forces(self, pos):
        pos = pos.detach().requires_grad_(True)
        e = self.energy(pos)
        (grad,) = torch.autograd.grad(e, pos)  # create_graph=False
        return e.detach(), -grad


# ---------------------------------------------------------------- conv forward


@pytest.mark.parametrize("edges", [SMALL_EDGES, LARGE_EDGES], ids=["atomic", "segment"])
def test_conv_forward_capture_replays_new_inputs(pkg, edges):
    _, _, conv = pkg
    static = conv_inputs(conv, NODES, edges, seed=0)
    segment = conv.graph_tensors(static[3], static[4], NODES)[2].numel() > 0
    assert segment == (edges >= SEGMENT_MIN_EDGES), "the graph took the other forward path"
    warm_up(conv.conv, *static, NODES)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = conv.conv(*static, NODES)  # check=True (default) during capture
    first = None
    for seed in (1, 2):
        new = conv_inputs(conv, NODES, edges, seed=seed)  # new values, new indices (same counts)
        copy_into(static, new)
        g.replay()
        want = conv.conv(*new, NODES)
        if segment:  # fixed summation order: the same bits
            assert torch.equal(out, want), (out - want).abs().max().item()
        else:
            assert_close_tight(out, want)
        if first is None:
            first = out.clone()
        else:
            assert not torch.allclose(out, first), "the replay did not recompute on the new inputs"


# ---------------------------------------------------------------- energy and forces


@pytest.mark.parametrize("edges", [SMALL_EDGES, LARGE_EDGES], ids=["atomic", "segment"])
def test_energy_and_forces_capture(pkg, edges):
    meta, _, conv = pkg
    model = EnergyModel(meta, conv, NODES, edges)
    static = model.positions(0)
    warm_up(model.energy_forces, static)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        e, f = model.energy_forces(static)  # forward and backward kernels in one graph
    for seed in (1, 2, 3):
        pos = model.positions(seed)
        copy_into([static], [pos])
        g.replay()
        want_e, want_f = model.energy_forces(pos)
        assert want_f.abs().max() > 0 and torch.isfinite(want_f).all()
        # the backward's scatters (edge vectors into positions, conv gradients) are atomic
        assert_close_tight(e, want_e)
        assert_close_tight(f, want_f)


def test_energy_and_forces_compiled_reduce_overhead(pkg):
    """``torch.compile(energy, mode="reduce-overhead")``; forces by ``autograd.grad``
    through the compiled forward and backward graphs (both run as CUDA graphs)."""
    from torch._dynamo.utils import counters

    meta, _, conv = pkg
    model = EnergyModel(meta, conv, NODES, SMALL_EDGES, seed=5)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model.energy, mode="reduce-overhead")
    for seed in range(3):
        pos = model.positions(seed)
        torch.compiler.cudagraph_mark_step_begin()
        p = pos.clone().requires_grad_(True)
        e = compiled(p)
        (grad,) = torch.autograd.grad(e, p)
        got_e, got_f = e.detach().clone(), -grad.clone()  # the graphs' outputs are reused by the next replay
        want_e, want_f = model.energy_forces(pos)
        # inductor fuses the elementwise parts (spherical harmonics, radial) in its own order
        assert_close_tight(got_e, want_e, rel=1e-9)
        assert_close_tight(got_f, want_f, rel=1e-9)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


# ---------------------------------------------------------------- the index check


def test_index_check_never_syncs_in_capture_and_validates_eagerly(pkg):
    _, _, conv = pkg
    static = conv_inputs(conv, NODES, SMALL_EDGES, seed=0)
    x, y, w, src, dst = static
    # an eager warm-up with a bad index is where the graph gets validated
    for name, arr, value in (("src", 3, NODES), ("dst", 4, -1)):
        bad = list(static)
        bad[arr] = static[arr].clone()
        bad[arr][5] = value
        with pytest.raises(ValueError, match=f"{name} holds node indices outside"):
            warm_up(conv.conv, *bad, NODES, calls=1)
    warm_up(conv.conv, *static, NODES)
    # the eager hot path without the check makes no synchronizing call (forward, backward)
    yg, wg = y.clone().requires_grad_(True), w.clone().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = conv.conv(x, yg, wg, src, dst, NODES, check=False)
        torch.autograd.grad(out.sum(), (yg, wg))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # capture with the check on succeeds (a host read of device data would fail it)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = conv.conv(x, y, w, src, dst, NODES, check=True)
    g.replay()
    assert_close_tight(out, conv.conv(x, y, w, src, dst, NODES))
    # eager calls are still checked after a capture, and the graph still replays
    bad = dst.clone()
    bad[0] = NODES
    with pytest.raises(ValueError, match="dst holds node indices outside"):
        conv.conv(x, y, w, src, bad, NODES)
    g.replay()
    assert_close_tight(out, conv.conv(x, y, w, src, dst, NODES))


# ---------------------------------------------------------------- the plain tensor product


def test_tensor_product_forward_backward_capture(pkg):
    _, ops, _ = pkg
    batch = 64

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        shapes = ((batch, ops.DIM_IN1), (batch, ops.DIM_IN2), (batch, ops.WEIGHT_NUMEL), (batch, ops.DIM_OUT))
        return [torch.randn(s, generator=g, dtype=F64).cuda() for s in shapes]

    def fwd_bwd(x1, x2, w, go):
        out = ops.tensor_product(x1, x2, w)
        return (out, *torch.autograd.grad(out, (x1, x2, w), go))  # the fused backward: all three

    *leaves, go = inputs(0)
    leaves = [t.requires_grad_(True) for t in leaves]
    warm_up(fwd_bwd, *leaves, go)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = fwd_bwd(*leaves, go)
    for seed in (1, 2):
        new = inputs(seed)
        copy_into([*leaves, go], new)
        g.replay()
        want = fwd_bwd(*[t.clone().requires_grad_(True) for t in new[:3]], new[3])
        for name, a, b in zip(("out", "grad_x1", "grad_x2", "grad_w"), got, want):
            assert torch.equal(a, b), (name, (a - b).abs().max().item())
