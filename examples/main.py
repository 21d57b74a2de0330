"""The main job: spec -> generated kernels -> an interaction layer on real structures.

1. ``eqdsl generate`` writes the package of an example spec (``conv = true``).
2. Real structures that ship with ASE (molecules from ``ase.collections.g2``, a bulk
   silicon supercell from ``ase.build.bulk``) become radius graphs (periodic where the
   structure is).
3. A NequIP/MACE-style interaction layer runs on each: edge vectors -> e3nn spherical
   harmonics (edge_attr) and a Bessel radial basis with a smooth cutoff -> per-edge
   weights; node features (one embedding per element) -> the generated fused
   convolution ``out[dst] += TP(x[src], edge_attr, w)`` -> an invariant energy from the
   scalar channels; forces ``F = -dE/dpositions`` by autograd.
   Where the spec sets ``radial_features = H`` (the package's ``RADIAL_FEATURES``), the
   per-edge weights come from a radial MLP as in MACE and NequIP: basis -> SiLU layer ->
   hidden features ``(edges, H)`` -> a bias-free linear layer ``(H, weight_numel)``. Then
   the generated ops take the hidden features and that matrix (``conv_radial``: the
   per-edge weights are formed on chip, never written to memory); the reference
   multiplies them out and runs e3nn. The table's ``op`` column says which op ran.
4. The same layer built from e3nn (gather + ``o3.TensorProduct`` + ``index_add``) is
   the reference; the table gives the relative differences of energy and forces in
   PyTorch (Helion) and JAX (Pallas), and the time per energy+forces call.

Without a GPU, Helion kernels run in Triton's interpreter and Pallas kernels in
interpret mode (correct, slow); with one they are compiled. The output says which.

Usage: ``python examples/main.py [--spec examples/specs/nequip_water.toml] [--out build/kernels]``
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N_BASIS = 8
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}  # relative to max |e3nn|


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def structures(cutoff: float):
    """``(label, atoms, src, dst, shifts)``: real structures and their radius graphs.

    ``shifts`` are the periodic-image offsets (Å) so that an edge vector is
    ``pos[dst] - pos[src] + shift`` (ASE ``neighbor_list``: i = src, j = dst).
    """
    from ase.build import bulk
    from ase.collections import g2
    from ase.neighborlist import neighbor_list

    items = [(f"g2 {name}", g2[name]) for name in ("H2O", "CH3CH2OH", "C6H6")]
    si = bulk("Si", "diamond", a=5.43, cubic=True).repeat((2, 1, 1))
    # A thermal snapshot: in the perfect crystal every force vanishes by symmetry.
    si.rattle(stdev=0.05, seed=0)
    items.append((f"bulk Si ({len(si)} atoms, periodic, rattled)", si))
    out = []
    for label, atoms in items:
        i, j, d = neighbor_list("ijD", atoms, cutoff)
        pos = atoms.get_positions()
        shifts = d - (pos[j] - pos[i])
        out.append((label, atoms, i.astype(np.int64), j.astype(np.int64), shifts))
    return out


def _blocks(irreps: str):
    for term in irreps.split("+"):
        mul, ir = term.split("x")
        yield int(mul), int(ir[:-1]), ir[-1]


def _scalar_columns(irreps_out: str, layout: str) -> np.ndarray:
    """Columns of the output that hold 0e components (any layout: dim 1 blocks)."""
    cols, off = [], 0
    for mul, l, p in _blocks(irreps_out):
        if l == 0 and p == "e":
            cols.extend(range(off, off + mul))
        off += mul * (2 * l + 1)
    return np.array(cols)


def _layout_index(irreps: str, layout: str) -> np.ndarray:
    """``x_layout = x_mul_ir[:, index]``."""
    idx, off = [], 0
    for mul, l, _ in _blocks(irreps):
        block = np.arange(off, off + mul * (2 * l + 1)).reshape(mul, 2 * l + 1)
        idx.append((block if layout == "mul_ir" else block.T).reshape(-1))
        off += mul * (2 * l + 1)
    return np.concatenate(idx)


class Params:
    """Fixed random parameters of the layer (shared by every implementation)."""

    def __init__(self, meta, atoms_numbers: np.ndarray, seed: int = 0):
        rng = np.random.default_rng(seed)
        species = sorted(set(int(z) for z in atoms_numbers))
        table = {z: rng.standard_normal(meta.DIM_IN1) for z in species}
        self.node_features = np.stack([table[int(z)] for z in atoms_numbers])  # e3nn layout (mul_ir)
        self.radial_features = getattr(meta, "RADIAL_FEATURES", None)
        if self.radial_features is None:
            self.theta = rng.standard_normal((N_BASIS, meta.WEIGHT_NUMEL)) / np.sqrt(N_BASIS)
            self.hidden_layer = None
        else:  # the radial MLP: basis -> H (SiLU) -> weight_numel (bias-free linear, the matrix conv_radial takes)
            hdim = self.radial_features
            self.hidden_layer = rng.standard_normal((N_BASIS, hdim)) / np.sqrt(N_BASIS)
            self.theta = rng.standard_normal((hdim, meta.WEIGHT_NUMEL)) / np.sqrt(hdim)
        cols = _scalar_columns(meta.IRREPS_OUT, "mul_ir")
        self.readout = rng.standard_normal(len(cols)) / np.sqrt(max(len(cols), 1))


def _radial(r, cutoff, xp):
    """Bessel basis times a smooth polynomial cutoff (NequIP's radial embedding), ``xp`` = torch or jnp."""
    n = xp.arange(1, N_BASIS + 1, dtype=r.dtype)
    if hasattr(n, "to"):  # torch: on the positions' device
        n = n.to(r.device)
    x = r[:, None] / cutoff
    # Python floats only: a numpy float64 scalar would promote float32 jax arrays to float64.
    bessel = math.sqrt(2.0 / cutoff) * xp.sin(math.pi * n * x) / r[:, None]
    p = 6.0
    u = r / cutoff
    env = 1.0 - (p + 1) * (p + 2) / 2 * u**p + p * (p + 2) * u ** (p + 1) - p * (p + 1) / 2 * u ** (p + 2)
    return bessel * env[:, None]


def torch_layer(meta, conv, params: Params, src, dst, shifts, cutoff, dtype, device, conv_radial=None):
    """Energy(pos) of the layer in torch with ``conv(x, edge_attr, w, src, dst, n)``, or with
    ``conv_radial(x, edge_attr, hidden, matrix, src, dst, n)`` where given (``params`` with
    a radial MLP: ``w = hidden @ matrix`` otherwise)."""
    import torch
    from e3nn import o3

    t = lambda a: torch.as_tensor(np.asarray(a), dtype=dtype, device=device)  # noqa: E731
    i1 = torch.as_tensor(_layout_index(meta.IRREPS_IN1, meta.LAYOUT), device=device)
    i2 = torch.as_tensor(_layout_index(meta.IRREPS_IN2, meta.LAYOUT), device=device)
    cols = torch.as_tensor(_scalar_columns(meta.IRREPS_OUT, meta.LAYOUT), device=device)
    h, theta, readout, shift = t(params.node_features)[:, i1], t(params.theta), t(params.readout), t(shifts)
    hidden_layer = None if params.hidden_layer is None else t(params.hidden_layer)
    src_t, dst_t = torch.as_tensor(src, device=device), torch.as_tensor(dst, device=device)
    n = len(params.node_features)

    def energy(pos):
        vec = pos[dst_t] - pos[src_t] + shift
        r = torch.linalg.norm(vec, dim=1)
        edge_attr = o3.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component")[:, i2]
        basis = _radial(r, cutoff, torch)
        if hidden_layer is None:
            out = conv(h, edge_attr, basis @ theta, src_t, dst_t, n)
        else:
            hidden = torch.nn.functional.silu(basis @ hidden_layer)  # (edges, H)
            if conv_radial is not None:
                out = conv_radial(h, edge_attr, hidden, theta, src_t, dst_t, n)
            else:
                out = conv(h, edge_attr, hidden @ theta, src_t, dst_t, n)
        return (out[:, cols] @ readout).sum()

    return energy


def e3nn_conv(meta, dtype, device):
    """gather + e3nn TensorProduct + index_add: the reference convolution (e3nn layout)."""
    import torch
    from e3nn import o3

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # exact coefficients, then cast
    try:
        tp = o3.TensorProduct(meta.IRREPS_IN1, meta.IRREPS_IN2, meta.IRREPS_OUT, meta.INSTRUCTIONS,
                              irrep_normalization=meta.IRREP_NORMALIZATION, path_normalization=meta.PATH_NORMALIZATION,
                              shared_weights=meta.SHARED_WEIGHTS, internal_weights=False)
    finally:
        torch.set_default_dtype(default)
    tp = tp.to(device=device, dtype=dtype)
    if meta.LAYOUT != "mul_ir":
        raise SystemExit("the e3nn reference layer expects a mul_ir spec")

    def conv(x, edge_attr, w, src, dst, n):
        out = torch.zeros(n, tp.irreps_out.dim, dtype=x.dtype, device=x.device).index_add(0, dst, tp(x[src], edge_attr, w))
        if meta.CONV_REDUCE == "mean":
            out = out / torch.bincount(dst, minlength=n).clamp_min(1).to(x.dtype)[:, None]
        return out

    return conv


def jax_layer(meta, conv, params: Params, src, dst, shifts, cutoff, dtype, conv_radial=None):
    """Energy(pos) of the layer in JAX, as ``torch_layer``."""
    import e3nn_jax
    import jax
    import jax.numpy as jnp

    i1 = _layout_index(meta.IRREPS_IN1, meta.LAYOUT)
    i2 = _layout_index(meta.IRREPS_IN2, meta.LAYOUT)
    cols = _scalar_columns(meta.IRREPS_OUT, meta.LAYOUT)
    h = jnp.asarray(params.node_features[:, i1], dtype)
    theta, readout, shift = (jnp.asarray(a, dtype) for a in (params.theta, params.readout, shifts))
    hidden_layer = None if params.hidden_layer is None else jnp.asarray(params.hidden_layer, dtype)
    n = len(params.node_features)

    def energy(pos):
        vec = pos[dst] - pos[src] + shift
        r = jnp.linalg.norm(vec, axis=1)
        edge_attr = e3nn_jax.spherical_harmonics(meta.IRREPS_IN2, vec, normalize=True, normalization="component").array[:, i2]
        basis = _radial(r, cutoff, jnp)
        src_j, dst_j = jnp.asarray(src), jnp.asarray(dst)
        if hidden_layer is None:
            out = conv(h, edge_attr, basis @ theta, src_j, dst_j, n)
        else:
            hidden = jax.nn.silu(basis @ hidden_layer)  # (edges, H)
            if conv_radial is not None:
                out = conv_radial(h, edge_attr, hidden, theta, src_j, dst_j, n)
            else:
                out = conv(h, edge_attr, hidden @ theta, src_j, dst_j, n)
        return (out[:, cols] @ readout).sum()

    return energy


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)) if b.size else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples/specs/nequip_water.toml"))
    ap.add_argument("--out", default=str(ROOT / "build/kernels"))
    ap.add_argument("--cutoff", type=float, default=4.0, help="radius-graph cutoff in Å")
    args = ap.parse_args(argv)

    cuda = _has_cuda()
    if not cuda:  # read when the Helion kernel objects are created, at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")
    subprocess.run([sys.executable, "-m", "eqdsl", "generate", args.spec, "-o", args.out], check=True)

    import jax
    import torch

    jax.config.update("jax_enable_x64", True)
    # The comparison is against float64 e3nn: float32 matmuls outside the kernels (radial
    # MLP, readout) must not drop to TF32, which both frameworks may use on a GPU.
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sys.path.insert(0, str(Path(args.out).resolve().parent))
    from eqdsl.spec import load_spec

    device = "cuda" if cuda else "cpu"
    print("kernels:", "compiled (GPU)" if cuda else "interpreted (CPU: TRITON_INTERPRET=1, Pallas interpret=True)")
    header = ("layer", "op", "structure", "atoms", "edges", "dtype", "torch dE", "torch dF", "jax dE", "jax dF", "ok",
              "torch ms", "jax ms")
    rows, failures = [header], 0
    for spec in load_spec(args.spec):
        if not spec.conv:
            print(f"{spec.name}: conv = false in the spec, skipped")
            continue
        pkg = f"{Path(args.out).name}.{spec.name}"
        meta = importlib.import_module(pkg)
        torch_ops = importlib.import_module(pkg + ".torch_ops")
        jax_ops = importlib.import_module(pkg + ".jax_ops")
        radial = getattr(meta, "RADIAL_FEATURES", None) is not None
        op_name = f"conv_radial (H={meta.RADIAL_FEATURES})" if radial else "conv"
        torch_radial = torch_ops.conv_radial if radial else None
        jax_radial = jax_ops.conv_radial if radial else None
        for label, atoms, src, dst, shifts in structures(args.cutoff):
            params = Params(meta, atoms.get_atomic_numbers())
            for dtype_name in meta.DTYPES:
                tdt = getattr(torch, dtype_name)
                pos0 = atoms.get_positions()

                def energy_forces_torch(conv, dt, conv_radial=None):
                    energy = torch_layer(meta, conv, params, src, dst, shifts, args.cutoff, dt, device, conv_radial)
                    pos = torch.tensor(pos0, dtype=dt, device=device, requires_grad=True)
                    e = energy(pos)
                    (g,) = torch.autograd.grad(e, pos)
                    return e.detach().cpu().numpy(), -g.cpu().numpy()

                e_ref, f_ref = energy_forces_torch(e3nn_conv(meta, torch.float64, device), torch.float64)
                energy_forces_torch(torch_ops.conv, tdt, torch_radial)  # compile / warm up
                t0 = time.perf_counter()
                e_t, f_t = energy_forces_torch(torch_ops.conv, tdt, torch_radial)
                t_torch = (time.perf_counter() - t0) * 1e3

                jdt = getattr(jax.numpy, dtype_name)
                energy = jax_layer(meta, jax_ops.conv, params, src, dst, shifts, args.cutoff, jdt, jax_radial)
                ef = jax.jit(jax.value_and_grad(energy))
                pos_j = jax.numpy.asarray(pos0, jdt)
                jax.block_until_ready(ef(pos_j))
                t0 = time.perf_counter()
                e_j, g_j = jax.block_until_ready(ef(pos_j))
                t_jax = (time.perf_counter() - t0) * 1e3

                errs = [_rel(e_t, e_ref), _rel(f_t, f_ref), _rel(e_j, e_ref), _rel(-np.asarray(g_j), f_ref)]
                ok = max(errs) <= TOLERANCE[dtype_name]
                failures += not ok
                rows.append((spec.name, op_name, label, str(len(atoms)), str(len(src)), dtype_name, *(f"{x:.1e}" for x in errs),
                             "yes" if ok else "NO", f"{t_torch:.1f}", f"{t_jax:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for k, r in enumerate(rows):
        print("  ".join(c.rjust(wd) for c, wd in zip(r, widths)))
        if k == 0:
            print("  ".join("-" * wd for wd in widths))
    print("dE, dF: max |difference| / max |e3nn| of energy and forces; times: one energy+forces call after warm-up"
          + ("" if cuda else " (interpreted: they time the interpreter, not the kernels)"))
    if failures:
        print(f"error: {failures} row(s) outside tolerance (float32 {TOLERANCE['float32']:g}, float64 "
              f"{TOLERANCE['float64']:g})", file=sys.stderr)
        return 1
    print(f"all rows within tolerance of e3nn (float32 {TOLERANCE['float32']:g}, float64 {TOLERANCE['float64']:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
