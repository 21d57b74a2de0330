"""Data-parallel training on forces with the generated JAX convolution, one graph per device.

A NequIP-style interaction layer (as ``examples/main.py``'s JAX side): node features
from a learned embedding of the species, edge spherical harmonics (e3nn-jax), a radial
MLP on a Bessel basis with a smooth cutoff giving the per-edge weights, the generated
fused convolution ``jax_ops.conv``, an energy from the output's scalar channels, forces
``F = -dE/dpositions`` and a loss on the forces. The graphs are small random molecules
(radius graphs of random positions, two species) labelled with the forces of a Morse
pair potential.

Data parallelism: each step takes one graph per device, pads every graph to the same
bucket sizes (``jax_ops.pad_graph``; padded nodes and edges are masked out), stacks them
on a leading device axis and runs ``jax.shard_map`` over a 1-D mesh: each device computes
the loss and gradients of its graph, ``jax.lax.pmean`` averages them, every device applies
the same SGD step to its replica of the parameters. ``check`` computes the same averaged
gradient on one device, graph after graph, and returns the largest relative difference
(float64: rounding only).

Runs on the CPU with forced host devices, Pallas in interpret mode::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/train_jax_dp.py

(``--devices N`` sets that flag itself when it is not set.) On a GPU machine every GPU is
a device. Options: ``--spec`` (a spec with ``conv = true``; default a small ``uvu``
product written by this script), ``--steps``, ``--atoms``, ``--dtype``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N_BASIS = 8
CUTOFF = 3.0
HIDDEN = 16
SPECIES = 2

SMALL_SPEC = """\
[[tensor_product]]
name = "dp_layer"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o+2e"
irreps_out = "0e+1o+2e"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float32", "float64"]
conv = true
reduce = "sum"
"""


def build_package(spec_path: Path | None, out: Path):
    """Generate the package of ``spec_path`` (default ``SMALL_SPEC``) into ``out``; return
    ``(metadata module, jax_ops module)``."""
    import importlib

    from eqdsl.codegen.generate import generate

    out.mkdir(parents=True, exist_ok=True)
    if spec_path is None:
        spec_path = out / "dp_layer.toml"
        spec_path.write_text(SMALL_SPEC)
    pkg = out / "dp_pkg"
    generate(spec_path, pkg)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    importlib.invalidate_caches()
    names = [p.name for p in sorted(pkg.iterdir()) if (p / "jax_ops.py").exists()]
    meta = importlib.import_module(f"dp_pkg.{names[0]}")
    if not meta.CONV:
        raise SystemExit(f"{spec_path}: the spec needs conv = true")
    return meta, importlib.import_module(f"dp_pkg.{names[0]}.jax_ops")


# ------------------------------------------------------------------ data


def random_molecule(rng, atoms: int):
    """Random positions (no two atoms closer than 0.9 Å), species, radius graph
    (``src`` -> ``dst`` for every ordered pair within ``CUTOFF``) and Morse forces."""
    pos = []
    while len(pos) < atoms:
        p = rng.uniform(0.0, 2.2 * atoms ** (1 / 3), size=3)
        if all(np.linalg.norm(p - q) > 0.9 for q in pos):
            pos.append(p)
    pos = np.array(pos)
    species = rng.integers(0, SPECIES, size=atoms)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    src, dst = np.nonzero((d < CUTOFF) & ~np.eye(atoms, dtype=bool))
    # Morse pair potential E = sum_{i<j} (1 - exp(-a (r - r0)))^2 as labels
    a, r0 = 1.5, 1.2
    vec = pos[:, None] - pos[None]
    r = np.where(np.eye(atoms, dtype=bool), 1.0, d)
    e = np.exp(-a * (r - r0))
    dedr = np.where(np.eye(atoms, dtype=bool), 0.0, 2 * a * e * (1 - e))
    forces = -np.sum(dedr[..., None] * vec / r[..., None], axis=1)
    return pos, species, src.astype(np.int32), dst.astype(np.int32), forces


def pad_batch(jax_ops, graphs):
    """Pad every graph to the same bucket sizes with ``jax_ops.pad_graph`` and stack them:
    a dict of arrays with a leading graph axis (positions, species, src, dst, forces, node
    and edge masks) and the padded node count (a Python int)."""
    from eqdsl.runtime.jax.padding import bucket

    n_pad = max(bucket(len(g[0]) + 1, 16) for g in graphs)
    e_pad = max(bucket(len(g[2]), 64) for g in graphs)
    out = {k: [] for k in ("pos", "species", "src", "dst", "forces", "node_mask", "edge_mask")}
    for pos, species, src, dst, forces in graphs:
        n, e = len(pos), len(src)
        # pad_graph pads the conv's operands; this layer computes them from the positions,
        # so it is asked for the padded index arrays and masks (zero operands of the right widths)
        p = jax_ops.pad_graph(np.zeros((n, jax_ops.DIM_IN1)), np.zeros((e, jax_ops.DIM_IN2)),
                              np.zeros((e, jax_ops.WEIGHT_NUMEL)), src, dst, n, min_nodes=n_pad, min_edges=e_pad)
        assert p.num_nodes == n_pad and len(p.src) == e_pad
        out["pos"].append(np.pad(pos, ((0, n_pad - n), (0, 0))))
        out["species"].append(np.pad(species, (0, n_pad - n)))
        out["forces"].append(np.pad(forces, ((0, n_pad - n), (0, 0))))
        out["src"].append(np.asarray(p.src, np.int32))
        out["dst"].append(np.asarray(p.dst, np.int32))
        out["node_mask"].append(np.asarray(p.node_mask))
        out["edge_mask"].append(np.asarray(p.edge_mask))
    return {k: np.stack(v) for k, v in out.items()}, n_pad


# ------------------------------------------------------------------ model


def _scalar_columns(irreps_out: str) -> np.ndarray:
    cols, off = [], 0
    for term in irreps_out.split("+"):
        mul, ir = term.split("x")
        mul, l, p = int(mul), int(ir[:-1]), ir[-1]
        if l == 0 and p == "e":
            cols.extend(range(off, off + mul))
        off += mul * (2 * l + 1)
    return np.array(cols)


def init_params(meta, seed: int = 0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    cols = _scalar_columns(meta.IRREPS_OUT)
    return {
        "embed": rng.standard_normal((SPECIES, meta.DIM_IN1)).astype(dtype),
        "w1": (rng.standard_normal((N_BASIS, HIDDEN)) / math.sqrt(N_BASIS)).astype(dtype),
        "w2": (rng.standard_normal((HIDDEN, meta.WEIGHT_NUMEL)) / math.sqrt(HIDDEN)).astype(dtype),
        "readout": (rng.standard_normal(len(cols)) / math.sqrt(max(len(cols), 1))).astype(dtype),
    }


def make_loss(meta, jax_ops, num_nodes: int):
    """``loss(params, graph)``: mean squared force error over a padded graph's real atoms."""
    import e3nn_jax
    import jax
    import jax.numpy as jnp

    if meta.LAYOUT != "mul_ir":
        raise SystemExit("this example builds mul_ir inputs; use a spec with layout = \"mul_ir\"")
    cols = _scalar_columns(meta.IRREPS_OUT)

    def radial(r):
        n = jnp.arange(1, N_BASIS + 1, dtype=r.dtype)
        x = r[:, None] / CUTOFF
        bessel = math.sqrt(2.0 / CUTOFF) * jnp.sin(math.pi * n * x) / r[:, None]
        u = r / CUTOFF
        env = 1.0 - 28.0 * u**6 + 48.0 * u**7 - 21.0 * u**8  # polynomial cutoff, p = 6
        return bessel * env[:, None]

    def energy(pos, params, g):
        em = g["edge_mask"]
        vec = pos[g["dst"]] - pos[g["src"]]
        # padded edges join the dummy node to itself: give them a unit vector (no 0/0 in
        # the harmonics or the basis) and zero weights (they add nothing to the conv)
        vec = jnp.where(em[:, None], vec, jnp.array([1.0, 0.0, 0.0], vec.dtype))
        r = jnp.linalg.norm(vec, axis=1)
        sh = e3nn_jax.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component").array
        w = (jax.nn.silu(radial(r) @ params["w1"]) @ params["w2"]) * em[:, None]
        h = params["embed"][g["species"]] * g["node_mask"][:, None]
        out = jax_ops.conv(h, sh, w, g["src"], g["dst"], num_nodes, check=False)
        return jnp.sum((out[:, cols] @ params["readout"]) * g["node_mask"])

    def loss(params, g):
        forces = -jax.grad(energy)(g["pos"], params, g)
        err = jnp.sum((forces - g["forces"]) ** 2, axis=1) * g["node_mask"]
        return jnp.sum(err) / jnp.sum(g["node_mask"])

    return loss


def make_dp_step(loss, mesh, lr: float, check_vma: bool | None = None):
    """One data-parallel SGD step: ``step(params, batch) -> (params, loss, grads)``,
    ``batch`` arrays with a leading axis of one graph per device (sharded over the mesh's
    ``"dp"`` axis), ``params`` replicated. Loss and gradients are the means over the
    devices' graphs (``pmean``).

    ``check_vma`` (``jax.shard_map``'s): default True, except on the CPU, where the Pallas
    kernels run in interpret mode, which JAX cannot type-check over mesh axes (the
    generated op raises a ``ValueError`` saying so)."""
    import jax
    from jax.sharding import PartitionSpec as P

    if check_vma is None:
        check_vma = jax.default_backend() != "cpu"

    def per_device(params, batch):
        g = jax.tree.map(lambda a: a[0], batch)  # this device's graph
        if check_vma:
            # The gradient of this device's loss alone: params typed as varying over "dp"
            # (differentiating the replicated params directly gives the sum over the
            # devices' losses already: JAX's transpose of the implicit pcast is a psum).
            params_local = jax.lax.pcast(params, "dp", to="varying")
        else:
            params_local = params  # untyped: the gradient is this device's own
        value, grads = jax.value_and_grad(loss)(params_local, g)
        value, grads = jax.lax.pmean((value, grads), "dp")
        new = jax.tree.map(lambda p, d: p - lr * d, params, grads)
        return new, value, grads

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("dp")), out_specs=(P(), P(), P()),
                                 check_vma=check_vma))


def one_device_grads(loss, params, batch):
    """Loss and gradient averaged over the batch's graphs, on one device, one graph at a time."""
    import jax

    f = jax.jit(jax.value_and_grad(loss))
    k = len(batch["pos"])
    results = [f(params, jax.tree.map(lambda a: a[i], batch)) for i in range(k)]
    value = sum(v for v, _ in results) / k
    grads = jax.tree.map(lambda *g: sum(g) / k, *(g for _, g in results))
    return value, grads


def check(meta, jax_ops, *, devices: int | None = None, atoms: int = 6, seed: int = 0) -> dict:
    """One data-parallel step on ``devices`` graphs (default: every device) against one
    device: ``{"devices", "loss", "loss_rel", "grad_rel"}`` (relative differences, max over
    parameters)."""
    import jax

    devices = devices or jax.device_count()
    mesh = jax.make_mesh((devices,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(seed)
    graphs = [random_molecule(rng, atoms + i % 3) for i in range(devices)]
    batch, n_pad = pad_batch(jax_ops, graphs)
    loss = make_loss(meta, jax_ops, n_pad)
    params = init_params(meta, seed)
    step = make_dp_step(loss, mesh, lr=0.0)
    _, value, grads = step(params, batch)
    ref_value, ref_grads = one_device_grads(loss, params, batch)
    rel = lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(np.asarray(b)).max(), 1e-300))  # noqa: E731
    return {"devices": devices, "loss": float(value), "loss_rel": rel(value, ref_value),
            "grad_rel": max(rel(grads[k], ref_grads[k]) for k in grads)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=None, help="spec with conv = true (default: a small uvu layer)")
    ap.add_argument("--out", type=Path, default=None, help="where to generate the package (default: a temp dir)")
    ap.add_argument("--devices", type=int, default=None,
                    help="on the CPU: force this many host devices (sets XLA_FLAGS before jax starts)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--atoms", type=int, default=6, help="atoms of the smallest molecule")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    args = ap.parse_args(argv)
    if args.devices and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}").strip()
    import jax

    jax.config.update("jax_enable_x64", args.dtype == "float64")
    out = args.out or Path(tempfile.mkdtemp(prefix="eqdsl_dp_"))
    meta, jax_ops = build_package(args.spec, out)
    n_dev = jax.device_count()
    print(f"{n_dev} devices ({jax.devices()[0].platform}), package {meta.__name__}, {args.dtype}")

    result = check(meta, jax_ops, devices=n_dev, atoms=args.atoms)
    print(f"data-parallel vs one device, same {n_dev} graphs: loss rel diff {result['loss_rel']:.1e}, "
          f"grad rel diff {result['grad_rel']:.1e}")

    mesh = jax.make_mesh((n_dev,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(1)
    # one fixed molecule size per device slot: padded sizes stay in one bucket (one compilation)
    pool = [[random_molecule(rng, args.atoms + d % 3) for d in range(n_dev)] for _ in range(4)]
    batches = [pad_batch(jax_ops, graphs) for graphs in pool]
    n_pad = batches[0][1]
    if any(n != n_pad for _, n in batches):
        raise SystemExit("graphs of one run must share a node bucket in this example")
    dtype = np.float64 if args.dtype == "float64" else np.float32
    cast = lambda b: {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in b.items()}  # noqa: E731
    step = make_dp_step(make_loss(meta, jax_ops, n_pad), mesh, args.lr)
    params = init_params(meta, 0, dtype)
    for i in range(args.steps):
        batch, _ = batches[i % len(batches)]
        params, value, _ = step(params, cast(batch))
        print(f"step {i}: force loss {float(value):.4f}")
    ok = result["grad_rel"] < (1e-10 if args.dtype == "float64" else 1e-4)
    print("data-parallel gradients equal one device's:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
