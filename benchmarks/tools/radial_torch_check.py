#!/usr/bin/env python3
"""PyTorch ``conv_radial`` on the GPU: check it against ``conv(x, y, rf @ wr)``, then time it.

Generates ``examples/specs/mace_large.toml`` with ``radial_features = 64`` into a temporary
directory, with its Triton code (lowered in parallel on the host's cores; ``--no-triton``: the
Helion kernels, compiled at first call), or imports ``--package DIR`` (a directory holding the
generated ``mace_large`` package with ``RADIAL_FEATURES``); builds a random graph of 4,096
nodes x 32 in-edges (sources uniform, edges sorted by dst), and

1. checks, in float32 and float64, the output and the gradients of a random linear loss with
   respect to all four tensors (x, y, rf, wr) of ``torch_conv.conv_radial`` against the unfused
   composition ``conv(x, y, rf @ wr)`` (``torch.matmul`` with TF32 off): relative Frobenius
   error <= 1e-5 (float32) / 1e-10 (float64), each float32 value also against the float64
   composition (what TF32 in the on-chip product would miss by ~1e-3). Any failure prints
   ``FAIL`` lines and exits with status 1 before timing;
2. prints the median CUDA-event time (float32; ``--reps`` calls after 3 warm-ups) of the
   forward and forward + backward (``torch.autograd.grad`` of all four tensors) of
   ``conv_radial``, of ``rf @ wr`` + eqdsl's ``conv``, and, if ``cuequivariance_torch``
   imports, of ``rf @ wr`` + cuEquivariance's fused ``ChannelWiseTensorProduct``
   (``indices_1`` / ``indices_out``) at ``ir_mul`` operands, built as
   ``benchmarks/bench_tp.py: build_cueq_candidates`` builds it (its first method that runs and
   matches eqdsl's conv; operands permuted to its layout and weight order once, outside the
   timing; a mismatch prints ``BAD`` and its row is left out).

    python3 benchmarks/tools/radial_torch_check.py [--package DIR] [--no-triton] [--reps 20]
        [--nodes 4096 --degree 32] [--radial-dot] [--quick]

``--sweep BB:BC:NW[:FLAGS],...``: instead, per ``block_b:block_c:num_warps`` setting of the
``conv_radial_fwd`` and ``conv_radial_bwd`` sub-tables (``FLAGS``: ``s`` adds ``segment = 1`` to
the forward's, the node scatter as a segment reduction of ``block_b`` edges per step; ``d``
adds ``radial_dot = 1`` to both; ``b`` adds ``materialize = 1`` to the backward's: the conv's
fused backward at ``W = rf @ wr``; a trailing ``m<N>`` sets ``max_terms = N`` in both), generates the spec (Helion kernels,
compiled at first call) into a temporary directory, checks it in float32 and prints a table
of fwd / fwd+bwd times sorted by fwd+bwd, with the composition ``rf @ wr`` + ``conv`` (the first
setting's package, timed once) among them; ``--sweep-budget-s`` (360) stops starting settings.
With the default 4,096 x 32 graph, 4 settings should take about 4 to 6 minutes on an H100.

``--radial-dot``: also generates the spec with ``radial_dot = 1`` (``mace_large_dot``, tf32x3
dots) into a second temporary directory, checks it in float32 like the default and times it
in the same table.

``--quick``: a CPU smoke run of the script itself (Triton's interpreter, Helion kernels, 32 nodes
x 4 in-edges, wall-clock times of one call).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
H = 64
TOL = {"float32": 1e-5, "float64": 1e-10}


def generate(out: Path, triton: bool, radial_dot: bool = False) -> Path:
    """mace_large with radial_features = H, generated into ``out / "pkg"``; with ``radial_dot``
    as ``mace_large_dot`` (its own torch.library namespace) with ``radial_dot = 1`` at the top
    of its tuning table (every radial op's dots in tf32x3), into ``out / "pkg_dot"`` (its own
    top-level name: both directories go on ``sys.path`` in one process)."""
    from eqdsl.codegen.generate import generate_files, write_package

    text = (ROOT / "examples/specs/mace_large.toml").read_text()
    if radial_dot:
        text, n1 = re.subn(r'(?m)^name = "mace_large"', 'name = "mace_large_dot"', text)
        text, n2 = re.subn(r"(?m)^\[tensor_product\.tuning\]$", "[tensor_product.tuning]\nradial_dot = 1", text)
        if (n1, n2) != (1, 1):
            raise SystemExit("FAIL: examples/specs/mace_large.toml: no name / [tensor_product.tuning] line to patch")
    if not re.search(r"(?m)^radial_features\s*=", text):
        text, n = re.subn(r"(?m)^conv = true.*$", f"conv = true\nradial_features = {H}", text)
        if n != 1:
            raise SystemExit("FAIL: examples/specs/mace_large.toml has no 'conv = true' line to extend")
    spec_path = out / "mace_large_radial.toml"
    spec_path.write_text(text)
    t0 = time.perf_counter()
    pkg = out / ("pkg_dot" if radial_dot else "pkg")
    write_package(pkg, generate_files(spec_path, pkg, triton=triton))
    print(f"generated {pkg.name} (radial_features = {H}, radial_dot = {int(radial_dot)}, Triton code: {triton}) "
          f"in {time.perf_counter() - t0:.0f} s")
    return pkg


SWEEP_OPS = ("conv_radial_fwd", "conv_radial_bwd")


# --sweep flags: letter -> (the sub-tables it goes into, the key line)
SWEEP_FLAGS = {"s": (("conv_radial_fwd",), "segment = 1"), "d": (SWEEP_OPS, "radial_dot = 1"),
               "b": (("conv_radial_bwd",), "materialize = 1")}


def parse_setting(text: str) -> tuple[int, int, int, str, int | None]:
    """``BB:BC:NW[:FLAGS]`` -> ``(block_b, block_c, num_warps, letters, max_terms)``; ``FLAGS``:
    letters of ``SWEEP_FLAGS``, then optionally ``m<N>`` (``max_terms = N`` in every sub-table:
    fewer accumulators per kernel, more kernels; None without it)."""
    m = re.fullmatch(rf"(\d+):(\d+):(\d+)(?::([{''.join(SWEEP_FLAGS)}]*)(?:m(\d+))?)?", text)
    if not m:
        raise SystemExit(f"FAIL: --sweep setting {text!r}: expected BB:BC:NW[:FLAGS], FLAGS of "
                         f"{''.join(SWEEP_FLAGS)} then optionally m<max_terms>")
    return int(m[1]), int(m[2]), int(m[3]), m[4] or "", int(m[5]) if m[5] else None


def sweep_spec(text: str, tag: str, block_b: int, block_c: int, num_warps: int, letters: str = "",
               max_terms: int | None = None) -> str:
    """The spec ``text`` as ``mace_large_<tag>`` (its own torch.library namespace) with the
    sub-tables of ``SWEEP_OPS`` replaced by ``block_b`` / ``block_c`` / ``num_warps``, the keys
    of ``letters`` (``SWEEP_FLAGS``) and ``max_terms``."""
    text, n = re.subn(r'(?m)^name = "mace_large"', f'name = "mace_large_{tag}"', text)
    if n != 1:
        raise SystemExit('FAIL: examples/specs/mace_large.toml: no name = "mace_large" line')
    for op in SWEEP_OPS:  # drop the spec's own sub-table (header to the next table)
        text = re.sub(rf"(?m)^\[tensor_product\.tuning\.{op}\]\n(?:(?!\[).*\n?)*", "", text)
    if not re.search(r"(?m)^\[tensor_product\.tuning\]$", text):
        text += "\n[tensor_product.tuning]\n"
    return text.rstrip("\n") + "\n" + "".join(
        f"\n[tensor_product.tuning.{op}]\nblock_b = {block_b}\nblock_c = {block_c}\nnum_warps = {num_warps}\n"
        + "".join(SWEEP_FLAGS[f][1] + "\n" for f in letters if op in SWEEP_FLAGS[f][0])
        + (f"max_terms = {max_terms}\n" if max_terms else "")
        for op in SWEEP_OPS)


BASELINE = "rf @ wr + eqdsl conv (the first setting's package)"


def run_sweep(args, torch, device) -> None:
    """``--sweep``: per ``block_b:block_c:num_warps`` setting of ``SWEEP_OPS``, generate the spec
    (Helion kernels, compiled at first call) into a temporary directory, check conv_radial
    (float32, against rf @ wr + conv) and print its median fwd / fwd+bwd times; settings not
    started within ``--sweep-budget-s`` are listed as skipped (the loop says so, loudly)."""
    from eqdsl.codegen.generate import generate_files, write_package

    text = (ROOT / "examples/specs/mace_large.toml").read_text()
    if not re.search(r"(?m)^radial_features\s*=", text):
        text = re.sub(r"(?m)^conv = true.*$", f"conv = true\nradial_features = {H}", text, count=1)
    settings = [parse_setting(c) for c in args.sweep.split(",")]
    n, deg = args.nodes, args.degree
    gen = torch.Generator().manual_seed(0)
    dst = torch.arange(n).repeat_interleave(deg)
    src = torch.randint(0, n, (dst.numel(),), generator=gen)
    s, d = src.to(device), dst.to(device)
    t_start, rows, failures = time.perf_counter(), [], []
    tmp = tempfile.TemporaryDirectory(prefix="radial_sweep_")
    for i, (bb, bc, nw, letters, max_terms) in enumerate(settings):
        label = " ".join([f"block_b={bb} block_c={bc} num_warps={nw}"]
                         + [SWEEP_FLAGS[f][1].replace(" ", "") for f in letters]
                         + ([f"max_terms={max_terms}"] if max_terms else []))
        if time.perf_counter() - t_start > args.sweep_budget_s:
            print(f"  SKIPPED (over --sweep-budget-s {args.sweep_budget_s} s): {label}", flush=True)
            continue
        t0 = time.perf_counter()
        out = Path(tmp.name) / f"s{i}"
        spec_path = out / "spec.toml"
        out.mkdir(parents=True)
        spec_path.write_text(sweep_spec(text, f"s{i}", bb, bc, nw, letters, max_terms))
        # a top-level name per setting: a second "pkg" would resolve to the first one's module
        pkg_dir = out / f"pkg_s{i}"
        write_package(pkg_dir, generate_files(spec_path, pkg_dir, triton=False))
        _, conv = import_modules(pkg_dir, f"mace_large_s{i}")
        h = conv.RADIAL_FEATURES
        g = torch.Generator().manual_seed(1)
        ts = [torch.randn(n, conv.DIM_IN1, generator=g), torch.randn(dst.numel(), conv.DIM_IN2, generator=g),
              torch.randn(dst.numel(), h, generator=g), torch.randn(h, conv.WEIGHT_NUMEL, generator=g) / h ** 0.5]
        ts = [t.to(device).requires_grad_() for t in ts]
        gout = torch.randn(n, conv.DIM_OUT, generator=g).to(device)

        def radial(*a, _c=conv):
            return _c.conv_radial(*a, s, d, n, check=False)

        def fwd_bwd(*a, _f=radial):
            return torch.autograd.grad(_f(*a), a, gout)

        got = [radial(*ts).detach(), *fwd_bwd(*ts)]
        out_ref = conv.conv(ts[0], ts[1], ts[2] @ ts[3], s, d, n, check=False)
        want = [out_ref.detach(), *torch.autograd.grad(out_ref, ts, gout)]
        errs = [rel(a, b) for a, b in zip(got, want)]
        if max(errs) > TOL["float32"]:
            failures.append(f"{label}: rel. errors " + " ".join(f"{e:.1e}" for e in errs))
            print(f"  FAIL {failures[-1]}", flush=True)
            continue

        def f_only(_a=ts):
            with torch.no_grad():
                return radial(*_a)

        t_f, t_fb = cuda_us(f_only, args.reps), cuda_us(lambda: fwd_bwd(*ts), args.reps)
        rows.append((label, t_f, t_fb))
        if not any(r[0] == BASELINE for r in rows):  # the composition once, in the same run (this package's conv)
            def unfused(*a, _c=conv):
                return _c.conv(a[0], a[1], a[2] @ a[3], s, d, n, check=False)

            def unfused_f(_a=ts):
                with torch.no_grad():
                    return unfused(*_a)

            rows.append((BASELINE, cuda_us(unfused_f, args.reps),
                         cuda_us(lambda: torch.autograd.grad(unfused(*ts), ts, gout), args.reps)))
            print(f"  {BASELINE:60s} fwd {rows[-1][1]:9.1f} us  fwd+bwd {rows[-1][2]:9.1f} us", flush=True)
        print(f"  {label:60s} fwd {t_f:9.1f} us  fwd+bwd {t_fb:9.1f} us  (max rel. error {max(errs):.1e}; "
              f"generated + compiled + timed in {time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\nsweep of {', '.join(SWEEP_OPS)} (float32, median CUDA-event us, {n} nodes x {deg} in-edges):")
    print(f"  {'setting':60s} {'fwd':>9s} {'fwd+bwd':>9s}")
    for label, t_f, t_fb in sorted(rows, key=lambda r: r[2]):
        print(f"  {label:60s} {t_f:9.1f} {t_fb:9.1f}")
    if failures:
        print("FAIL: settings whose conv_radial differs from rf @ wr + conv:\n  " + "\n  ".join(failures))
        raise SystemExit(1)


def import_modules(package: Path, name: str = "mace_large"):
    sys.path.insert(0, str(package.parent))
    importlib.invalidate_caches()
    pkg = importlib.import_module(f"{package.name}.{name}")
    conv = importlib.import_module(f"{package.name}.{name}.torch_conv")
    if getattr(conv, "RADIAL_FEATURES", None) is None or not hasattr(conv, "conv_radial"):
        raise SystemExit(f"FAIL: {conv.__file__} has no conv_radial (RADIAL_FEATURES)")
    return pkg, conv


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cuda_us(fn, reps: int) -> float:
    import torch

    if not torch.cuda.is_available():  # --quick: wall clock of one call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def build_cueq(conv_mod, s, d, n, device):
    """``(fwd(x, y, w) -> out, perms)`` of cuEquivariance's fused conv at ir_mul, or ``(None, reason)``."""
    from types import SimpleNamespace

    from benchmarks import bench_tp as bt
    from eqdsl.lower import lower
    from eqdsl.spec import load_spec

    spec = load_spec(ROOT / "examples/specs/mace_large.toml")[0]
    ins = [i.as_tuple() for i in spec.instructions]
    prob = bt.Problem("mace_large", spec, lower(spec), ins, {i[3] for i in ins}, spec.layout, spec.shared_weights)
    reasons = []
    try:
        for impl, reason in bt.build_cueq_candidates(prob, "float32", device, SimpleNamespace(cueq_methods=None),
                                                     irmul=True):
            if impl is None:
                reasons.append(reason)
                continue
            mod = impl.fwd

            def fwd(a, b, w, _m=mod):
                return _m(a, b, w, indices_1=s, indices_out=d, size_out=n)

            return (fwd, impl.perms, impl.note), None
    except Exception as e:  # noqa: BLE001 - cuEquivariance is optional here
        return None, f"{type(e).__name__}: {e}"
    return None, "; ".join(reasons) or "no method"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default=None, help="directory of the generated mace_large (radial_features set)")
    ap.add_argument("--no-triton", action="store_true", help="generate without Triton code (Helion kernels)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--degree", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run of this script (slow interpreter)")
    ap.add_argument("--sweep", default=None, metavar="BB:BC:NW[:FLAGS],...",
                    help="only time these block_b:block_c:num_warps settings of conv_radial_fwd and conv_radial_bwd "
                         "(e.g. 16:32:4,16:64:4,32:32:4,32:64:8); each compiles its Helion kernels (20-60 s)")
    ap.add_argument("--sweep-budget-s", type=float, default=360.0,
                    help="start no further sweep setting after this many seconds")
    ap.add_argument("--radial-dot", action="store_true",
                    help="also generate radial_dot = 1 (tf32x3 dots) into a temp dir: check it (float32) and time it")
    args = ap.parse_args()
    if args.quick:
        os.environ["TRITON_INTERPRET"] = "1"  # before helion / triton are imported
        os.environ["EQDSL_KERNELS"] = "helion"
        args.no_triton, args.nodes, args.degree, args.reps = True, 32, 4, 1
    import torch

    if not torch.cuda.is_available() and not args.quick:
        raise SystemExit("FAIL: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference matmul in full float32 precision
    device = torch.device("cpu" if args.quick else "cuda")
    if args.sweep:
        run_sweep(args, torch, device)
        return
    tmp = tempfile.TemporaryDirectory(prefix="radial_torch_")
    package = Path(args.package) if args.package else generate(Path(tmp.name), triton=not args.no_triton)
    _, conv = import_modules(package)
    conv_dot = None
    if args.radial_dot:
        tmp_dot = tempfile.TemporaryDirectory(prefix="radial_torch_dot_")  # noqa: F841 - kept until exit
        _, conv_dot = import_modules(generate(Path(tmp_dot.name), triton=not args.no_triton, radial_dot=True),
                                     "mace_large_dot")
    n, deg = args.nodes, args.degree
    gen = torch.Generator().manual_seed(0)
    dst = torch.arange(n).repeat_interleave(deg)
    src = torch.randint(0, n, (dst.numel(),), generator=gen)
    e, h = dst.numel(), conv.RADIAL_FEATURES
    s, d = src.to(device), dst.to(device)
    host = {"x": torch.randn(n, conv.DIM_IN1, generator=gen, dtype=torch.float64),
            "y": torch.randn(e, conv.DIM_IN2, generator=gen, dtype=torch.float64),
            "rf": torch.randn(e, h, generator=gen, dtype=torch.float64),
            "wr": torch.randn(h, conv.WEIGHT_NUMEL, generator=gen, dtype=torch.float64) / h ** 0.5,
            "g": torch.randn(n, conv.DIM_OUT, generator=gen, dtype=torch.float64)}
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{where}: mace_large conv_radial, H = {h}, {n} nodes x {deg} in-edges = {e} edges, "
          f"torch {torch.__version__}; radial ops with kernels of their own: {', '.join(conv._RADIAL.fused_ops)}")

    def radial(x, y, rf, wr):
        return conv.conv_radial(x, y, rf, wr, s, d, n, check=False)

    def unfused(x, y, rf, wr):
        return conv.conv(x, y, rf @ wr, s, d, n, check=False)

    def values(fn, dtype):
        ts = [host[k].to(device, dtype).requires_grad_() for k in ("x", "y", "rf", "wr")]
        out = fn(*ts)
        grads = torch.autograd.grad(out, ts, host["g"].to(device, dtype))
        return [out.detach(), *grads]

    def radial_dot(x, y, rf, wr):
        return conv_dot.conv_radial(x, y, rf, wr, s, d, n, check=False)

    names = ("out", "d x", "d y", "d rf", "d wr")
    failures = []
    truth = values(unfused, torch.float64)
    checks = [("", radial, (torch.float32, torch.float64))]
    checks += [("radial_dot = 1 ", radial_dot, (torch.float32,))] if conv_dot is not None else []
    for label, fn, dtypes in checks:
        for dtype in dtypes:
            tol = TOL[str(dtype).removeprefix("torch.")]
            got, want = values(fn, dtype), values(unfused, dtype)
            for name, a, b, t in zip(names, got, want, truth):
                err, err_true, ref_true = rel(a, b), rel(a, t), rel(b, t)
                ok = err <= tol and err_true <= max(tol, 4 * ref_true)
                print(f"  check {label}{dtype} {name:5s}: rel. error {err:.2e} vs the composition, {err_true:.2e} vs "
                      f"float64 (composition: {ref_true:.2e}) {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"{label}{dtype} {name}")
    if failures:
        for f in failures:
            print(f"FAIL: conv_radial != conv(x, y, rf @ wr): {f}")
        raise SystemExit(1)

    ts = {k: host[k].to(device, torch.float32).requires_grad_() for k in ("x", "y", "rf", "wr")}
    g32 = host["g"].to(device, torch.float32)
    rows = [("eqdsl conv_radial", radial, ts)]
    rows += [("eqdsl conv_radial, radial_dot = 1 (tf32x3)", radial_dot, ts)] if conv_dot is not None else []
    rows += [("rf @ wr + eqdsl conv", unfused, ts)]
    built, reason = build_cueq(conv, s, d, n, device)
    if built is None:
        print(f"  cuEquivariance: n/a ({reason})")
    else:
        fwd, perms, note = built

        def perm(t, p):
            return t if p is None else t[:, torch.as_tensor(p, device=device)]

        cts = {"x": perm(ts["x"].detach(), perms.get("x1")).requires_grad_(),
               "y": perm(ts["y"].detach(), perms.get("x2")).requires_grad_(),
               "rf": ts["rf"].detach().clone().requires_grad_(),
               "wr": perm(ts["wr"].detach(), perms.get("w")).requires_grad_()}

        def cueq(x, y, rf, wr):
            return fwd(x, y, rf @ wr)

        with torch.no_grad():
            ref = perm(unfused(*(ts[k] for k in ("x", "y", "rf", "wr"))), perms.get("out"))
            err = rel(cueq(*cts.values()), ref)
        if err <= 1e-4:
            rows.append((f"rf @ wr + cuEquivariance ({note})", cueq, cts))
        else:
            print(f"  BAD: cuEquivariance ({note}) differs from eqdsl's conv by {err:.2e}: not timed")

    print(f"\nmedian CUDA-event time, float32, {args.reps} calls (us):")
    print(f"  {'':60s} {'fwd':>9s} {'fwd+bwd':>9s}")
    for label, fn, args_ in rows:
        order = [args_[k] for k in ("x", "y", "rf", "wr")]

        def fwd_only(_fn=fn, _a=order):
            with torch.no_grad():
                return _fn(*_a)

        def fwd_bwd(_fn=fn, _a=order):
            return torch.autograd.grad(_fn(*_a), _a, g32)

        print(f"  {label[:60]:60s} {cuda_us(fwd_only, args.reps):9.1f} {cuda_us(fwd_bwd, args.reps):9.1f}")


if __name__ == "__main__":
    main()
