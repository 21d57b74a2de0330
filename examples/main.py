"""The main job: spec -> generated kernels -> the edge tensor product on real structures.

Generates the package of an example spec with ``eqdsl generate``, builds radius graphs
of real structures shipped with ASE (molecules from ``ase.collections.g2`` and a bulk
silicon supercell), embeds the edges with e3nn spherical harmonics (x2), gathers node
features at the edge sources (x1), makes per-edge radial weights, and runs the generated
op in PyTorch (Helion) and JAX (Pallas). Each result is compared with
``e3nn.o3.TensorProduct`` built from the package's own metadata.

Without a GPU, Helion kernels run in Triton's interpreter and Pallas kernels in
interpret mode (correct but slow); with one they are compiled. The table says which.

Usage: ``python examples/main.py [--spec examples/specs/mace_large.toml] [--out build/kernels]``
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def structures(max_atoms_bulk: int = 16):
    """``(label, ase.Atoms)`` of a few real structures shipped with ASE."""
    from ase.build import bulk
    from ase.collections import g2

    out = []
    for name in ("H2O", "CH3CH2OH", "C6H6"):
        atoms = g2[name]
        out.append((f"g2 {name}", atoms))
    si = bulk("Si", "diamond", a=5.43, cubic=True)  # 8 atoms
    if max_atoms_bulk >= 16:
        si = si.repeat((2, 1, 1))
    out.append((f"bulk Si x{len(si)}", si))
    return out


def radius_graph(atoms, cutoff: float):
    """Directed edges (src, dst) and edge vectors (dst - src, Å) within ``cutoff``, with PBC."""
    from ase.neighborlist import neighbor_list

    src, dst, vec = neighbor_list("ijD", atoms, cutoff)
    return src.astype(np.int64), dst.astype(np.int64), vec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples/specs/mace_large.toml"))
    ap.add_argument("--out", default=str(ROOT / "build/kernels"))
    ap.add_argument("--cutoff", type=float, default=3.0, help="radius-graph cutoff in Å")
    args = ap.parse_args(argv)

    cuda = _has_cuda()
    if not cuda:
        # Must be set before the Helion kernel objects are created (at import).
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")
    subprocess.run([sys.executable, "-m", "eqdsl", "generate", args.spec, "-o", args.out], check=True)

    import jax
    import torch
    from e3nn import o3

    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(Path(args.out).resolve().parent))
    pkg_root = Path(args.out).name
    from eqdsl.spec import load_spec

    names = [s.name for s in load_spec(args.spec)]
    device = "cuda" if cuda else "cpu"
    mode = "compiled (GPU)" if cuda else "interpreted (CPU: TRITON_INTERPRET=1, Pallas interpret=True)"
    print(f"kernels: {mode}")
    rows = [("tensor product", "structure", "atoms", "edges", "dtype", "torch rel err", "jax rel err", "ok", "torch ms", "jax ms")]
    tolerance = {"float32": 1e-5, "float64": 1e-10}  # max |diff| / max |e3nn|
    failures = 0
    warm: set = set()
    rng = np.random.default_rng(0)
    for name in names:
        meta = importlib.import_module(f"{pkg_root}.{name}")
        torch_ops = importlib.import_module(f"{pkg_root}.{name}.torch_ops")
        jax_ops = importlib.import_module(f"{pkg_root}.{name}.jax_ops")
        if meta.LAYOUT != "mul_ir":
            raise SystemExit(f"{name}: this example feeds e3nn-layout (mul_ir) data; spec layout is {meta.LAYOUT}")
        # Built in float64 so its coefficients are exact to double precision; cast per dtype.
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        tp64 = o3.TensorProduct(
            meta.IRREPS_IN1, meta.IRREPS_IN2, meta.IRREPS_OUT, meta.INSTRUCTIONS,
            irrep_normalization=meta.IRREP_NORMALIZATION, path_normalization=meta.PATH_NORMALIZATION,
            shared_weights=meta.SHARED_WEIGHTS, internal_weights=False,
        ).to(device)
        torch.set_default_dtype(default)
        irreps_sh = o3.Irreps(meta.IRREPS_IN2)
        for label, atoms in structures():
            src, dst, vec = radius_graph(atoms, args.cutoff)
            n, e = len(atoms), len(src)
            for dtype_name in meta.DTYPES:
                tdt = getattr(torch, dtype_name)
                feats = torch.tensor(rng.standard_normal((n, meta.DIM_IN1)), dtype=tdt, device=device)
                edge_vec = torch.tensor(vec, dtype=tdt, device=device)
                x1 = feats[torch.as_tensor(src, device=device)]
                x2 = o3.spherical_harmonics(irreps_sh, edge_vec, normalize=True, normalization="component")
                wshape = (meta.WEIGHT_NUMEL,) if meta.SHARED_WEIGHTS else (e, meta.WEIGHT_NUMEL)
                w = torch.tensor(rng.standard_normal(wshape), dtype=tdt, device=device)
                ref = tp64(x1.double(), x2.double(), w.double())  # float64 reference for every dtype
                if (name, dtype_name) not in warm:  # compile once per dtype; later graph sizes reuse it
                    torch_ops.tensor_product(x1, x2, w)
                    warm.add((name, dtype_name))
                t0 = time.perf_counter()
                out_t = torch_ops.tensor_product(x1, x2, w)
                if cuda:
                    torch.cuda.synchronize()
                t_torch = (time.perf_counter() - t0) * 1e3
                jx = [jax.numpy.asarray(a.detach().cpu().numpy()) for a in (x1, x2, w)]
                jfn = jax.jit(jax_ops.tensor_product)
                jfn(*jx).block_until_ready()  # compile outside the timing
                t0 = time.perf_counter()
                out_j = jfn(*jx).block_until_ready()
                t_jax = (time.perf_counter() - t0) * 1e3
                ref_np = ref.detach().cpu().numpy()
                scale = max(float(np.abs(ref_np).max()), 1e-300) if e else 1.0
                d_t = float(np.abs(out_t.detach().cpu().numpy() - ref_np).max()) / scale if e else 0.0
                d_j = float(np.abs(np.asarray(out_j) - ref_np).max()) / scale if e else 0.0
                ok = max(d_t, d_j) <= tolerance[dtype_name]
                failures += not ok
                rows.append((name, label, str(n), str(e), dtype_name, f"{d_t:.1e}", f"{d_j:.1e}", "yes" if ok else "NO",
                             f"{t_torch:.1f}", f"{t_jax:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(c.rjust(wd) for c, wd in zip(r, widths)))
        if k == 0:
            print("  ".join("-" * wd for wd in widths))
    print("(times are one call after warm-up; interpreted times measure the interpreter, not the kernel)")
    if failures:
        print(f"error: {failures} row(s) outside tolerance (float32 1e-5, float64 1e-10 relative to e3nn)", file=sys.stderr)
        return 1
    print("all rows within tolerance of e3nn (float32 1e-5, float64 1e-10, relative to max |e3nn|)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
