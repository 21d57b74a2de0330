#!/usr/bin/env python3
"""Fused graph-convolution benchmark and small-graph latency: eqdsl against e3nn, cuEquivariance, e3nn-jax.

The operation (generated/<name>/{torch_ops,jax_ops}.conv, spec `conv = true`):

    out[n] = sum over edges e with dst[e] == n of TP(node_features[src[e]], edge_attr[e], weights[e])

node_features (num_nodes, dim_in1), edge_attr (num_edges, dim_in2), weights (num_edges,
weight_numel), out (num_nodes, dim_out); forward and forward+backward (gradients wrt
node_features, edge_attr and weights). Implementations (names as in bench_tp.py):

  eqdsl_torch   generated/<name>/torch_ops.conv (eager, Helion kernels)
  eqdsl_jax     generated/<name>/jax_ops.conv under jax.jit (num_nodes static)
  e3nn          gather x[src] + e3nn.o3.TensorProduct + index_add over dst (torch)
  cueq          cuequivariance_torch.ChannelWiseTensorProduct called with indices_1=src,
                indices_out=dst, size_out=num_nodes: cuEquivariance's fused gather/scatter
                (the documented message-passing form), spec layout (mul_ir: its transposes
                are inside the time)
  cueq_irmul    the same, fed ir_mul operands (cuEquivariance at its best layout)
  eqdsl_torch_irmul, eqdsl_jax_irmul
                the ir_mul twin's conv (benchmarks/layout_twins.py, --twins), inputs permuted
  oeq           OpenEquivariance's TensorProductConv (torch op, CUDA only), rows = dst,
                cols = src: deterministic (edges sorted by dst, sender_perm = a stable sort
                by src) first, its atomic variant if that fails
  e3nn_jax      gather + e3nn_jax.legacy.FunctionalTensorProduct (vmapped) +
                jax.ops.segment_sum, under jax.jit

Graphs (edges sorted by dst, stable; self-loops possible in the random ones):
  rand512x64    512 nodes, 64 random in-edges each: 32,768 edges
  bulk          a diamond-structure supercell (default Si, 8x8x8 cubic cells = 4,096 atoms)
                at a 5 A cutoff, periodic, ase.neighborlist.neighbor_list (i = src,
                j = dst, as examples/main.py); without ase, an equivalent scipy cKDTree
                construction (the JSON says which)
  rand4096x32   4,096 nodes, 32 random in-edges each: 131,072 edges
conv_radial (``--radial``; spec ``radial_features = H``, issue "fused radial weights"): each
set's weight operand is the radial MLP's hidden features ``rf`` (num_edges, H) and one matrix
``Wr`` (H, weight_numel); every implementation computes ``conv(x, edge_attr, rf @ Wr)``, and
forward+backward gives the gradients of x, edge_attr, rf and Wr (Wr's is timed, not compared):

  eqdsl_torch, eqdsl_jax   the generated conv_radial: the weights form on chip
  eqdsl_torch_unfused, eqdsl_jax_unfused
                           rf @ Wr (framework matmul, full float32 precision) + eqdsl's conv
  cueq, cueq_irmul, oeq, e3nn, e3nn_jax
                           rf @ Wr + that implementation's conv (the matmul inside its time)

The floor then counts rf and Wr in place of the weights; FLOPs add 2 E H weight_numel per
matmul (three in forward+backward). JSON default $OUT/bench_radial.json.

Latency (a section, run first): mace_large, 32 atoms of Si (2x2x1 cubic cells) at a 4 A
cutoff = 512 edges: wall time per synchronized call (median), host time per call (N
calls back to back without synchronizing, divided by N), time per call when pipelined
(those N calls and one synchronization, / N) and, for torch, CUDA-event time.

Every implementation is checked against e3nn in float64 (chunked over edges, on the
device) before it is timed: relative Frobenius error of the output and of the three
gradients, at most 1e-4 in float32 (TF32 off, JAX 'highest') and 1e-9 in float64; one
that disagrees is BAD and not timed; a failed import, build or call is n/a with its
reason, and the script goes on. Timing, rotation of input sets and the memory floor
follow bench_tp.py (its helpers are imported, not copied): median of CUDA events per
call (torch) / wall clock over groups ended by block_until_ready (jax). The floor of a
pass is the fewest bytes it must move over the measured copy bandwidth: forward = x +
edge_attr + weights + src + dst read once, out written once; forward+backward = 3 x
(x + edge_attr + weights) + 2 x out + 2 x (src + dst). FLOPs: the IR's flops_per_batch
x num_edges + num_edges x dim_out (the scatter adds); forward+backward counted as 4x
the forward (forward + three vector-Jacobian products of about one forward each).

Output: progress lines, the latency table, one table of the convolution (times, eqdsl's
speedups over e3nn / cuEquivariance / e3nn-jax, GB/s and % of the floor) printed last;
JSON at --json (default $OUT/bench_conv.json) and --latency-json (default
$OUT/bench_latency.json). benchmarks/report.py turns them into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when run as a script
from benchmarks import bench_tp as bt  # noqa: E402  (the plain-TP harness: helpers reused, not copied)

ROOT = bt.ROOT
CONV_PROBLEMS = ["mace_large", "nequip_toluene"]
QUICK_CPU_PROBLEMS = ["nequip_water"]  # the interpreter runs mace_large at seconds per call
ALL_IMPLS = ["eqdsl_torch", "eqdsl_jax", "eqdsl_torch_irmul", "eqdsl_jax_irmul", "e3nn", "cueq", "cueq_irmul", "oeq",
             "e3nn_jax"]
DEFAULT_IMPLS = list(ALL_IMPLS)
# --radial: eqdsl_torch / eqdsl_jax run conv_radial; *_unfused are the matmul + eqdsl's conv
RADIAL_IMPLS = ["eqdsl_torch", "eqdsl_jax", "eqdsl_torch_unfused", "eqdsl_jax_unfused", "cueq_irmul", "cueq", "oeq",
                "e3nn", "e3nn_jax"]
UNFUSED = {"eqdsl_torch_unfused": "eqdsl_torch", "eqdsl_jax_unfused": "eqdsl_jax"}
LATENCY_IMPLS = ["eqdsl_torch", "eqdsl_jax", "cueq", "cueq_irmul", "oeq", "e3nn", "e3nn_jax"]
SHORT = dict(bt.SHORT, eqdsl_torch_unfused="eq_t_mm", eqdsl_jax_unfused="eq_j_mm")
JAX_IMPLS = bt.JAX_IMPLS | {"eqdsl_jax_unfused"}
GRAPHS = ["rand512x64", "bulk", "rand4096x32"]
LATTICE = {"Si": 5.43, "C": 3.567, "Ge": 5.658}  # diamond-structure cubic lattice constants (A)
one_line = bt.one_line
NotAvailable = bt.NotAvailable
Impl = bt.Impl


# ----------------------------------------------------------------------------- CLI


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default=None,
                   help="comma-separated problems (default " + ",".join(CONV_PROBLEMS) + "; --quick on CPU: "
                   + ",".join(QUICK_CPU_PROBLEMS) + ")")
    p.add_argument("--graphs", default=None, help="comma-separated graphs from " + ",".join(GRAPHS)
                   + " (default all; --quick: rand512x64 on GPU, tiny versions of all on CPU)")
    p.add_argument("--bulk", default="Si:8", help="bulk graph ELEMENT:REPEAT (diamond cubic cell repeated "
                   "REPEAT^3 times, 8 atoms each; default Si:8 = 4096 atoms; C:5 = 1000 atoms, 86 neighbours)")
    p.add_argument("--cutoff", type=float, default=5.0, help="bulk-graph cutoff in A (default 5)")
    p.add_argument("--dtypes", default="float32,float64",
                   help="comma-separated, float32 and/or float64 (default both)")
    p.add_argument("--impls", help="comma-separated, from " + ",".join(ALL_IMPLS) + " (default "
                   + ",".join(DEFAULT_IMPLS) + "; on CPU without cueq)")
    p.add_argument("--directions", default="fwd,fwd+bwd")
    p.add_argument("--quick", action="store_true", help="smoke run: small graphs, few reps")
    p.add_argument("--latency", dest="latency", action="store_true", default=True,
                   help="run the small-graph latency section first (default)")
    p.add_argument("--no-latency", dest="latency", action="store_false")
    p.add_argument("--latency-only", action="store_true", help="only the latency section")
    p.add_argument("--latency-problem", default=None, help="default mace_large (--quick on CPU: nequip_water)")
    p.add_argument("--latency-impls", default=None, help="default " + ",".join(LATENCY_IMPLS))
    p.add_argument("--latency-directions", default="fwd,fwd+bwd")
    p.add_argument("--latency-calls", type=int, default=None, help="calls per latency measurement (default 200; "
                   "--quick 20, on CPU 5)")
    p.add_argument("--generated", default=str(ROOT / "generated"))
    p.add_argument("--twins", default=str(ROOT / "generated_twins"), help="ir_mul twin packages (as bench_tp)")
    p.add_argument("--specs", default=str(ROOT / "examples" / "specs"))
    p.add_argument("--json", help="default $OUT/bench_conv.json when OUT is set")
    p.add_argument("--latency-json", help="default $OUT/bench_latency.json when OUT is set")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds; measurements not started by then are skipped (default 420 on GPU)")
    p.add_argument("--target-ms", type=float, default=None, help="timed ms per measurement (default 200; --quick 20)")
    p.add_argument("--rtol32", type=float, default=1e-4)
    p.add_argument("--rtol64", type=float, default=1e-9)
    p.add_argument("--cueq-methods", default=None, help="as bench_tp (default uniform_1d,fused_tp,naive; CPU naive)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--radial", action="store_true",
                   help="conv_radial rows (module docstring): problems need radial_features in their spec; "
                   "no latency section; JSON default $OUT/bench_radial.json")
    p.add_argument("--warm-only", action="store_true",
                   help="compile only: call every implementation once per graph and direction (and the latency "
                   "section's), no reference, no timing, no table (precompile.py --jax)")
    p.add_argument("--warm-target", help="with --warm-only: compile only these problems; the others, up to the "
                   "targets' last configuration, are lowered only (as bench_tp.py --warm-target)")
    p.add_argument("--warm-impl", help="with --warm-target: compile only these implementations (as bench_tp.py "
                   "--warm-impl)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- graphs


@dataclass
class Graph:
    label: str
    num_nodes: int
    src: np.ndarray  # int64, sorted by dst
    dst: np.ndarray
    desc: str
    builder: str = ""
    dev: dict = field(default_factory=dict)  # device copies: ("torch", "int64") -> (src, dst), ...

    @property
    def num_edges(self) -> int:
        return int(len(self.src))

    def info(self) -> dict:
        deg = np.bincount(self.dst, minlength=self.num_nodes)
        return {"label": self.label, "num_nodes": self.num_nodes, "num_edges": self.num_edges, "desc": self.desc,
                "builder": self.builder, "max_in_degree": int(deg.max()) if len(deg) else 0,
                "mean_in_degree": float(deg.mean()) if len(deg) else 0.0, "dst_sorted": True}

    def torch_idx(self, device, kind: str):
        key = ("torch", kind)
        if key not in self.dev:
            torch = bt.import_torch()
            dt = getattr(torch, kind)
            self.dev[key] = (torch.as_tensor(self.src, dtype=dt, device=device),
                             torch.as_tensor(self.dst, dtype=dt, device=device))
        return self.dev[key]

    def jax_idx(self, kind: str):
        key = ("jax", kind)
        if key not in self.dev:
            jax = bt.import_jax()
            if kind == "int64" and not jax.config.jax_enable_x64:
                raise NotAvailable("int64 indices need jax_enable_x64")
            dt = getattr(jax.numpy, kind)
            self.dev[key] = (jax.device_put(jax.numpy.asarray(self.src.astype(kind), dt)),
                             jax.device_put(jax.numpy.asarray(self.dst.astype(kind), dt)))
        return self.dev[key]


def _sort_by_dst(src, dst):
    order = np.argsort(dst, kind="stable")
    return src[order].astype(np.int64), dst[order].astype(np.int64)


def random_graph(label: str, num_nodes: int, in_degree: int, seed: int) -> Graph:
    """``in_degree`` random in-edges per node (sources uniform, self-loops allowed), dst sorted."""
    rng = np.random.default_rng(seed)
    dst = np.repeat(np.arange(num_nodes, dtype=np.int64), in_degree)
    src = rng.integers(0, num_nodes, dst.size, dtype=np.int64)
    return Graph(label, num_nodes, src, dst, f"random, {num_nodes} nodes x {in_degree} in-edges", "numpy")


def diamond_graph(label: str, element: str, reps, cutoff: float) -> Graph:
    """Periodic radius graph of a diamond-structure supercell (edges i -> j, both directions)."""
    if element not in LATTICE:
        raise SystemExit(f"--bulk element {element!r}: known {sorted(LATTICE)}")
    a = LATTICE[element]
    reps = (reps,) * 3 if isinstance(reps, int) else tuple(reps)
    try:
        from ase.build import bulk
        from ase.neighborlist import neighbor_list

        atoms = bulk(element, "diamond", a=a, cubic=True).repeat(reps)
        i, j = neighbor_list("ij", atoms, cutoff)
        n, builder = len(atoms), "ase.neighborlist.neighbor_list"
    except ImportError:
        i, j, n = _diamond_pairs_scipy(a, reps, cutoff)
        builder = "scipy cKDTree (ase not importable)"
    src, dst = _sort_by_dst(np.asarray(i), np.asarray(j))
    desc = (f"{element} diamond {reps[0]}x{reps[1]}x{reps[2]} cubic cells, {n} atoms, periodic, cutoff {cutoff:g} A, "
            f"{len(src) / max(n, 1):.0f} neighbours")
    return Graph(label, n, src, dst, desc, builder)


def _diamond_pairs_scipy(a: float, reps, cutoff: float):
    """The graph ase's neighbor_list gives (pairs i -> j within the cutoff, over every periodic
    image, self excluded only at zero shift), from a cKDTree over the tiled images."""
    from scipy.spatial import cKDTree

    fcc = np.array([[0, 0, 0], [0, .5, .5], [.5, 0, .5], [.5, .5, 0]], float)
    basis = np.stack([fcc, fcc + 0.25], axis=1).reshape(8, 3)  # ase's atom order within the cubic cell
    cells = np.array([(x, y, z) for x in range(reps[0]) for y in range(reps[1]) for z in range(reps[2])], float)
    pos = ((cells[:, None, :] + basis[None]) * a).reshape(-1, 3)
    n, box = len(pos), np.array(reps, float) * a
    k = np.ceil(cutoff / box).astype(int)
    shifts = np.array([(x, y, z) for x in range(-k[0], k[0] + 1) for y in range(-k[1], k[1] + 1)
                       for z in range(-k[2], k[2] + 1)], float)
    zero = int(np.flatnonzero((shifts == 0).all(1))[0])
    tree = cKDTree((pos[None] + (shifts * box)[:, None, :]).reshape(-1, 3))
    hits = tree.query_ball_point(pos, cutoff)
    i = np.repeat(np.arange(n), [len(h) for h in hits])
    jt = np.concatenate([np.asarray(h, dtype=np.int64) for h in hits])
    keep = ~((jt % n == i) & (jt // n == zero))
    return i[keep], (jt % n)[keep], n


def build_graphs(args, on_gpu: bool) -> list:
    names = [g.strip() for g in args.graphs.split(",") if g.strip()] if args.graphs else (
        ["rand512x64"] if args.quick and on_gpu else list(GRAPHS))
    bad = [g for g in names if g not in GRAPHS]
    if bad:
        raise SystemExit(f"unknown graph(s) {bad}; known {GRAPHS}")
    el, _, rep = args.bulk.partition(":")
    tiny = args.quick and not on_gpu
    out = []
    for k, name in enumerate(names):
        if name == "rand512x64":
            out.append(random_graph(name, 16, 4, args.seed + 1) if tiny else random_graph(name, 512, 64, args.seed + 1))
        elif name == "rand4096x32":
            out.append(random_graph(name, 32, 4, args.seed + 2) if tiny else random_graph(name, 4096, 32, args.seed + 2))
        else:
            out.append(diamond_graph(name, el, 1 if tiny else int(rep or 8), args.cutoff))
        if tiny:
            out[-1].label += "-tiny"
    return out


def latency_graph() -> Graph:
    """32 atoms of Si (2x2x1 cubic cells), periodic, 4 A cutoff: 16 neighbours each, 512 edges."""
    return diamond_graph("Si32", "Si", (2, 2, 1), 4.0)


# ----------------------------------------------------------------------------- problems, inputs, reference


def radial_width(prob) -> int:
    """H of the problem's conv_radial (its spec's ``radial_features``)."""
    h = getattr(prob.ir, "radial_features", None)
    if not h:
        raise SystemExit(f"--radial: {prob.name}'s spec has no radial_features")
    return h


def conv_bytes(prob, dtype: str, g: Graph, direction: str, idx_item: int = 8, radial: bool = False) -> int:
    item = {"float32": 4, "float64": 8}[dtype]
    ir = prob.ir
    e, n = g.num_edges, g.num_nodes
    if radial:  # the hidden features and the matrix in place of the per-edge weights
        wbytes = radial_width(prob) * (e + ir.weight_numel)
    else:
        wbytes = ir.weight_numel if prob.shared else e * ir.weight_numel
    ins = item * (n * ir.dim_in1 + e * ir.dim_in2 + wbytes)
    out = item * n * ir.dim_out
    idx = 2 * e * idx_item
    return ins + out + idx if direction == "fwd" else 3 * ins + 2 * out + 2 * idx


def conv_flops(prob, g: Graph, direction: str, radial: bool = False) -> int:
    f = prob.ir.flops_per_batch * g.num_edges + g.num_edges * prob.ir.dim_out
    mm = 2 * g.num_edges * radial_width(prob) * prob.ir.weight_numel if radial else 0
    return f + mm if direction == "fwd" else 4 * f + 3 * mm


class ConvSets(bt.InputSets):
    """Rotating input sets (node features, edge attributes, weights, grad_out) in reference
    space (mul_ir, e3nn's order), stored under bench_tp's names x1, x2, w, g so that its
    native()/to_ref() and Bench.measure apply unchanged."""

    def __init__(self, prob, dtype: str, graph: Graph, device, nsets: int, seed: int, radial: bool = False):
        torch = bt.import_torch()
        self.torch = torch
        self.prob, self.dtype, self.batch, self.device = prob, dtype, graph.num_edges, device
        td = getattr(torch, dtype)
        gen = torch.Generator(device=device).manual_seed(seed)
        ir = prob.ir
        e, n = graph.num_edges, graph.num_nodes
        wshape = (ir.weight_numel,) if prob.shared else (e, ir.weight_numel)
        # --radial: "w" holds the hidden features rf, and wr the radial MLP's last matrix (unit-variance weights)
        self.wr = None
        if radial:
            h = radial_width(prob)
            wshape = (e, h)
            self.wr = torch.randn(h, ir.weight_numel, generator=gen, device=device, dtype=td) / math.sqrt(h)
        self.sets = []
        for _ in range(nsets):
            self.sets.append({
                "x1": torch.randn(n, ir.dim_in1, generator=gen, device=device, dtype=td),
                "x2": torch.randn(e, ir.dim_in2, generator=gen, device=device, dtype=td),
                "w": torch.randn(*wshape, generator=gen, device=device, dtype=td),
                "g": torch.randn(n, ir.dim_out, generator=gen, device=device, dtype=td),
            })
        self._native = {}

    @staticmethod
    def count_for(prob, dtype: str, graph: Graph, l2_bytes: int, quick: bool) -> int:
        per = conv_bytes(prob, dtype, graph, "fwd")
        return 2 if quick else max(2, min(8, math.ceil(4 * l2_bytes / max(per, 1))))


def degree_scale(prob, graph: Graph, device, tdtype):
    """None for reduce = sum; 1 / max(in-degree, 1) per node for mean."""
    if getattr(prob.ir, "reduce", "sum") == "sum":
        return None
    torch = bt.import_torch()
    deg = np.maximum(np.bincount(graph.dst, minlength=graph.num_nodes), 1)
    return torch.as_tensor(1.0 / deg, dtype=tdtype, device=device)[:, None]


class ConvReference:
    """e3nn in float64 on the device, chunked over edges: output and the three gradients of set 0."""

    def __init__(self):
        self.modules = {}

    def compute(self, prob, sets: ConvSets, graph: Graph, need_grads: bool):
        torch = bt.import_torch()
        dev = sets.device
        key = prob.name
        if key not in self.modules:
            self.modules[key] = bt.e3nn_module(prob, torch.float64, dev)
        m = self.modules[key]
        s = sets.sets[0]
        x, ea, w = (s[k].detach().to(torch.float64) for k in ("x1", "x2", "w"))
        wr = None if sets.wr is None else sets.wr.to(torch.float64)
        if wr is not None:  # --radial: the weights rf @ Wr, and rf's gradient from theirs
            w = w @ wr
        src, dst = graph.torch_idx(dev, "int64")
        n, e = graph.num_nodes, graph.num_edges
        scale = degree_scale(prob, graph, dev, torch.float64)
        g = s["g"].to(torch.float64) if need_grads else None
        if g is not None and scale is not None:
            g = g * scale
        ir = prob.ir
        chunk = max(256, (1 << 26) // max(1, ir.dim_out + ir.dim_in1 + ir.weight_numel))
        out = torch.zeros(n, ir.dim_out, dtype=torch.float64, device=dev)
        gx = torch.zeros_like(x) if need_grads else None
        gea = torch.empty_like(ea) if need_grads else None
        gw = torch.zeros_like(w) if need_grads else None
        for a in range(0, e, chunk):
            sl = slice(a, min(e, a + chunk))
            wc = w if prob.shared else w[sl]
            if need_grads:
                xs = x[src[sl]].requires_grad_()
                eac = ea[sl].clone().requires_grad_()
                wcc = wc.clone().requires_grad_()
                msg = m(xs, eac, wcc)
                out.index_add_(0, dst[sl], msg.detach())
                gxs, geac, gwc = torch.autograd.grad(msg, (xs, eac, wcc), g[dst[sl]])
                gx.index_add_(0, src[sl], gxs)
                gea[sl] = geac
                if prob.shared:
                    gw += gwc
                else:
                    gw[sl] = gwc
                del msg, xs, eac, wcc, gxs, geac, gwc
            else:
                with torch.no_grad():
                    out.index_add_(0, dst[sl], m(x[src[sl]], ea[sl], wc))
        if scale is not None:
            out = out * scale
        if need_grads and wr is not None:
            gw = gw @ wr.T
        return out, ((gx, gea, gw) if need_grads else None)


# ----------------------------------------------------------------------------- implementations


def _perms(prob):
    return {"x1": bt.layout_perm(prob.ir.in1, prob.layout), "x2": bt.layout_perm(prob.ir.in2, prob.layout),
            "out": bt.layout_perm(prob.ir.out, prob.layout)}


def jax_conv_impls(name, conv, prob, graph, note, static_n=True):
    """Jitted forward and forward+backward of ``conv(x, ea, w, src, dst, n)`` for each index dtype."""
    jax = bt.import_jax()
    n = graph.num_nodes
    jf = jax.jit(conv, static_argnums=(5,))

    def fb(a, b, c, g, s, d, nn):
        out, vjp = jax.vjp(lambda a_, b_, c_: conv(a_, b_, c_, s, d, nn), a, b, c)
        return out, vjp(g)

    jfb = jax.jit(fb, static_argnums=(6,))
    cands = []
    for kind in ("int32", "int64"):
        try:
            s, d = graph.jax_idx(kind)
        except NotAvailable:
            continue
        cands.append(Impl(name, "jax", lambda a, b, c, _s=s, _d=d: jf(a, b, c, _s, _d, n),
                          lambda a, b, c, g, _s=s, _d=d: jfb(a, b, c, g, _s, _d, n),
                          perms=_perms(prob) if name == "eqdsl_jax" else {}, note=f"{note}, {kind} indices"))
    return cands


class Builders:
    """Per-(problem, dtype) objects built once (modules, jitted functions), bound to a graph per call."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.cache = {}

    def _once(self, key, make):
        if key not in self.cache:
            try:
                self.cache[key] = make()
            except NotAvailable as e:
                self.cache[key] = NotAvailable(str(e))
            except Exception as e:  # noqa: BLE001
                self.cache[key] = NotAvailable(one_line(e))
        v = self.cache[key]
        if isinstance(v, NotAvailable):
            raise v
        return v

    def build(self, name, prob, dtype, graph):
        return getattr(self, "b_" + name)(prob, dtype, graph)

    def b_eqdsl_torch(self, prob, dtype, graph):
        def make():
            mod = bt.import_generated(self.args.generated, prob.name, "torch_ops")
            if not hasattr(mod, "conv"):
                raise NotAvailable(f"generated/{prob.name}/torch_ops.py has no conv yet")
            return mod.conv

        fn = self._once(("eqdsl_torch", prob.name), make)
        n, cands = graph.num_nodes, []
        for kind in ("int64", "int32"):
            s, d = graph.torch_idx(self.device, kind)

            # check=False: no index range check, whose result the host must read (a device sync
            # per call); the other implementations check nothing either
            def f(a, b, c, _s=s, _d=d):
                return fn(a, b, c, _s, _d, n, check=False)

            cands.append(Impl("eqdsl_torch", "torch", f, bt.torch_fb(f), perms=_perms(prob),
                              note=f"layout {prob.layout}, {kind} indices, check=False"))
        return cands

    def b_eqdsl_jax(self, prob, dtype, graph):
        def make():
            mod = bt.import_generated(self.args.generated, prob.name, "jax_ops")
            if not hasattr(mod, "conv"):
                raise NotAvailable(f"generated/{prob.name}/jax_ops.py has no conv yet")
            return mod.conv

        fn = self._once(("eqdsl_jax", prob.name), make)
        return jax_conv_impls("eqdsl_jax", fn, prob, graph, f"jax.jit, layout {prob.layout}")

    def b_eqdsl_torch_radial(self, prob, dtype, graph, wr):
        def make():
            mod = bt.import_generated(self.args.generated, prob.name, "torch_ops")
            if not hasattr(mod, "conv_radial"):
                raise NotAvailable(f"generated/{prob.name}/torch_ops.py has no conv_radial (radial_features)")
            return mod.conv_radial

        fn = self._once(("eqdsl_torch_radial", prob.name), make)
        n, cands = graph.num_nodes, []
        wrn = wr.detach().clone().requires_grad_()
        for kind in ("int64", "int32"):
            s, d = graph.torch_idx(self.device, kind)

            def f(a, b, c, _s=s, _d=d):
                return fn(a, b, c, wrn, _s, _d, n, check=False)

            cands.append(Impl("eqdsl_torch", "torch", f, _radial_torch_fb(f, wrn), perms=_perms(prob),
                              note=f"conv_radial, layout {prob.layout}, {kind} indices, check=False"))
        return cands

    def b_eqdsl_jax_radial(self, prob, dtype, graph, wr):
        jax = bt.import_jax()

        def make():
            mod = bt.import_generated(self.args.generated, prob.name, "jax_ops")
            if not hasattr(mod, "conv_radial"):
                raise NotAvailable(f"generated/{prob.name}/jax_ops.py has no conv_radial (radial_features)")
            return mod.conv_radial

        fn = self._once(("eqdsl_jax_radial", prob.name), make)
        wrj = bt.to_jax(wr)
        n, cands = graph.num_nodes, []

        def conv(a, b, c, r, s, d, nn):
            return fn(a, b, c, r, s, d, nn)

        jf = jax.jit(conv, static_argnums=(6,))

        def fb(a, b, c, r, g, s, d, nn):
            out, vjp = jax.vjp(lambda a_, b_, c_, r_: conv(a_, b_, c_, r_, s, d, nn), a, b, c, r)
            return out, vjp(g)[:3]

        jfb = jax.jit(fb, static_argnums=(7,))
        for kind in ("int32", "int64"):
            try:
                s, d = graph.jax_idx(kind)
            except NotAvailable:
                continue
            cands.append(Impl("eqdsl_jax", "jax", lambda a, b, c, _s=s, _d=d: jf(a, b, c, wrj, _s, _d, n),
                              lambda a, b, c, g, _s=s, _d=d: jfb(a, b, c, wrj, g, _s, _d, n), perms=_perms(prob),
                              note=f"conv_radial, jax.jit, layout {prob.layout}, {kind} indices"))
        return cands

    def b_eqdsl_torch_irmul(self, prob, dtype, graph):
        fn = self._once(("eqdsl_torch_irmul", prob.name, dtype),
                        lambda: bt.twin_module(prob, dtype, self.args, "torch_ops").conv)
        s, d = graph.torch_idx(self.device, "int64")
        n = graph.num_nodes

        def f(a, b, c):
            return fn(a, b, c, s, d, n, check=False)

        return [Impl("eqdsl_torch_irmul", "torch", f, bt.torch_fb(f), perms=bt.irmul_perms(prob),
                     note="layout ir_mul, int64 indices, check=False")]

    def b_eqdsl_jax_irmul(self, prob, dtype, graph):
        fn = self._once(("eqdsl_jax_irmul", prob.name, dtype),
                        lambda: bt.twin_module(prob, dtype, self.args, "jax_ops").conv)
        cands = jax_conv_impls("eqdsl_jax_irmul", fn, prob, graph, "jax.jit, layout ir_mul")
        for c in cands:
            c.perms = bt.irmul_perms(prob)
        return cands

    def b_oeq(self, prob, dtype, graph):
        torch = bt.import_torch()
        if self.device.type != "cuda":
            raise NotAvailable("OpenEquivariance runs on CUDA only")
        if getattr(prob.ir, "reduce", "sum") != "sum":
            raise NotAvailable("reduce = mean: OpenEquivariance sums over edges")

        def make():
            oeq, problem = bt.oeq_problem(prob, dtype)
            mods = {}
            for det in (True, False):
                try:
                    mods[det] = oeq.TensorProductConv(problem, torch_op=True, deterministic=det)
                except Exception as e:  # noqa: BLE001
                    mods[det] = NotAvailable(f"deterministic={det}: {one_line(e)}")
            if all(isinstance(m, NotAvailable) for m in mods.values()):
                raise NotAvailable("; ".join(str(m) for m in mods.values()))
            ok = next(m for m in mods.values() if not isinstance(m, NotAvailable))
            return mods, bt.oeq_weight_perm(ok, prob, self.device, dtype)

        mods, pw = self._once(("oeq", prob.name, dtype), make)
        s, d = graph.torch_idx(self.device, "int64")
        cands = []
        # edges are sorted by dst (rows); sender_perm lists them sorted by src (cols), ties in row order
        sender_perm = torch.argsort(s, stable=True)
        for det, mod in mods.items():
            if isinstance(mod, NotAvailable):
                continue
            if det:
                def f(a, b, c, _m=mod):
                    return _m(a, b, c, d, s, sender_perm)
            else:
                def f(a, b, c, _m=mod):
                    return _m(a, b, c, d, s)
            cands.append(Impl("oeq", "torch", f, bt.torch_fb(f), perms={"w": pw},
                              note=f"openequivariance.TensorProductConv deterministic={det}, rows=dst, cols=src, "
                                   "int64 indices"))
        return cands

    def b_e3nn(self, prob, dtype, graph):
        torch = bt.import_torch()
        m = self._once(("e3nn", prob.name, dtype), lambda: bt.e3nn_module(prob, getattr(torch, dtype), self.device))
        s, d = graph.torch_idx(self.device, "int64")
        n, dout = graph.num_nodes, prob.ir.dim_out
        scale = degree_scale(prob, graph, self.device, getattr(torch, dtype))
        w_shared = prob.shared

        def f(a, b, c):
            msgs = m(a[s], b, c.reshape(-1) if w_shared else c)
            out = torch.zeros(n, dout, dtype=a.dtype, device=a.device).index_add(0, d, msgs)
            return out if scale is None else out * scale

        return [Impl("e3nn", "torch", f, bt.torch_fb(f), note="x[src] + o3.TensorProduct + index_add")]

    def _cueq(self, prob, dtype, graph, irmul):
        name = "cueq_irmul" if irmul else "cueq"
        torch = bt.import_torch()

        def make():
            built = list(bt.build_cueq_candidates(prob, dtype, self.device, self.args, irmul=irmul))
            if not any(i is not None for i, _ in built):
                raise NotAvailable("; ".join(r for _, r in built) or "no method")
            return built

        built = self._once((name, prob.name, dtype), make)
        if getattr(prob.ir, "reduce", "sum") != "sum":
            raise NotAvailable("reduce = mean: not wired for cuEquivariance here")
        n, cands = graph.num_nodes, []
        for impl, reason in built:
            if impl is None:
                continue
            mod = impl.fwd
            if not isinstance(mod, torch.nn.Module) or "indices_1" not in inspect.signature(mod.forward).parameters:
                raise NotAvailable(f"{impl.note}: no indices_1/indices_out in forward (shared weights or not "
                                   "ChannelWiseTensorProduct)")
            for kind in ("int64", "int32"):
                s, d = graph.torch_idx(self.device, kind)

                def f(a, b, c, _m=mod, _s=s, _d=d):
                    return _m(a, b, c, indices_1=_s, indices_out=_d, size_out=n)

                cands.append(Impl(name, "torch", f, bt.torch_fb(f), perms=impl.perms,
                                  note=f"{impl.note}, indices_1/indices_out, {kind} indices"))
        return cands

    def b_cueq(self, prob, dtype, graph):
        return self._cueq(prob, dtype, graph, False)

    def b_cueq_irmul(self, prob, dtype, graph):
        return self._cueq(prob, dtype, graph, True)

    def b_e3nn_jax(self, prob, dtype, graph):
        jax = bt.import_jax()
        tp = self._once(("e3nn_jax", prob.name), lambda: bt.build_e3nn_jax(prob, dtype, self.device, self.args).fwd)
        scale = None
        if getattr(prob.ir, "reduce", "sum") != "sum":
            deg = np.maximum(np.bincount(graph.dst, minlength=graph.num_nodes), 1)
            scale = jax.numpy.asarray(1.0 / deg)[:, None]

        def conv(x, ea, w, src, dst, n):
            out = jax.ops.segment_sum(tp(x[src], ea, w), dst, num_segments=n)
            return out if scale is None else out * scale.astype(out.dtype)

        return jax_conv_impls("e3nn_jax", conv, prob, graph, "x[src] + legacy.FunctionalTensorProduct (vmap) + segment_sum")


# ----------------------------------------------------------------------------- measuring


def _radial_torch_fb(f, wrn):
    """Forward+backward of ``f(x, y, rf)`` with the gradient of the matrix ``wrn`` computed too
    (timed; the check compares x, y and rf's)."""
    import torch

    def fb(a, b, c, g):
        out = f(a, b, c)
        return out, torch.autograd.grad(out, (a, b, c, wrn), g)[:3]

    return fb


def with_matmul(impl, wr):
    """``impl`` given the weights ``rf @ Wr``: the matmul (framework default, full float32
    precision as the harness sets it) inside its time. The weight permutation of ``impl``
    moves to Wr's columns; rf is unpermuted."""
    perms = dict(impl.perms)
    p = perms.pop("w", None)
    if impl.framework == "torch":
        import torch

        wn = wr if p is None else wr.index_select(1, torch.as_tensor(p, device=wr.device))
        wrn = wn.detach().clone().contiguous().requires_grad_()

        def f(a, b, c, _f=impl.fwd):
            return _f(a, b, c @ wrn)

        return Impl(impl.name, "torch", f, _radial_torch_fb(f, wrn), perms=perms, note=f"rf @ Wr + {impl.note}")
    jax = bt.import_jax()
    wn = bt.to_jax(wr if p is None else wr[:, p])
    fwd = jax.jit(lambda a, b, c, r, _f=impl.fwd: _f(a, b, c @ r))

    def fb(a, b, c, r, g, _f=impl.fwd):
        out, vjp = jax.vjp(lambda a_, b_, c_, r_: _f(a_, b_, c_ @ r_), a, b, c, r)
        return out, vjp(g)[:3]

    jfb = jax.jit(fb)
    return Impl(impl.name, "jax", lambda a, b, c: fwd(a, b, c, wn), lambda a, b, c, g: jfb(a, b, c, wn, g),
                perms=perms, note=f"rf @ Wr + {impl.note}")


def sync_fn(framework, device):
    if framework == "jax":
        jax = bt.import_jax()
        return jax.block_until_ready
    torch = bt.import_torch()
    if device.type == "cuda":
        return lambda r: torch.cuda.synchronize()
    return lambda r: None


def make_call(impl, direction, nat):
    """``call(i)`` on native input set ``i`` (as bench_tp's Bench.measure builds it)."""
    torch = bt.import_torch()
    fb = direction == "fwd+bwd"
    if impl.framework == "torch":
        if fb:
            leaves = [{k: v.detach().requires_grad_(k != "g") for k, v in d.items()} for d in nat]
            return lambda i: impl.fb(leaves[i]["x1"], leaves[i]["x2"], leaves[i]["w"], leaves[i]["g"])

        def call(i):
            with torch.no_grad():
                return impl.fwd(nat[i]["x1"], nat[i]["x2"], nat[i]["w"])

        return call
    if fb:
        return lambda i: impl.fb(nat[i]["x1"], nat[i]["x2"], nat[i]["w"], nat[i]["g"])
    return lambda i: impl.fwd(nat[i]["x1"], nat[i]["x2"], nat[i]["w"])


def check_call(call, direction, impl, sets, ref_out, ref_grads):
    res = call(0)
    if direction == "fwd+bwd":
        out, grads = res
        errs = [bt.rel_err(sets.to_ref(impl, "out", out), ref_out)]
        errs += [bt.rel_err(sets.to_ref(impl, op, gi), gr) for op, gi, gr in zip(("x1", "x2", "w"), grads, ref_grads)]
    else:
        errs = [bt.rel_err(sets.to_ref(impl, "out", res), ref_out)]
    return errs


def latency_time(call, framework, device, ncalls: int):
    """Wall time per synchronized call, host time per call without synchronizing, pipelined
    time per call, and (torch on CUDA) CUDA-event time per call; microseconds."""
    torch = bt.import_torch()
    sync = sync_fn(framework, device)
    for _ in range(max(3, ncalls // 10)):
        sync(call(0))
    wall = []
    for _ in range(ncalls):
        t0 = time.perf_counter()
        sync(call(0))
        wall.append((time.perf_counter() - t0) * 1e6)
    sync(call(0))
    t0 = time.perf_counter()
    r = None
    for _ in range(ncalls):
        r = call(0)
    t1 = time.perf_counter()
    sync(r)
    t2 = time.perf_counter()
    res = {"wall_sync_us": statistics.median(wall), "wall_sync_min_us": min(wall),
           "host_us": (t1 - t0) * 1e6 / ncalls, "pipelined_us": (t2 - t0) * 1e6 / ncalls, "calls": ncalls}
    if framework == "torch" and device.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(ncalls)]
        torch.cuda.synchronize()
        for a, b in ev:
            a.record()
            call(0)
            b.record()
            b.synchronize()  # synchronized calls: the events bracket one call's stream work alone
        res["cuda_event_us"] = statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
    return res


class ConvBench(bt.Bench):
    def __init__(self, args):
        super().__init__(args)
        self.latency_rows = []
        self.graph_info = {}

    def get_conv_builds(self, builders, name, prob, dtype, graph, wr=None):
        key = (name, prob.name, dtype, graph.label)
        if key in self.builds:
            return self.builds[key]
        t0 = time.perf_counter()
        try:
            if name in JAX_IMPLS:
                jax = bt.import_jax()
                if self.device.type == "cuda" and jax.default_backend() != "gpu":
                    raise NotAvailable(f"jax backend is {jax.default_backend()!r}, not gpu")
            if wr is None:
                res = builders.build(name, prob, dtype, graph)
            elif name in ("eqdsl_torch", "eqdsl_jax"):
                res = getattr(builders, f"b_{name}_radial")(prob, dtype, graph, wr)
            else:  # the anchor (or eqdsl's unfused conv) given rf @ Wr
                res = [with_matmul(i, wr) for i in builders.build(UNFUSED.get(name, name), prob, dtype, graph)]
                res = [dataclasses.replace(i, name=name) for i in res]
            if not res:
                raise NotAvailable("no candidate")
        except NotAvailable as e:
            res = str(e)
        except Exception as e:  # noqa: BLE001
            res = one_line(e)
        self.builds[key] = res
        if isinstance(res, str):
            self.log(f"  build {name} {prob.name} {dtype}: n/a: {res}")
        elif time.perf_counter() - t0 > 2:
            self.log(f"  build {name} {prob.name} {dtype} {graph.label}: {time.perf_counter() - t0:.1f}s")
        return res

    # ------------------------------------------------------------------------- latency

    def run_latency(self, problems, builders, budget):
        args = self.args
        torch = bt.import_torch()
        probs = {p.name: p for p in problems}
        if not args.latency_problem:
            args.latency_problem = "nequip_water" if (args.quick and self.device.type != "cuda") else "mace_large"
        if args.latency_problem not in probs:
            probs.update({p.name: p for p in bt.load_problems(argparse.Namespace(
                problems=args.latency_problem, quick=False, specs=args.specs, generated=args.generated), self.log)})
        prob = probs[args.latency_problem]
        self.lower_only = self.warm_target is not None and prob.name not in self.warm_target
        graph = latency_graph()
        self.latency_graph = graph.info()
        impls = [i.strip() for i in (args.latency_impls or ",".join(LATENCY_IMPLS)).split(",") if i.strip()]
        if self.device.type != "cuda" and not args.latency_impls:
            impls = [i for i in impls if not i.startswith("cueq")]
        directions = [d.strip() for d in args.latency_directions.split(",") if d.strip()]
        ncalls = args.latency_calls or ((20 if self.device.type == "cuda" else 5) if args.quick else 200)
        dtype = "float32"
        tol = args.rtol32
        self.log(f"latency: {prob.name} {dtype}, {graph.desc}, {graph.num_edges} edges ({graph.builder}); "
                 f"{ncalls} calls per measurement")
        sets = ConvSets(prob, dtype, graph, self.device, 1, args.seed + 7)
        ref_out, ref_grads = (None, None) if args.warm_only else \
            ConvReference().compute(prob, sets, graph, "fwd+bwd" in directions)
        for name in impls:
            cands = self.get_conv_builds(builders, name, prob, dtype, graph)
            for direction in directions:
                row = {"problem": prob.name, "dtype": dtype, "graph": graph.label, "num_nodes": graph.num_nodes,
                       "num_edges": graph.num_edges, "impl": name, "direction": direction}
                if self.elapsed() > budget:
                    row.update(status="skip", reason="time budget exhausted")
                elif isinstance(cands, str):
                    row.update(status="n/a", reason=cands)
                else:
                    row.update(self._latency_one(name, cands, direction, sets, ref_out, ref_grads, tol, ncalls))
                self.latency_rows.append(row)
                if row["status"] == "ok":
                    what = (f"wall {row['wall_sync_us']:.0f} us, host {row['host_us']:.0f} us, pipelined "
                            f"{row['pipelined_us']:.0f} us")
                elif row["status"] in ("warm", "lowered"):
                    what = f"{row['status']}: {row['first_call_s']:.1f} s"
                else:
                    what = f"{row['status']}: {row.get('reason')}"
                self.log(f"  latency {name:12s} {direction:7s} {what}")
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        sets.free()
        if not args.warm_only:
            self.print_latency()

    def _latency_one(self, name, cands, direction, sets, ref_out, ref_grads, tol, ncalls):
        fails, bad = [], []
        for impl in cands:
            if direction == "fwd+bwd" and impl.fb is None:
                fails.append(f"no backward: {impl.fb_reason}")
                continue
            try:
                call = make_call(impl, direction, sets.native(impl))
                if self.args.warm_only:
                    t0 = time.perf_counter()
                    lowers = self.only_lowers(name)
                    if not lowers:
                        sync_fn(impl.framework, self.device)(call(0))
                    elif impl.framework == "jax":
                        bt.lower_jax(impl, direction, sets.native(impl)[0])
                    return dict(status="lowered" if lowers else "warm", first_call_s=time.perf_counter() - t0,
                                note=impl.note)
                t0 = time.perf_counter()
                errs = check_call(call, direction, impl, sets, ref_out, ref_grads)
                first = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                fails.append(one_line(e))
                continue
            err = max(errs) if not any(math.isnan(x) for x in errs) else float("nan")
            if not err <= tol:
                bad.append((f"rel err {err:.2e} > {tol:.0e} [{impl.note}]", err))
                continue
            try:
                t = latency_time(call, impl.framework, self.device, ncalls)
            except Exception as e:  # noqa: BLE001
                fails.append(f"timing: {one_line(e)}")
                continue
            after = check_call(call, direction, impl, sets, ref_out, ref_grads)  # later calls' path (see bench_tp)
            err_after = max(after) if not any(math.isnan(x) for x in after) else float("nan")
            if not err_after <= tol:
                bad.append((f"rel err {err_after:.2e} > {tol:.0e} after the timed calls [{impl.note}]", err_after))
                continue
            return dict(status="ok", rel_err=max(err, err_after), errs=errs, errs_after=after, first_call_s=first,
                        note=impl.note, **t)
        if bad:
            return dict(status="BAD", rel_err=bad[0][1], reason="; ".join([b[0] for b in bad] + fails))
        return dict(status="n/a", reason="; ".join(fails) or "?")

    def finish_warm(self):
        """--warm-only: the latency section's calls count with the conv's."""
        self.results.extend(self.latency_rows)
        return super().finish_warm()

    def print_latency(self):
        g = self.latency_graph
        print(f"\nSmall-graph latency on {self.meta['device']}: {g['desc']}, {g['num_edges']} edges; "
              "us per call (median)", flush=True)
        cols = ["impl", "dir", "wall_sync", "host", "pipelined", "cuda_ev", "rel_err"]
        lines = []
        for r in self.latency_rows:
            if r["status"] == "ok":
                ev = r.get("cuda_event_us")
                lines.append([r["impl"], r["direction"], f"{r['wall_sync_us']:.1f}", f"{r['host_us']:.1f}",
                              f"{r['pipelined_us']:.1f}", "-" if ev is None else f"{ev:.1f}", f"{r['rel_err']:.1e}"])
            else:
                lines.append([r["impl"], r["direction"], r["status"], "-", "-", "-", "-"])
        w = [max(len(c), *(len(x[j]) for x in lines)) if lines else len(c) for j, c in enumerate(cols)]
        print("  ".join(c.rjust(k) for c, k in zip(cols, w)))
        for x in lines:
            print("  ".join(c.rjust(k) for c, k in zip(x, w)))
        for r in self.latency_rows:
            if r["status"] != "ok":
                print(f"  {r['status']} {r['impl']} {r['direction']}: {r.get('reason', '')[:200]}")
        print("wall_sync: call + synchronize, median; host: N calls back to back without synchronizing / N; "
              "pipelined: the same N calls + one synchronize / N; cuda_ev: CUDA events around one synchronized call.",
              flush=True)

    # ------------------------------------------------------------------------- main loop

    def run(self):
        args = self.args
        torch = bt.import_torch()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.device = device
        impls = self.impl_list(device)
        if not args.problems:
            args.problems = ",".join(QUICK_CPU_PROBLEMS if (args.quick and device.type != "cuda") else CONV_PROBLEMS)
        problems = bt.load_problems(args, self.log)
        for p in problems:
            if not p.spec.conv:
                self.log(f"note: {p.name} has conv = false: eqdsl's conv will be n/a")
        self.meta = self.environment(device, impls, problems)
        self.meta["what"] = ("conv_radial: fused graph convolution with fused radial weights" if args.radial
                             else "fused graph convolution")
        if not args.warm_only:
            self.measure_ceilings(device)
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) if device.type == "cuda" else 32 << 20
        self.meta["l2_bytes"] = l2
        timer = bt.Timer(device, args.target_ms or (20.0 if args.quick else 200.0), args.quick)
        directions = [d.strip() for d in args.directions.split(",") if d.strip()]
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip() in ("float32", "float64")]
        budget = args.time_budget if args.time_budget is not None else (420.0 if device.type == "cuda" else 1e9)
        builders = Builders(args, device)
        self.init_warm_target()
        if args.radial:
            args.latency = args.latency_only = False
        if args.latency or args.latency_only:
            try:
                self.run_latency(problems, builders, budget)
            except Exception as e:  # noqa: BLE001
                self.log(f"latency section failed: {one_line(e)}")
                traceback.print_exc(limit=4)
            if not args.warm_only:
                self.write_latency_json()
        if args.latency_only:
            return self.finish_warm() if args.warm_only else None
        graphs = build_graphs(args, device.type == "cuda")
        for g in graphs:
            self.graph_info[g.label] = g.info()
            self.log(f"graph {g.label}: {g.desc}, {g.num_edges} edges ({g.builder})")
        passes = self.warm_passes([(p, dt, g) for dt in dtypes for g in graphs for p in problems], lambda p: p[0].name)
        self.log(f"{len(passes)} configurations x {len(directions)} directions x {len(impls)} implementations; "
                 f"budget {budget:.0f}s")
        ref = ConvReference()
        for prob, dtype, graph in passes:
            base = dict(problem=prob.name, dtype=dtype, batch=graph.label, graph=graph.label,
                        num_nodes=graph.num_nodes, num_edges=graph.num_edges)
            if self.elapsed() > budget:
                for direction in directions:
                    for name in impls:
                        self.results.append(dict(**base, direction=direction, impl=name, status="skip",
                                                 reason="time budget exhausted"))
                continue
            self.lower_only = self.warm_target is not None and prob.name not in self.warm_target
            if dtype == "float64" and any(i in JAX_IMPLS for i in impls):
                bt.enable_x64()
            self.log(f"{prob.name} {dtype} {graph.label} ({graph.num_nodes} nodes, {graph.num_edges} edges, "
                     f"{conv_bytes(prob, dtype, graph, 'fwd', radial=args.radial) / 1e6:.0f} MB fwd floor)")
            try:
                self.run_conv_config(prob, dtype, graph, impls, directions, timer, ref, l2, budget, builders, base)
            except Exception as e:  # noqa: BLE001
                self.log(f"  config failed: {one_line(e)}")
                traceback.print_exc(limit=3)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if args.warm_only:
            return self.finish_warm()
        return self.finish_conv(problems, impls, directions, graphs)

    def impl_list(self, device):
        known = RADIAL_IMPLS if self.args.radial else ALL_IMPLS
        if self.args.impls:
            names = [n.strip() for n in self.args.impls.split(",") if n.strip()]
            bad = [n for n in names if n not in known]
            if bad:
                raise SystemExit(f"unknown implementation(s) {bad}; known: {known}")
            return names
        if device.type != "cuda":
            return [n for n in known if n not in bt.GPU_ONLY_IMPLS]
        return list(known)

    def run_conv_config(self, prob, dtype, graph, impls, directions, timer, ref, l2, budget, builders, base):
        torch = bt.import_torch()
        nsets = 1 if self.args.warm_only else ConvSets.count_for(prob, dtype, graph, l2, self.args.quick)
        sets = ConvSets(prob, dtype, graph, self.device, nsets, self.args.seed, radial=self.args.radial)
        tol = self.args.rtol32 if dtype == "float32" else self.args.rtol64
        try:
            try:
                ref_out, ref_grads = (None, None) if self.args.warm_only else \
                    ref.compute(prob, sets, graph, "fwd+bwd" in directions)
            except Exception as e:  # noqa: BLE001
                reason = f"no reference (e3nn float64): {one_line(e)}"
                for direction in directions:
                    for name in impls:
                        self.record(**base, direction=direction, impl=name, status="n/a", reason=reason)
                return
            for name in impls:
                cands = self.get_conv_builds(builders, name, prob, dtype, graph, wr=sets.wr)
                for direction in directions:
                    if self.elapsed() > budget:
                        self.record(**base, direction=direction, impl=name, status="skip", reason="time budget exhausted")
                        continue
                    if isinstance(cands, str):
                        self.record(**base, direction=direction, impl=name, status="n/a", reason=cands)
                        continue
                    try:
                        self.measure(base, name, direction, cands, sets, ref_out, ref_grads, tol, timer)
                    except Exception as e:  # noqa: BLE001  (e.g. out of memory outside the guarded calls)
                        self.record(**base, direction=direction, impl=name, status="n/a", reason=one_line(e))
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
        finally:
            sets.free()
            del sets

    # ------------------------------------------------------------------------- report

    def write_latency_json(self):
        path = self.args.latency_json or (str(Path(os.environ["OUT"]) / "bench_latency.json")
                                          if os.environ.get("OUT") else None)
        if not path:
            return
        out = {"meta": {**self.meta, "what": "small-graph latency"}, "graph": getattr(self, "latency_graph", None),
               "rows": self.latency_rows}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"JSON: {path}", flush=True)

    def finish_conv(self, problems, impls, directions, graphs):
        by = {(r["problem"], r["dtype"], r["graph"], r["direction"], r["impl"]): r for r in self.results}
        probs = {p.name: p for p in problems}
        gmap = {g.label: g for g in graphs}
        keys = []
        for r in self.results:
            k = (r["problem"], r["dtype"], r["graph"], r["direction"])
            if k not in keys:
                keys.append(k)
        porder = {p.name: i for i, p in enumerate(problems)}
        gorder = {g.label: i for i, g in enumerate(graphs)}
        keys.sort(key=lambda k: (k[1], porder.get(k[0], 99), gorder.get(k[2], 99), bt.DIRECTIONS.index(k[3])))
        notes, rows = {}, []

        def t(r):
            return r["time_us"] if r and r["status"] == "ok" else None

        def cell(r):
            if r is None:
                return "-"
            if r["status"] == "ok":
                return f"{r['time_us']:.1f}" if r["time_us"] < 1000 else f"{r['time_us']:.0f}"
            nk = (r["impl"], r["status"], r.get("reason", ""))
            notes.setdefault(nk, []).append(f"{r['problem']}/{r['dtype']}/{r['graph']}/{r['direction']}")
            return r["status"]

        for k in keys:
            prob, g = probs[k[0]], gmap[k[2]]
            rs = {i: by.get((*k, i)) for i in impls}
            radial = self.args.radial
            nbytes = conv_bytes(prob, k[1], g, k[3], radial=radial)
            floor_us = nbytes / self.copy_bw * 1e6
            flops = conv_flops(prob, g, k[3], radial=radial)
            row = {"problem": k[0], "dtype": k[1], "graph": k[2], "num_nodes": g.num_nodes, "num_edges": g.num_edges,
                   "direction": k[3], "floor_bytes": nbytes, "floor_us": floor_us, "flops": flops,
                   "times_us": {i: t(rs[i]) for i in impls}, "cells": {i: cell(rs[i]) for i in impls}}
            sp = {}
            for mine in ("eqdsl_torch", "eqdsl_jax"):
                for other in impls:
                    # the layout twins are eqdsl too; the unfused rows (--radial) are what conv_radial replaces
                    own = other.startswith("eqdsl") and not other.endswith("_unfused")
                    if own or t(rs.get(mine)) is None or t(rs.get(other)) is None:
                        continue
                    sp[f"{mine}/{other}"] = t(rs[other]) / t(rs[mine])
            for i in impls:
                if t(rs.get(i)) is not None:
                    row[f"{i}_GBps"] = nbytes / (t(rs[i]) * 1e-6) / 1e9
                    row[f"{i}_floor_frac"] = floor_us / t(rs[i])
            row["speedups"] = sp
            rows.append(row)
        self.print_conv_table(rows, impls, notes)
        out = {"meta": self.meta, "graphs": self.graph_info, "rows": rows, "results": self.results,
               "latency": {"graph": getattr(self, "latency_graph", None), "rows": self.latency_rows},
               "elapsed_s": self.elapsed()}
        default = "bench_radial.json" if self.args.radial else "bench_conv.json"
        path = self.args.json or (str(Path(os.environ["OUT"]) / default) if os.environ.get("OUT") else None)
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
            print(f"JSON: {path}", flush=True)
        return out

    def print_conv_table(self, rows, impls, notes):
        def f(x, spec):
            return "-" if x is None else format(x, spec)

        ratio_cols = [("t/e3nn", "eqdsl_torch/e3nn"), ("t/cueq", "eqdsl_torch/cueq"), ("t/e3jax", "eqdsl_torch/e3nn_jax"),
                      ("j/e3nn", "eqdsl_jax/e3nn"), ("j/cueq", "eqdsl_jax/cueq"), ("j/e3jax", "eqdsl_jax/e3nn_jax")]
        if self.args.radial:
            ratio_cols = [("t/t_mm", "eqdsl_torch/eqdsl_torch_unfused"), ("t/cuirm", "eqdsl_torch/cueq_irmul"),
                          ("t/cueq", "eqdsl_torch/cueq"), ("t/oeq", "eqdsl_torch/oeq"),
                          ("j/j_mm", "eqdsl_jax/eqdsl_jax_unfused"), ("j/cuirm", "eqdsl_jax/cueq_irmul")]
        cols = (["problem", "dt", "graph", "edges", "dir"] + [SHORT.get(i, i) for i in impls] + [c for c, _ in ratio_cols]
                + ["t GB/s", "t %fl", "j GB/s", "j %fl", "floor"])
        table = []
        for r in rows:
            sp = r["speedups"]
            line = [r["problem"], r["dtype"].replace("float", "f"), r["graph"], str(r["num_edges"]), r["direction"]]
            line += [r["cells"][i] for i in impls]
            line += [f(sp.get(k), ".2f") for _, k in ratio_cols]
            for mine in ("eqdsl_torch", "eqdsl_jax"):
                fr = r.get(f"{mine}_floor_frac")
                line += [f(r.get(f"{mine}_GBps"), ".0f"), f(None if fr is None else 100 * fr, ".0f")]
            line.append(f(r["floor_us"], ".1f"))
            table.append(line)
        widths = [max(len(c), *(len(x[j]) for x in table)) if table else len(c) for j, c in enumerate(cols)]
        print()
        if notes:
            print("Not timed (n/a: unavailable or failed; BAD: disagrees with e3nn float64; skip: time budget):")
            for (impl, tag, reason), where in notes.items():
                w = ", ".join(where[:2]) + (f" +{len(where) - 2}" if len(where) > 2 else "")
                rr = reason if len(reason) <= 150 else reason[:147] + "..."
                print(f"  {tag} {impl}: {rr} [{w}]")
        ran = sorted({(r["impl"], r.get("note", "")) for r in self.results if r["status"] == "ok"})
        for i, n in ran:
            if i.startswith("cueq") or "int32" in n:
                print(f"  {i}: {n[:160]}")
        for lab, gi in self.graph_info.items():
            print(f"  graph {lab}: {gi['desc']}, {gi['num_edges']} edges, max in-degree {gi['max_in_degree']} ({gi['builder']})")
        how = "torch: CUDA events" if self.device.type == "cuda" else "torch: wall clock"
        print(f"Fused convolution on {self.meta['device']}: median us per call ({how}; jax: wall / "
              f"block_until_ready); copy bandwidth {self.copy_bw / 1e9:.0f} GB/s", flush=True)
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for x in table:
            print("  ".join(c.rjust(w) for c, w in zip(x, widths)))
        print("t/X, j/X: time of X / time of eqdsl torch (t) or jax (j) (>1: eqdsl faster); GB/s: minimal bytes / time; "
              "%fl: floor / time; floor: minimal bytes / copy bandwidth (us).")
        sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    bt.setup_environment(args)
    import warnings

    for cat in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=cat)
    torch = bt.import_torch()
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ConvBench(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
