#!/usr/bin/env python3
"""Plain tensor-product benchmark: eqdsl (torch + jax) against e3nn, cuEquivariance, e3nn-jax.

One script, one GPU call (benchmarks/README.md has the device commands). For every problem
of docs/problems.md (the spec files in examples/specs/), every dtype and every batch
size, it times the forward and the forward+backward (gradients wrt x1, x2 and weights) of:

  eqdsl_torch   generated/<name>/torch_ops.tensor_product   (torch custom op, Helion)
  eqdsl_jax     generated/<name>/jax_ops.tensor_product     (Pallas), under jax.jit
  e3nn          e3nn.o3.TensorProduct with the spec's instructions and normalizations
  e3nn_compile  torch.compile of the same module (opt-in: compiling is slow)
  cueq          cuequivariance_torch ChannelWiseTensorProduct (uvu) / FullyConnected (uvw),
                in the spec's layout (mul_ir: cuEquivariance transposes inside the op)
  cueq_irmul    the same module fed ir_mul operands (its kernels without the transposes:
                cuEquivariance at its best layout)
  eqdsl_torch_irmul, eqdsl_jax_irmul
                the ir_mul twin of a channelwise problem (benchmarks/layout_twins.py,
                packages <name>_irmul in --twins), on the same inputs permuted to ir_mul
  oeq           OpenEquivariance (openequivariance.TensorProduct, torch op, mul_ir; CUDA only):
                e3nn's instructions, its weights reordered from e3nn's
  e3nn_jax      e3nn_jax.legacy.FunctionalTensorProduct (e3nn's TensorProduct ported to
                JAX: same instructions, same path normalization, no sorting), vmapped
                over the batch, under jax.jit

Every implementation is optional: a failed import, build or call becomes "n/a" with the
exception's one-line message, and the script goes on. Before an implementation is timed
its output (and, for forward+backward, its three gradients) is compared with e3nn run in
float64 on the same inputs (relative Frobenius error, per tensor, max taken); one that
disagrees is reported as BAD and not timed. float32 is compared in IEEE precision (TF32
off in torch, 'highest' matmul precision in JAX).

Timing. torch: CUDA events around each call, median, after warm-up (the do_bench
method); JAX: wall clock over groups of calls ended by block_until_ready, divided by the
group size, median over groups. Calls rotate among several input sets whose total size
is a few times the L2 cache, so repeated calls do not read cached inputs. The device's
copy bandwidth (device-to-device copy, bytes read + written) is measured at the start and
gives the memory floor: bytes a pass must move (IR's bytes_per_batch x batch for the
forward) / copy bandwidth.

CPU: runs as a smoke test (--quick, tiny batch, wall-clock timing, cuEquivariance
skipped unless named in --impls); the eqdsl torch op then runs in Triton's interpreter
(TRITON_INTERPRET=1 is set before the generated modules are imported).

Output: progress lines, then one table (a row per problem x dtype x batch x direction),
then the reasons for every n/a / BAD; all numbers in JSON at --json, or $OUT/bench_tp.json
when OUT is set.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Problems in docs/problems.md order; spec files in examples/specs/ that are not listed here
# are appended (sorted).
PROBLEM_ORDER = [
    "mace_large", "mace_medium", "nequip_water", "nequip_aspirin", "nequip_toluene",
    "nequip_benzene", "nequix_main", "sevennet_l3i5", "diffdock_l2", "tetris_poly_1",
    "e3tools_conv",
]
FLOAT64_PROBLEMS = ("mace_large", "nequip_toluene")
QUICK_PROBLEMS = ["nequip_water", "mace_medium", "tetris_poly_1"]
ALL_IMPLS = ["eqdsl_torch", "eqdsl_jax", "eqdsl_torch_irmul", "eqdsl_jax_irmul", "e3nn", "e3nn_compile", "cueq",
             "cueq_irmul", "oeq", "e3nn_jax"]
DEFAULT_IMPLS = ["eqdsl_torch", "eqdsl_jax", "eqdsl_torch_irmul", "eqdsl_jax_irmul", "e3nn", "cueq", "cueq_irmul",
                 "oeq", "e3nn_jax"]
GPU_ONLY_IMPLS = {"cueq", "cueq_irmul", "oeq"}  # left out of the CPU default
SHORT = {"eqdsl_torch": "eq_torch", "eqdsl_jax": "eq_jax", "eqdsl_torch_irmul": "eq_t_irm", "eqdsl_jax_irmul": "eq_j_irm",
         "e3nn": "e3nn", "e3nn_compile": "e3nn_cmp", "cueq": "cueq", "cueq_irmul": "cueq_irm", "oeq": "oeq",
         "e3nn_jax": "e3nn_jax"}
JAX_IMPLS = {"eqdsl_jax", "eqdsl_jax_irmul", "e3nn_jax"}
TWIN_SUFFIX = "_irmul"  # benchmarks/layout_twins.py
NO_TWIN = "an ir_mul twin exists for channelwise mul_ir problems only"  # not a failure (--warm-only)
DIRECTIONS = ("fwd", "fwd+bwd")


def one_line(e: BaseException) -> str:
    """The exception as one short line: type and first non-empty line of the message."""
    msg = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    s = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return s if len(s) <= 240 else s[:237] + "..."


# ----------------------------------------------------------------------------- CLI


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", help="comma-separated problem names (default: all; --quick: "
                   + ",".join(QUICK_PROBLEMS) + ")")
    p.add_argument("--batch", help="comma-separated batch sizes (default 20000,50000; --quick: "
                   "20000 on GPU, 16 on CPU)")
    p.add_argument("--dtypes", help="comma-separated dtypes for every problem (default: float32, "
                   "plus float64 for " + " and ".join(FLOAT64_PROBLEMS) + ")")
    p.add_argument("--impls", help="comma-separated implementations, from " + ",".join(ALL_IMPLS)
                   + " (default: " + ",".join(DEFAULT_IMPLS) + "; on CPU without cueq)")
    p.add_argument("--directions", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both (default both)")
    p.add_argument("--quick", action="store_true", help="smoke run: few problems, one batch, few reps")
    p.add_argument("--generated", default=str(ROOT / "generated"),
                   help="directory of generated packages (default: <repo>/generated)")
    p.add_argument("--specs", default=str(ROOT / "examples" / "specs"), help="directory of spec files")
    p.add_argument("--twins", default=str(ROOT / "generated_twins"),
                   help="directory of the ir_mul twin packages (benchmarks/layout_twins.py; default "
                        "<repo>/generated_twins)")
    p.add_argument("--json", help="write all numbers here (default: $OUT/bench_tp.json when OUT is set)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds; measurements not started by then are skipped (default 450 on GPU)")
    p.add_argument("--target-ms", type=float, default=None,
                   help="timed milliseconds per measurement (default 200; --quick 20)")
    p.add_argument("--rtol32", type=float, default=1e-4, help="max relative error, float32 (default 1e-4)")
    p.add_argument("--rtol64", type=float, default=1e-9, help="max relative error, float64 (default 1e-9)")
    p.add_argument("--cueq-methods", default=None,
                   help="cuEquivariance methods to try in order (default uvu: uniform_1d,fused_tp,naive; "
                        "uvw: fused_tp,naive; CPU: naive)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--with-results", help="start from this bench_tp JSON's measurements (e.g. eqdsl torch, "
                   "timed after its compile) and add this run's implementations; the table and JSON then hold "
                   "both. Time nothing while kernels compile: host-bound times come out slower")
    p.add_argument("--warm-only", action="store_true",
                   help="compile only: call every implementation once per configuration and direction on the "
                   "same shapes, no reference, no timing, no table (precompile.py --jax runs this to fill JAX's "
                   "persistent compilation cache before the timed run)")
    p.add_argument("--warm-target", help="with --warm-only: compile only these problems (comma-separated); the "
                   "configurations before their last one are lowered, not compiled, in the timed run's order, so "
                   "that the JAX lowerings (whose Triton IR bytes depend on what the process lowered before, seen "
                   "with jax 0.11.2) and hence the persistent-cache keys are the timed run's")
    p.add_argument("--warm-impl", help="with --warm-target: compile only these implementations (comma-separated) "
                   "of the targets, lowering the others in order, so that one process per implementation "
                   "compiles them side by side (precompile.py --jax)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- environment


def setup_environment(args):
    """Environment variables that must be set before torch / jax / helion are imported."""
    # JAX must not grab 75% of the GPU: torch shares it.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    # No autotuning inside a benchmark (generated kernels pin their configs anyway).
    os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/eqdsl_bench_inductor")


def import_torch():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


_JAX = {}


def enable_x64():
    """Switch JAX to 64-bit before the first float64 configuration (no-op if jax is absent)."""
    try:
        jax = import_jax()
    except BaseException:  # noqa: BLE001
        return
    if not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def import_jax():
    """Import jax once (x64 on, 'highest' matmul precision); raises if unavailable."""
    if "jax" in _JAX:
        if isinstance(_JAX["jax"], BaseException):
            raise _JAX["jax"]
        return _JAX["jax"]
    try:
        import jax

        # x64 is switched on only before the first float64 configuration (enable_x64), so
        # the float32 runs trace exactly as a float32-only program would.
        jax.config.update("jax_default_matmul_precision", "highest")
        _JAX["jax"] = jax
        return jax
    except BaseException as e:  # noqa: BLE001
        _JAX["jax"] = e
        raise


# ----------------------------------------------------------------------------- problems


@dataclass
class Problem:
    name: str
    spec: object
    ir: object
    instructions: list
    modes: set
    layout: str
    shared: bool
    generated_meta: dict = field(default_factory=dict)

    @property
    def irreps_in1(self):
        return self.ir.irreps_in1

    @property
    def irreps_in2(self):
        return self.ir.irreps_in2

    @property
    def irreps_out(self):
        return self.ir.irreps_out

    def bytes_fwd(self, dtype: str, batch: int) -> int:
        bpb = dict(self.ir.bytes_per_batch).get(dtype)
        if bpb is None:  # dtype not in the spec: same count, this item size
            item = {"float32": 4, "float64": 8}[dtype]
            bpb = item * (self.ir.dim_in1 + self.ir.dim_in2 + self.ir.dim_out
                          + (0 if self.shared else self.ir.weight_numel))
        return bpb * batch

    def bytes_fwd_bwd(self, dtype: str, batch: int) -> int:
        # forward: read x1, x2, w, write out; backward: read x1, x2, w, grad_out and write
        # grad_x1, grad_x2, grad_w (shared weights: grad_w is a reduction, not per batch).
        item = {"float32": 4, "float64": 8}[dtype]
        ins = self.ir.dim_in1 + self.ir.dim_in2 + (0 if self.shared else self.ir.weight_numel)
        return item * batch * (3 * ins + 2 * self.ir.dim_out)


def load_problems(args, log) -> list:
    sys.path.insert(0, str(ROOT))
    from eqdsl.lower import lower
    from eqdsl.spec import load_spec

    specs = {}
    for f in sorted(Path(args.specs).glob("*.toml")):
        try:
            for s in load_spec(f):
                specs[s.name] = s
        except Exception as e:  # noqa: BLE001
            log(f"spec {f.name}: {one_line(e)}")
    names = [n for n in PROBLEM_ORDER if n in specs] + sorted(n for n in specs if n not in PROBLEM_ORDER)
    if args.problems:
        want = [n.strip() for n in args.problems.split(",") if n.strip()]
        unknown = [n for n in want if n not in specs]
        if unknown:
            raise SystemExit(f"unknown problem(s) {unknown}; known: {names}")
        names = want
    elif args.quick:
        names = [n for n in QUICK_PROBLEMS if n in specs]
    out = []
    for n in names:
        s = specs[n]
        ir = lower(s)
        ins = [i.as_tuple() for i in s.instructions]
        prob = Problem(n, s, ir, ins, {i[3] for i in ins}, s.layout, s.shared_weights)
        prob.generated_meta = read_generated_meta(args.generated, n)
        check_meta(prob, log)
        out.append(prob)
    return out


def read_generated_meta(gen_dir: str, name: str) -> dict:
    """Metadata of generated/<name>/__init__.py, read without importing torch or jax."""
    f = Path(gen_dir) / name / "__init__.py"
    if not f.exists():
        return {}
    ns: dict = {}
    try:
        exec(compile(f.read_text(encoding="utf-8"), str(f), "exec"), ns)  # noqa: S102 - our generated file
    except Exception:  # noqa: BLE001
        return {}
    return {k: v for k, v in ns.items() if k.isupper()}


def check_meta(prob: Problem, log):
    m = prob.generated_meta
    if not m:
        return
    want = {"IRREPS_IN1": prob.irreps_in1, "IRREPS_IN2": prob.irreps_in2, "IRREPS_OUT": prob.irreps_out,
            "WEIGHT_NUMEL": prob.ir.weight_numel, "SHARED_WEIGHTS": prob.shared, "LAYOUT": prob.layout}
    for k, v in want.items():
        if k in m and m[k] != v:
            log(f"WARNING {prob.name}: generated {k}={m[k]!r} but the spec gives {v!r} (stale generated/?)")
    if "INSTRUCTIONS" in m and [tuple(t) for t in m["INSTRUCTIONS"]] != [tuple(t) for t in prob.instructions]:
        log(f"WARNING {prob.name}: generated INSTRUCTIONS differ from the spec's (stale generated/?)")


# ----------------------------------------------------------------------------- layouts


def layout_perm(blocks, target: str):
    """Column permutation ``p`` with ``x_target = x_mul_ir[:, p]`` for operand ``blocks``.

    ``blocks`` carry offsets only (the layout of ``blocks`` itself is irrelevant); target
    is ``mul_ir`` or ``ir_mul``. Returns None for the identity.
    """
    p, ident = [], True
    for b in blocks:
        d, mul = 2 * b.l + 1, b.mul
        for t in range(mul * d):
            if target == "mul_ir":
                u, m = divmod(t, d)
            else:
                m, u = divmod(t, mul)
            src = b.offset + u * d + m
            ident &= src == b.offset + t
            p.append(src)
    return None if ident else p


def inverse(p):
    if p is None:
        return None
    inv = [0] * len(p)
    for i, j in enumerate(p):
        inv[j] = i
    return inv


# ----------------------------------------------------------------------------- implementations


class NotAvailable(Exception):
    """An implementation cannot run this problem (the message says why)."""


@dataclass
class Impl:
    """One built implementation for a (problem, dtype).

    Operands live in "reference space" (mul_ir layout, e3nn's weight and output order);
    ``perms`` maps each operand to the implementation's native columns
    (``native = ref[..., p]``; None = identity): keys x1, x2, w, out.
    ``fwd(x1, x2, w) -> out`` and ``fb(x1, x2, w, g) -> (out, (g1, g2, gw))`` take native
    operands (torch tensors, or jax arrays when ``framework == 'jax'``); ``fb`` may be
    None with ``fb_reason``.
    """

    name: str
    framework: str
    fwd: object
    fb: object = None
    fb_reason: str = ""
    perms: dict = field(default_factory=dict)
    note: str = ""


def torch_fb(fn):
    import torch

    def fb(x1, x2, w, g):
        out = fn(x1, x2, w)
        grads = torch.autograd.grad(out, (x1, x2, w), g)
        return out, grads

    return fb


def jax_fb(fn):
    jax = import_jax()

    def fb(x1, x2, w, g):
        out, vjp = jax.vjp(fn, x1, x2, w)
        return out, vjp(g)

    return jax.jit(fb)


def lower_jax(impl, direction: str, s: dict) -> None:
    """Trace and lower (no compile) what ``impl`` runs for ``direction`` on input set ``s``."""
    jax = import_jax()
    fb = direction == "fwd+bwd"
    fn = impl.fb if fb else impl.fwd
    args = (s["x1"], s["x2"], s["w"]) + ((s["g"],) if fb else ())
    (fn if hasattr(fn, "trace") else jax.jit(fn)).trace(*args).lower()


def import_generated(gen_dir: str, name: str, module: str):
    gen = Path(gen_dir).resolve()
    if not (gen / name).is_dir():
        raise NotAvailable(f"no generated package {gen.name}/{name}/ (run eqdsl generate)")
    if str(gen.parent) not in sys.path:
        sys.path.insert(0, str(gen.parent))
    return importlib.import_module(f"{gen.name}.{name}.{module}")


def build_eqdsl_torch(prob: Problem, dtype, device, args) -> Impl:
    mod = import_generated(args.generated, prob.name, "torch_ops")
    fn = mod.tensor_product
    p1, p2, po = (layout_perm(prob.ir.in1, prob.layout), layout_perm(prob.ir.in2, prob.layout),
                  layout_perm(prob.ir.out, prob.layout))
    return Impl("eqdsl_torch", "torch", fn, torch_fb(fn), perms={"x1": p1, "x2": p2, "out": po},
                note=f"layout {prob.layout}")


def build_eqdsl_jax(prob: Problem, dtype, device, args) -> Impl:
    jax = import_jax()
    mod = import_generated(args.generated, prob.name, "jax_ops")
    fn = mod.tensor_product
    p1, p2, po = (layout_perm(prob.ir.in1, prob.layout), layout_perm(prob.ir.in2, prob.layout),
                  layout_perm(prob.ir.out, prob.layout))
    return Impl("eqdsl_jax", "jax", jax.jit(fn), jax_fb(fn), perms={"x1": p1, "x2": p2, "out": po},
                note=f"layout {prob.layout}")


def twin_module(prob: Problem, dtype: str, args, module: str):
    """The ir_mul twin's generated ``module`` (``<name>_irmul`` in ``--twins``), checked to be
    ``prob``'s product in the other layout."""
    if prob.spec.mode != "uvu" or prob.layout != "mul_ir":
        raise NotAvailable(NO_TWIN)
    name = prob.name + TWIN_SUFFIX
    meta = read_generated_meta(args.twins, name)
    if not meta:
        raise NotAvailable(f"no twin package {name} in {args.twins} (run benchmarks/layout_twins.py)")
    same = ("IRREPS_IN1", "IRREPS_IN2", "IRREPS_OUT", "INSTRUCTIONS", "PATH_WEIGHTS", "WEIGHT_NUMEL", "SHARED_WEIGHTS",
            "CG_CONVENTION", "OUTPUT_ORDER", "CONV")
    diff = [k for k in same if meta.get(k) != prob.generated_meta.get(k)]
    if diff or meta.get("LAYOUT") != "ir_mul":
        raise NotAvailable(f"twin {name} is not {prob.name} in ir_mul ({', '.join(diff) or 'LAYOUT'}): regenerate it")
    if dtype not in meta.get("DTYPES", ()):
        raise NotAvailable(f"twin {name} is generated without {dtype}")
    return import_generated(args.twins, name, module)


def irmul_perms(prob: Problem) -> dict:
    """Permutations of every operand from reference (mul_ir) to ir_mul columns."""
    return {"x1": layout_perm(prob.ir.in1, "ir_mul"), "x2": layout_perm(prob.ir.in2, "ir_mul"),
            "out": layout_perm(prob.ir.out, "ir_mul")}


def build_eqdsl_torch_irmul(prob: Problem, dtype, device, args) -> Impl:
    fn = twin_module(prob, dtype, args, "torch_ops").tensor_product
    return Impl("eqdsl_torch_irmul", "torch", fn, torch_fb(fn), perms=irmul_perms(prob), note="layout ir_mul")


def build_eqdsl_jax_irmul(prob: Problem, dtype, device, args) -> Impl:
    jax = import_jax()
    fn = twin_module(prob, dtype, args, "jax_ops").tensor_product
    return Impl("eqdsl_jax_irmul", "jax", jax.jit(fn), jax_fb(fn), perms=irmul_perms(prob), note="layout ir_mul")


def oeq_problem(prob: Problem, dtype: str):
    """OpenEquivariance's ``TPProblem`` for ``prob`` (e3nn's arguments; mul_ir)."""
    import numpy as np

    try:
        import openequivariance as oeq
    except Exception as e:  # noqa: BLE001
        raise NotAvailable(f"import openequivariance: {one_line(e)}") from None
    np_dtype = {"float32": np.float32, "float64": np.float64}[dtype]
    return oeq, oeq.TPProblem(
        oeq.Irreps(str(prob.irreps_in1)), oeq.Irreps(str(prob.irreps_in2)), oeq.Irreps(str(prob.irreps_out)),
        [tuple(i) for i in prob.instructions], irrep_normalization=prob.spec.irrep_normalization,
        path_normalization=prob.spec.path_normalization, internal_weights=False, shared_weights=prob.shared,
        irrep_dtype=np_dtype, weight_dtype=np_dtype)


def oeq_weight_perm(module, prob: Problem, device, dtype: str):
    """``p`` with ``w_oeq = w_e3nn[..., p]``: OpenEquivariance's ``reorder_weights_from_e3nn``
    applied to the column numbers (it only permutes columns; checked)."""
    torch = import_torch()
    n = prob.ir.weight_numel
    cols = torch.arange(n, dtype=torch.float64, device=device)
    shape = (n,) if prob.shared else (1, n)
    got = module.reorder_weights_from_e3nn(cols.to(getattr(torch, dtype)).reshape(shape),
                                           has_batch_dim=not prob.shared)
    p = [int(round(float(v))) for v in torch.as_tensor(got).reshape(-1).cpu()]
    if sorted(p) != list(range(n)):
        raise NotAvailable("reorder_weights_from_e3nn is not a column permutation here")
    return None if p == list(range(n)) else p


def build_oeq(prob: Problem, dtype, device, args) -> Impl:
    if device.type != "cuda":
        raise NotAvailable("OpenEquivariance runs on CUDA only")
    oeq, problem = oeq_problem(prob, dtype)
    tp = oeq.TensorProduct(problem, torch_op=True)
    fn = tp.forward
    return Impl("oeq", "torch", fn, torch_fb(fn), perms={"w": oeq_weight_perm(tp, prob, device, dtype)},
                note="openequivariance.TensorProduct, torch_op=True, layout mul_ir")


def e3nn_module(prob: Problem, tdtype, device):
    import torch
    from e3nn import o3

    # Build under the target default dtype: e3nn stores its wigner_3j buffers in the default
    # dtype, and a float32-built module cast to float64 keeps float32-rounded coefficients.
    old = torch.get_default_dtype()
    torch.set_default_dtype(tdtype)
    try:
        m = o3.TensorProduct(prob.irreps_in1, prob.irreps_in2, prob.irreps_out,
                             [tuple(i) for i in prob.instructions],
                             irrep_normalization=prob.spec.irrep_normalization,
                             path_normalization=prob.spec.path_normalization,
                             internal_weights=False, shared_weights=prob.shared)
    finally:
        torch.set_default_dtype(old)
    if m.weight_numel != prob.ir.weight_numel:
        raise NotAvailable(f"e3nn weight_numel {m.weight_numel} != spec's {prob.ir.weight_numel}")
    if m.irreps_out.dim != prob.ir.dim_out:
        raise NotAvailable(f"e3nn dim_out {m.irreps_out.dim} != spec's {prob.ir.dim_out}")
    return m.to(device=device, dtype=tdtype)


def build_e3nn(prob: Problem, dtype, device, args) -> Impl:
    torch = import_torch()
    m = e3nn_module(prob, getattr(torch, dtype), device)
    return Impl("e3nn", "torch", m, torch_fb(m))


def build_e3nn_compile(prob: Problem, dtype, device, args) -> Impl:
    torch = import_torch()
    m = e3nn_module(prob, getattr(torch, dtype), device)
    c = torch.compile(m, dynamic=False)
    return Impl("e3nn_compile", "torch", c, torch_fb(c), note="torch.compile(dynamic=False)")


def _cueq_methods(args, uvu: bool, device) -> list:
    if args.cueq_methods:
        return [m.strip() for m in args.cueq_methods.split(",") if m.strip()]
    if device.type != "cuda":
        return ["naive"]
    return ["uniform_1d", "fused_tp", "naive"] if uvu else ["fused_tp", "naive"]


def build_cueq_candidates(prob: Problem, dtype, device, args, irmul: bool = False):
    """Yield (Impl, None) or (None, reason) for each cuEquivariance method to try, in order."""
    torch = import_torch()
    try:
        import cuequivariance as cue
        import cuequivariance_torch as cuet
    except Exception as e:  # noqa: BLE001
        raise NotAvailable(f"import cuequivariance_torch: {one_line(e)}") from None
    spec = prob.spec
    if spec.irrep_normalization != "component" or spec.path_normalization != "element":
        raise NotAvailable("cuEquivariance supports only component/element normalization")
    if any(float(i[5]) != 1.0 for i in prob.instructions) or not all(i[4] for i in prob.instructions):
        raise NotAvailable("cuEquivariance modules take no user path weights / unweighted paths")
    layout_name = "ir_mul" if irmul else prob.layout
    layout = cue.ir_mul if layout_name == "ir_mul" else cue.mul_ir
    G = "O3"
    i1, i2 = cue.Irreps(G, prob.irreps_in1), cue.Irreps(G, prob.irreps_in2)
    tdtype = getattr(torch, dtype)
    base = {"x1": layout_perm(prob.ir.in1, layout_name), "x2": layout_perm(prob.ir.in2, layout_name)}
    out_layout_perm = layout_perm(prob.ir.out, layout_name)

    if prob.modes == {"uvu"} and spec.mode == "uvu":
        if any(mi.mul != 1 for mi in spec.irreps_in2):
            raise NotAvailable("cuEquivariance's channelwise TP keeps the v index (e3nn uvu sums it): "
                               "needs in2 multiplicities 1")
        filt = [ir for _, ir in cue.Irreps(G, str(spec.irreps_out_filter))]
        # cuEquivariance builds one output block per (i1, i2, ir3 in ir1*ir2 in filter) path, as
        # the spec's uvu mode does, then sorts the blocks (stable) and permutes weight blocks
        # and output blocks alike: sorted position k holds path inv[k].
        unsorted = cue.Irreps(G, [(prob.spec.irreps_out[i[2]].mul, str(prob.spec.irreps_out[i[2]].ir))
                                  for i in prob.instructions])
        _, _perm, inv = unsorted.sort()
        wcols, ocols = [], []
        for k in inv:
            p = prob.ir.paths[k]
            wcols.extend(range(p.weight_offset, p.weight_offset + p.weight_numel))
            b = prob.ir.out[p.i_out]
            ocols.append(b)
        # Output: concatenate the blocks in sorted order, each in the target layout.
        po = []
        for b in ocols:
            d = 2 * b.l + 1
            for t in range(b.mul * d):
                u, m = divmod(t, d) if layout_name == "mul_ir" else divmod(t, b.mul)[::-1]
                po.append(b.offset + u * d + m)
        pw = wcols if wcols != list(range(prob.ir.weight_numel)) else None
        po = po if po != list(range(prob.ir.dim_out)) else None
        for method in _cueq_methods(args, True, device):
            try:
                mod = cuet.ChannelWiseTensorProduct(
                    i1, i2, filt, layout=layout, shared_weights=prob.shared, internal_weights=False,
                    device=device, dtype=tdtype, math_dtype=tdtype, method=method)
                if str(mod.irreps_out) != str(unsorted.sort()[0]) or mod.weight_numel != prob.ir.weight_numel:
                    raise NotAvailable(f"cuEquivariance irreps_out {mod.irreps_out} / weight_numel "
                                       f"{mod.weight_numel} do not match the spec")
                fn = (lambda a, b, w, _m=mod: _m(a, b, w.reshape(1, -1))) if prob.shared else mod
                yield Impl("cueq_irmul" if irmul else "cueq", "torch", fn, torch_fb(fn),
                           perms={**base, "w": pw, "out": po},
                           note=f"ChannelWiseTensorProduct method={method} layout={layout_name}"), None
            except NotAvailable:
                raise
            except Exception as e:  # noqa: BLE001
                yield None, f"method={method}: {one_line(e)}"
    elif prob.modes == {"uvw"} and spec.mode == "uvw":
        o = cue.Irreps(G, prob.irreps_out)
        for method in _cueq_methods(args, False, device):
            try:
                mod = cuet.FullyConnectedTensorProduct(
                    i1, i2, o, layout=layout, shared_weights=prob.shared, internal_weights=False,
                    device=device, dtype=tdtype, math_dtype=tdtype, method=method)
                if mod.weight_numel != prob.ir.weight_numel:
                    raise NotAvailable(f"cuEquivariance weight_numel {mod.weight_numel} != {prob.ir.weight_numel}")
                # Shared weights go in as (1, weight_numel): the docstring says (weight_numel,),
                # but SegmentedPolynomial (0.13, method naive) asserts a leading batch dim.
                fn = (lambda a, b, w, _m=mod: _m(a, b, w.reshape(1, -1))) if prob.shared else mod
                yield Impl("cueq_irmul" if irmul else "cueq", "torch", fn, torch_fb(fn),
                           perms={**base, "out": out_layout_perm},
                           note=f"FullyConnectedTensorProduct method={method} layout={layout_name}"), None
            except NotAvailable:
                raise
            except Exception as e:  # noqa: BLE001
                yield None, f"method={method}: {one_line(e)}"
    else:
        raise NotAvailable(f"modes {sorted(prob.modes)} (explicit instructions) have no cuEquivariance module")


def build_e3nn_jax(prob: Problem, dtype, device, args) -> Impl:
    jax = import_jax()
    import e3nn_jax as e3nn
    from e3nn_jax.legacy import FunctionalTensorProduct

    tp = FunctionalTensorProduct(
        prob.irreps_in1, prob.irreps_in2, prob.irreps_out, [tuple(i) for i in prob.instructions],
        irrep_normalization=prob.spec.irrep_normalization, path_normalization=prob.spec.path_normalization,
        gradient_normalization="path")  # "path": the whole path weight in the forward, as e3nn
    irr1, irr2 = tp.irreps_in1, tp.irreps_in2

    def one(w, a, b):
        return tp.left_right(w, e3nn.IrrepsArray(irr1, a), e3nn.IrrepsArray(irr2, b)).array

    f = jax.vmap(one, in_axes=(None if prob.shared else 0, 0, 0))

    def fn(x1, x2, w):
        return f(w, x1, x2)

    return Impl("e3nn_jax", "jax", jax.jit(fn), jax_fb(fn), note="legacy.FunctionalTensorProduct + vmap")


BUILDERS = {
    "eqdsl_torch": build_eqdsl_torch,
    "eqdsl_jax": build_eqdsl_jax,
    "eqdsl_torch_irmul": build_eqdsl_torch_irmul,
    "eqdsl_jax_irmul": build_eqdsl_jax_irmul,
    "oeq": build_oeq,
    "e3nn": build_e3nn,
    "e3nn_compile": build_e3nn_compile,
    "e3nn_jax": build_e3nn_jax,
}


# ----------------------------------------------------------------------------- inputs


class InputSets:
    """Rotating input sets in reference space, and per-implementation native copies."""

    def __init__(self, prob: Problem, dtype: str, batch: int, device, nsets: int, seed: int):
        torch = import_torch()
        self.torch = torch
        self.prob, self.dtype, self.batch, self.device = prob, dtype, batch, device
        td = getattr(torch, dtype)
        g = torch.Generator(device=device).manual_seed(seed)
        ir = prob.ir
        wshape = (ir.weight_numel,) if prob.shared else (batch, ir.weight_numel)
        self.sets = []
        for _ in range(nsets):
            self.sets.append({
                "x1": torch.randn(batch, ir.dim_in1, generator=g, device=device, dtype=td),
                "x2": torch.randn(batch, ir.dim_in2, generator=g, device=device, dtype=td),
                "w": torch.randn(*wshape, generator=g, device=device, dtype=td),
                "g": torch.randn(batch, ir.dim_out, generator=g, device=device, dtype=td),
            })
        self._native: dict = {}

    @staticmethod
    def count(prob: Problem, dtype: str, batch: int, l2_bytes: int, quick: bool) -> int:
        item = {"float32": 4, "float64": 8}[dtype]
        ir = prob.ir
        per = item * batch * (ir.dim_in1 + ir.dim_in2 + ir.dim_out + (0 if prob.shared else ir.weight_numel))
        if quick:
            return 2
        return max(2, min(8, math.ceil(4 * l2_bytes / max(per, 1))))

    def native(self, impl: Impl):
        """Native operands of every set for ``impl`` (cached by permutations + framework)."""
        key = (impl.framework, tuple((k, None if v is None else id(v)) for k, v in sorted(impl.perms.items())))
        if key in self._native:
            return self._native[key]
        torch = self.torch
        res = []
        for s in self.sets:
            d = {}
            for name, op in (("x1", "x1"), ("x2", "x2"), ("w", "w"), ("g", "out")):
                t = s[name]
                p = impl.perms.get(op)
                if p is not None:
                    t = t.index_select(-1, torch.as_tensor(p, device=t.device)).contiguous()
                d[name] = t
            if impl.framework == "jax":
                d = {k: to_jax(v) for k, v in d.items()}
            res.append(d)
        self._native[key] = res
        return res

    def to_ref(self, impl: Impl, op: str, t):
        """Native tensor of operand ``op`` (x1, x2, w, out) back to reference columns (float64)."""
        torch = self.torch
        if impl.framework == "jax":
            t = from_jax(t, self.device)
        t = t.detach()
        p = impl.perms.get(op)
        if p is not None:
            t = t.index_select(-1, torch.as_tensor(inverse(p), device=t.device))
        return t.to(torch.float64)

    def free(self):
        self.sets.clear()
        self._native.clear()


def to_jax(t):
    jax = import_jax()
    try:
        return jax.dlpack.from_dlpack(t.contiguous())
    except Exception:  # noqa: BLE001
        return jax.device_put(t.detach().cpu().numpy())


def from_jax(a, device):
    torch = import_torch()
    try:
        return torch.from_dlpack(a).to(device)
    except Exception:  # noqa: BLE001
        import numpy as np

        return torch.as_tensor(np.asarray(a), device=device)


# ----------------------------------------------------------------------------- reference


class Reference:
    """e3nn in float64 on the device: forward output and gradients for input set 0."""

    def __init__(self):
        self.modules = {}

    def compute(self, prob: Problem, sets: InputSets, need_grads: bool):
        torch = import_torch()
        if prob.name not in self.modules:
            self.modules[prob.name] = e3nn_module(prob, torch.float64, sets.device)
        m = self.modules[prob.name]
        s = sets.sets[0]
        x1, x2, w = (s[k].detach().to(torch.float64).requires_grad_(need_grads) for k in ("x1", "x2", "w"))
        if need_grads:
            out = m(x1, x2, w)
            grads = torch.autograd.grad(out, (x1, x2, w), s["g"].to(torch.float64))
            return out.detach(), tuple(g.detach() for g in grads)
        with torch.no_grad():
            return m(x1, x2, w), None


def rel_err(a, b) -> float:
    torch = import_torch()
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"shape {tuple(a.shape)} != expected {tuple(b.shape)}")
    if not bool(torch.isfinite(a).all()):
        return float("nan")
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    return num / den if den > 0 else num


# ----------------------------------------------------------------------------- timing


class Timer:
    def __init__(self, device, target_ms: float, quick: bool):
        self.device, self.target, self.quick = device, target_ms / 1e3, quick
        self.min_reps, self.max_reps = (2, 5) if quick else (5, 200)

    def _sync(self):
        torch = import_torch()
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def torch_time(self, call, nsets: int):
        """Median microseconds of ``call(i)``; CUDA events per call (CPU: wall clock)."""
        torch = import_torch()
        self._sync()
        t0 = time.perf_counter()
        call(1 % nsets)
        self._sync()
        est = max(time.perf_counter() - t0, 1e-6)
        for i in range(max(3, min(20, int(0.025 / est)))):  # >= 3: TorchScript's profiling runs
            call(i % nsets)
        self._sync()
        t0 = time.perf_counter()
        call(0)
        self._sync()
        est = max(time.perf_counter() - t0, 1e-6)
        nrep = max(self.min_reps, min(self.max_reps, int(self.target / est)))
        if self.device.type == "cuda":
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(nrep)]
            self._sync()
            for r in range(nrep):
                ev[r][0].record()
                call(r % nsets)
                ev[r][1].record()
            torch.cuda.synchronize()
            samples = [a.elapsed_time(b) * 1e3 for a, b in ev]
        else:
            samples = []
            for r in range(nrep):
                t0 = time.perf_counter()
                call(r % nsets)
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), {"reps": nrep, "min_us": min(samples), "max_us": max(samples),
                                            "method": "cuda_events" if self.device.type == "cuda" else "wall"}

    def jax_time(self, call, nsets: int):
        """Median microseconds per call: wall clock over groups of calls ended by block_until_ready."""
        jax = import_jax()
        t0 = time.perf_counter()
        jax.block_until_ready(call(1 % nsets))
        est = max(time.perf_counter() - t0, 1e-6)
        for i in range(max(3, min(20, int(0.025 / est)))):
            jax.block_until_ready(call(i % nsets))
        t0 = time.perf_counter()
        jax.block_until_ready(call(0))
        est = max(time.perf_counter() - t0, 1e-6)
        group = max(1, min(50, int(0.002 / est) + 1))
        ngroups = max(self.min_reps, min(self.max_reps, int(self.target / (est * group))))
        samples, k = [], 0
        for _ in range(ngroups):
            t0 = time.perf_counter()
            r = None
            for _ in range(group):
                r = call(k % nsets)
                k += 1
            jax.block_until_ready(r)
            samples.append((time.perf_counter() - t0) * 1e6 / group)
        return statistics.median(samples), {"reps": ngroups, "group": group, "min_us": min(samples),
                                            "max_us": max(samples), "method": "wall_block_until_ready"}


def copy_bandwidth(device, log) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), median of 20."""
    torch = import_torch()
    n = (1 << 30) // 4 if device.type == "cuda" else (64 << 20) // 4
    a = torch.randn(n, device=device)
    b = torch.empty_like(a)
    samples = []
    for _ in range(3):
        b.copy_(a)
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            b.copy_(a)
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) / 1e3)
    else:
        for _ in range(5):
            t0 = time.perf_counter()
            b.copy_(a)
            samples.append(time.perf_counter() - t0)
    t = statistics.median(samples)
    bw = 2 * a.numel() * a.element_size() / t
    log(f"copy bandwidth: {bw / 1e9:.0f} GB/s ({2 * a.numel() * 4 / 1e9:.2f} GB read+written in {t * 1e6:.0f} us)")
    del a, b
    return bw


def matmul_flops(device, log, dtype_name: str = "float32"):
    """FLOP/s of a large square matrix product (TF32 off: IEEE float32), median of 10.

    The arithmetic ceiling of the roofline (benchmarks/report.py). 8192^3 on a GPU,
    1024^3 on a CPU; random data (never zeros: they run faster than real data).
    """
    torch = import_torch()
    td = getattr(torch, dtype_name)
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=td)
    b = torch.randn(n, n, device=device, dtype=td)
    samples = []
    for _ in range(3):
        c = a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            c = a @ b
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) / 1e3)
    else:
        for _ in range(3):
            t0 = time.perf_counter()
            c = a @ b
            samples.append(time.perf_counter() - t0)
    t = statistics.median(samples)
    fl = 2 * n**3 / t
    tf32 = f" (tf32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'})" if dtype_name == "float32" else ""
    log(f"matmul {dtype_name} {n}^3{tf32}: {fl / 1e12:.2f} TFLOP/s ({t * 1e6:.0f} us)")
    del a, b, c
    return fl


# ----------------------------------------------------------------------------- main loop


class Bench:
    def __init__(self, args):
        self.args = args
        self.t_start = time.perf_counter()
        self.results = []  # one dict per (problem, dtype, batch, direction, impl)
        self.builds = {}   # (impl, problem, dtype) -> list[Impl] | NotAvailable reason str
        self.cueq_build_failures = set()
        self.warm_target, self.lower_only = None, False  # --warm-only --warm-target (warm_passes)
        self.warm_impl = None  # --warm-only --warm-impl (only_lowers)

    def log(self, msg: str):
        print(f"[{time.perf_counter() - self.t_start:7.1f}s] {msg}", flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def record(self, **kw):
        self.results.append(kw)
        t = kw.get("time_us")
        if t is not None:
            what = f"{t:.1f} us"
        elif kw["status"] in ("warm", "lowered"):
            what = f"{kw['status']}: {kw['first_call_s']:.1f} s"
        else:
            what = f"{kw['status']}: {kw.get('reason', '')}"
        err = f" err={kw['rel_err']:.1e}" if kw.get("rel_err") is not None else ""
        self.log(f"  {kw['problem']} {kw['dtype']} {kw['batch']} {kw['direction']:7s} {kw['impl']:12s} {what}{err}")

    def get_builds(self, name: str, prob: Problem, dtype: str, device):
        """Candidates for an implementation: list of Impl, or a reason string."""
        key = (name, prob.name, dtype)
        if key in self.builds:
            return self.builds[key]
        t0 = time.perf_counter()
        try:
            if name in JAX_IMPLS:
                jax = import_jax()
                if device.type == "cuda" and jax.default_backend() != "gpu":
                    raise NotAvailable(f"jax backend is {jax.default_backend()!r}, not gpu")
            if name in ("cueq", "cueq_irmul"):
                cands, reasons = [], []
                for impl, reason in build_cueq_candidates(prob, dtype, device, self.args, irmul=name == "cueq_irmul"):
                    if impl is not None:
                        cands.append(impl)
                    else:
                        reasons.append(reason)
                if not cands:
                    raise NotAvailable("; ".join(reasons) or "no method")
                if reasons:
                    self.log(f"  build {name} {prob.name} {dtype}: " + "; ".join(reasons))
                    self.cueq_build_failures.update(r[:160] for r in reasons)
                for c in cands:
                    c.note += f" (build failed before: {'; '.join(reasons)})" if reasons else ""
                res = cands
            else:
                res = [BUILDERS[name](prob, dtype, device, self.args)]
        except NotAvailable as e:
            res = str(e)
        except Exception as e:  # noqa: BLE001
            res = one_line(e)
        self.builds[key] = res
        if isinstance(res, str):
            self.log(f"  build {name} {prob.name} {dtype}: n/a: {res}")
        elif time.perf_counter() - t0 > 2:
            self.log(f"  build {name} {prob.name} {dtype}: {time.perf_counter() - t0:.1f}s")
        return res

    def run(self):
        args = self.args
        torch = import_torch()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.device = device
        impls = timed = self.impl_list(device)  # timed: this run's; impls: the table's
        problems = load_problems(args, self.log)
        if args.with_results:
            impls = self.load_results(args.with_results, problems, timed)
        self.meta = self.environment(device, impls, problems)
        if not args.warm_only:
            self.measure_ceilings(device)
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) if device.type == "cuda" else 32 << 20
        self.meta["l2_bytes"] = l2
        timer = Timer(device, args.target_ms or (20.0 if args.quick else 200.0), args.quick)
        batches = self.batch_list(device)
        directions = [d.strip() for d in args.directions.split(",") if d.strip()]
        budget = args.time_budget if args.time_budget is not None else (450.0 if device.type == "cuda" else 1e9)
        passes = []  # importance order: float32 at every batch first, then float64
        for dtype in ("float32", "float64"):
            for batch in batches:
                for prob in problems:
                    if dtype in self.dtypes_for(prob):
                        passes.append((prob, dtype, batch))
        self.log(f"{len(passes)} configurations x {len(directions)} directions x {len(timed)} implementations; "
                 f"device {self.meta['device']}; budget {budget:.0f}s")
        passes = self.warm_passes(passes, lambda p: p[0].name)
        ref = Reference()
        for prob, dtype, batch in passes:
            self.lower_only = self.warm_target is not None and prob.name not in self.warm_target
            if self.elapsed() > budget:
                for direction in directions:
                    for name in timed:
                        self.results.append(dict(problem=prob.name, dtype=dtype, batch=batch, direction=direction,
                                                 impl=name, status="skip", reason="time budget exhausted"))
                continue
            if dtype == "float64" and any(i in JAX_IMPLS for i in timed):
                enable_x64()
            self.log(f"{prob.name} {dtype} batch {batch} ({len(prob.ir.paths)} paths, "
                     f"{prob.bytes_fwd(dtype, batch) / 1e6:.0f} MB fwd floor)")
            try:
                self.run_config(prob, dtype, batch, device, timed, directions, timer, ref, l2, budget)
            except Exception as e:  # noqa: BLE001 - keep going whatever happens
                self.log(f"  config failed: {one_line(e)}")
                traceback.print_exc(limit=3)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if args.warm_only:
            return self.finish_warm()
        return self.finish(problems, impls, directions)

    def init_warm_target(self) -> None:
        """--warm-only --warm-target: the problems to compile (None: all of them)."""
        target = self.args.warm_target
        self.warm_target = None if not (self.args.warm_only and target) else {t.strip() for t in target.split(",")}
        impl = self.args.warm_impl
        self.warm_impl = None if not (self.warm_target and impl) else {i.strip() for i in impl.split(",")}
        self.lower_only = False

    def only_lowers(self, name: str) -> bool:
        """--warm-only: whether implementation ``name`` is lowered, not compiled, in this pass
        (a problem outside --warm-target, or an implementation outside --warm-impl)."""
        return self.lower_only or (self.warm_impl is not None and name not in self.warm_impl)

    def warm_passes(self, passes: list, problem_of) -> list:
        """--warm-target: the passes up to the targets' last one (the others only lowered)."""
        self.init_warm_target()
        if self.warm_target is None:
            return passes
        last = max((i for i, p in enumerate(passes) if problem_of(p) in self.warm_target), default=-1)
        return passes[:last + 1]

    def measure_ceilings(self, device):
        """The copy bandwidth (the memory floor) and the matrix-product rates (the roofline's ceilings)."""
        self.copy_bw = copy_bandwidth(device, self.log)
        self.meta["copy_bandwidth_Bps"] = self.copy_bw
        for dn in ("float32", "float64"):
            try:
                self.meta[f"matmul_{dn}_flops"] = matmul_flops(device, self.log, dn)
            except Exception as e:  # noqa: BLE001
                self.log(f"matmul {dn}: {one_line(e)}")

    def finish_warm(self):
        """--warm-only: one line of first-call seconds per implementation; exit status 1 if any failed."""
        total, failed = {}, []
        for r in self.results:
            if r["status"] in ("warm", "lowered"):
                key = r["impl"] + (" lowered" if r["status"] == "lowered" else "")
                total[key] = total.get(key, 0.0) + r["first_call_s"]
            elif r["status"] != "skip" and r.get("reason") != NO_TWIN:
                failed.append(f"{r['problem']} {r['dtype']} {r['direction']} {r['impl']}: {r.get('reason', '')[:160]}")
        print("warm: " + ", ".join(f"{k} {v:.1f} s" for k, v in total.items()), flush=True)
        for f in failed:
            print(f"  not warmed: {f}", flush=True)
        if failed:
            raise SystemExit(1)
        return None

    def load_results(self, path: str, problems, impls) -> list:
        """Take over the measurements of ``path`` for ``problems`` (``--with-results``);
        returns the implementations of both runs, in ``ALL_IMPLS`` order."""
        names = {p.name for p in problems}
        earlier = json.loads(Path(path).read_text(encoding="utf-8"))
        self.results = [r for r in earlier["results"] if r["problem"] in names and r["impl"] not in impls]
        self.log(f"{len(self.results)} measurements from {path} ({earlier['meta'].get('date', '?')})")
        both = set(earlier["meta"].get("impls", [])) | set(impls)
        return [i for i in ALL_IMPLS if i in both]

    def dtypes_for(self, prob: Problem):
        if self.args.dtypes:
            want = [d.strip() for d in self.args.dtypes.split(",") if d.strip()]
        else:
            want = ["float32"] + (["float64"] if prob.name in FLOAT64_PROBLEMS and not self.args.quick else [])
        return [d for d in want if d in ("float32", "float64")]

    def batch_list(self, device):
        if self.args.batch:
            return [int(b) for b in self.args.batch.split(",") if b.strip()]
        if self.args.quick:
            return [20000] if device.type == "cuda" else [16]
        return [20000, 50000] if device.type == "cuda" else [64]

    def impl_list(self, device):
        if self.args.impls:
            names = [n.strip() for n in self.args.impls.split(",") if n.strip()]
            bad = [n for n in names if n not in ALL_IMPLS]
            if bad:
                raise SystemExit(f"unknown implementation(s) {bad}; known: {ALL_IMPLS}")
            return names
        if device.type != "cuda":
            return [n for n in DEFAULT_IMPLS if n not in GPU_ONLY_IMPLS]
        return list(DEFAULT_IMPLS)

    def run_config(self, prob, dtype, batch, device, impls, directions, timer, ref, l2, budget):
        torch = import_torch()
        nsets = 1 if self.args.warm_only else InputSets.count(prob, dtype, batch, l2, self.args.quick)
        sets = InputSets(prob, dtype, batch, device, nsets, self.args.seed)
        tol = self.args.rtol32 if dtype == "float32" else self.args.rtol64
        base = dict(problem=prob.name, dtype=dtype, batch=batch)
        try:
            need_grads = "fwd+bwd" in directions
            try:
                ref_out, ref_grads = (None, None) if self.args.warm_only else ref.compute(prob, sets, need_grads)
            except Exception as e:  # noqa: BLE001
                reason = f"no reference (e3nn float64): {one_line(e)}"
                for direction in directions:
                    for name in impls:
                        self.record(**base, direction=direction, impl=name, status="n/a", reason=reason)
                return
            for name in impls:
                cands = self.get_builds(name, prob, dtype, device)
                for direction in directions:
                    if self.elapsed() > budget:
                        self.record(**base, direction=direction, impl=name, status="skip",
                                    reason="time budget exhausted")
                        continue
                    if isinstance(cands, str):
                        self.record(**base, direction=direction, impl=name, status="n/a", reason=cands)
                        continue
                    self.measure(base, name, direction, cands, sets, ref_out, ref_grads, tol, timer)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        finally:
            sets.free()
            del sets

    def measure(self, base, name, direction, cands, sets, ref_out, ref_grads, tol, timer):
        """Check then time the first candidate that agrees with the reference."""
        torch = import_torch()
        fails, bad = [], []
        for impl in cands:
            fb = direction == "fwd+bwd"
            if fb and impl.fb is None:
                fails.append(f"no backward: {impl.fb_reason}")
                continue
            try:
                nat = sets.native(impl)
            except Exception as e:  # noqa: BLE001
                fails.append(f"inputs: {one_line(e)}")
                continue
            if impl.framework == "torch":
                if fb:
                    leaves = [{k: (v.detach().requires_grad_(k != "g")) for k, v in d.items()} for d in nat]

                    def call(i, _f=impl.fb, _s=leaves):
                        s = _s[i]
                        return _f(s["x1"], s["x2"], s["w"], s["g"])
                else:
                    def call(i, _f=impl.fwd, _s=nat):
                        s = _s[i]
                        with torch.no_grad():
                            return _f(s["x1"], s["x2"], s["w"])
            else:
                if fb:
                    def call(i, _f=impl.fb, _s=nat):
                        s = _s[i]
                        return _f(s["x1"], s["x2"], s["w"], s["g"])
                else:
                    def call(i, _f=impl.fwd, _s=nat):
                        s = _s[i]
                        return _f(s["x1"], s["x2"], s["w"])
            if self.args.warm_only:
                if self.warm(base, name, direction, call, impl, fails, nat[0]):
                    return
                continue

            def errors():
                res = call(0)
                if fb:
                    out, grads = res
                    errs = [rel_err(sets.to_ref(impl, "out", out), ref_out)]
                    for op, gi, gr in zip(("x1", "x2", "w"), grads, ref_grads):
                        errs.append(rel_err(sets.to_ref(impl, op, gi), gr))
                else:
                    errs = [rel_err(sets.to_ref(impl, "out", res), ref_out)]
                return errs

            # check (the first call also compiles)
            t0 = time.perf_counter()
            try:
                errs = errors()
            except Exception as e:  # noqa: BLE001
                msg = one_line(e)
                if fb and ("autograd" in msg.lower() or "differentiat" in msg.lower() or "vjp" in msg.lower()
                           or "jvp" in msg.lower() or "transpose" in msg.lower()):
                    msg = "no gradient yet: " + msg
                fails.append(msg)
                continue
            first_s = time.perf_counter() - t0
            err = max(errs) if not any(math.isnan(e) for e in errs) else float("nan")
            if not (err <= tol):
                names = ["out", "grad_x1", "grad_x2", "grad_w"]
                which = ",".join(n for n, e in zip(names, errs) if not (e <= tol))
                bad.append((f"rel err {err:.2e} > {tol:.0e} ({which})"
                            + (f" [{impl.note}]" if len(cands) > 1 else ""), err, errs))
                continue
            try:
                tm, stats = (timer.torch_time if impl.framework == "torch" else timer.jax_time)(call, len(nat))
            except Exception as e:  # noqa: BLE001
                fails.append(f"timing: {one_line(e)}")
                continue
            # and again after the timed calls: later calls may take another path than the first
            # (eqdsl torch: the first call goes through Helion, later ones launch Triton directly)
            after = errors()
            err_after = max(after) if not any(math.isnan(e) for e in after) else float("nan")
            if not (err_after <= tol):
                bad.append((f"rel err {err_after:.2e} > {tol:.0e} after the timed calls (first call {err:.1e})",
                            err_after, after))
                continue
            self.record(**base, direction=direction, impl=name, status="ok", time_us=tm, rel_err=max(err, err_after),
                        errs=errs, errs_after=after, first_call_s=first_s, note=impl.note, **stats)
            return
        if bad:
            self.record(**base, direction=direction, impl=name, status="BAD", rel_err=bad[0][1], errs=bad[0][2],
                        reason="; ".join([b[0] for b in bad] + fails))
            return
        self.record(**base, direction=direction, impl=name, status="n/a", reason="; ".join(fails) or "?")

    def warm(self, base, name, direction, call, impl, fails, inputs) -> bool:
        """--warm-only: call once (compiles), wait for it, record the seconds; or, outside
        --warm-target, only lower a JAX function (see --warm-target). False if it raised."""
        t0 = time.perf_counter()
        try:
            if self.only_lowers(name):
                if impl.framework != "jax":
                    return True
                lower_jax(impl, direction, inputs)
            else:
                res = call(0)
                if impl.framework == "jax":
                    import_jax().block_until_ready(res)
                elif self.device.type == "cuda":
                    import_torch().cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            fails.append(one_line(e))
            return False
        self.record(**base, direction=direction, impl=name, status="lowered" if self.only_lowers(name) else "warm",
                    first_call_s=time.perf_counter() - t0, note=impl.note)
        return True

    # ------------------------------------------------------------------------- report

    def environment(self, device, impls, problems):
        meta = {"python": platform.python_version(), "device": "cpu", "impls": impls,
                "problems": [p.name for p in problems], "argv": sys.argv[1:],
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        torch = import_torch()
        meta["torch"] = torch.__version__
        if device.type == "cuda":
            pr = torch.cuda.get_device_properties(0)
            meta["device"] = f"{pr.name}, {pr.multi_processor_count} SMs"
        for mod in ("triton", "helion", "jax", "jaxlib", "e3nn", "e3nn_jax", "cuequivariance",
                    "cuequivariance_torch", "cuequivariance_ops_torch"):
            try:
                if mod in ("jax",) and any(i in JAX_IMPLS for i in impls):
                    m = import_jax()
                else:
                    m = importlib.import_module(mod)
                try:
                    meta[mod] = importlib.metadata.version({"cuequivariance_ops_torch": "cuequivariance-ops-torch-cu13"}
                                                           .get(mod, mod).replace("_", "-"))
                except Exception:  # noqa: BLE001
                    meta[mod] = getattr(m, "__version__", "?")
            except Exception as e:  # noqa: BLE001
                meta[mod] = f"n/a ({one_line(e)})"
        if any(i in JAX_IMPLS for i in impls):
            try:
                meta["jax_backend"] = import_jax().default_backend()
            except Exception as e:  # noqa: BLE001
                meta["jax_backend"] = f"n/a ({one_line(e)})"
        self.log("versions: " + ", ".join(f"{k} {v}" for k, v in meta.items()
                                          if k not in ("impls", "problems", "argv")))
        return meta

    def finish(self, problems, impls, directions):
        by = {}
        for r in self.results:
            by[(r["problem"], r["dtype"], r["batch"], r["direction"], r["impl"])] = r
        probs = {p.name: p for p in problems}
        rows, notes = [], {}
        keys = []
        for r in self.results:
            k = (r["problem"], r["dtype"], r["batch"], r["direction"])
            if k not in keys:
                keys.append(k)
        order = {p.name: i for i, p in enumerate(problems)}
        keys.sort(key=lambda k: (order.get(k[0], 99), k[1], k[2], DIRECTIONS.index(k[3])))

        def cell(r):
            if r is None:
                return "-"
            if r["status"] == "ok":
                t = r["time_us"]
                return f"{t:.1f}" if t < 1000 else f"{t:.0f}"
            tag = {"n/a": "n/a", "BAD": "BAD", "skip": "skip"}.get(r["status"], r["status"])
            reason = r.get("reason", "")
            nk = (r["impl"], tag, reason)
            if nk not in notes:
                notes[nk] = []
            notes[nk].append(f"{r['problem']}/{r['dtype']}/{r['batch']}/{r['direction']}")
            return tag

        def t(r):
            return r["time_us"] if r and r["status"] == "ok" else None

        for k in keys:
            prob = probs[k[0]]
            rs = {i: by.get((*k, i)) for i in impls}
            nbytes = prob.bytes_fwd(k[1], k[2]) if k[3] == "fwd" else prob.bytes_fwd_bwd(k[1], k[2])
            floor_us = nbytes / self.copy_bw * 1e6
            row = {"problem": k[0], "dtype": k[1], "batch": k[2], "direction": k[3],
                   "floor_bytes": nbytes, "floor_us": floor_us,
                   # nominal FLOPs: the IR's count; forward+backward = 4 x forward (three VJPs)
                   "flops": prob.ir.flops_per_batch * k[2] * (1 if k[3] == "fwd" else 4),
                   "times_us": {i: t(rs[i]) for i in impls}, "cells": {i: cell(rs[i]) for i in impls}}
            sp = {}
            for mine in ("eqdsl_torch", "eqdsl_jax"):
                for other in impls:
                    if other.startswith("eqdsl") or t(rs.get(mine)) is None or t(rs.get(other)) is None:
                        continue
                    sp[f"{mine}/{other}"] = t(rs[other]) / t(rs[mine])
                if t(rs.get(mine)) is not None:
                    row[f"{mine}_GBps"] = nbytes / (t(rs[mine]) * 1e-6) / 1e9
                    row[f"{mine}_floor_frac"] = floor_us / t(rs[mine])
            row["speedups"] = sp
            rows.append(row)
        self.print_table(rows, impls, notes)
        out = {"meta": self.meta, "rows": rows, "results": self.results,
               "elapsed_s": self.elapsed()}
        path = self.args.json or (str(Path(os.environ["OUT"]) / "bench_tp.json") if os.environ.get("OUT") else None)
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
            print(f"JSON: {path}", flush=True)
        return out

    def print_table(self, rows, impls, notes):
        def f(x, spec):
            return "-" if x is None else format(x, spec)

        cols = ["problem", "dtype", "batch", "dir"] + [SHORT[i] for i in impls] + [
            "t/e3nn", "t/cueq", "j/e3jax", "t GB/s", "t %fl", "j GB/s", "j %fl", "floor"]
        table = []
        for r in rows:
            sp = r["speedups"]
            line = [r["problem"], r["dtype"].replace("float", "f"), str(r["batch"]), r["direction"]]
            line += [r["cells"][i] for i in impls]
            line += [f(sp.get("eqdsl_torch/e3nn"), ".2f"), f(sp.get("eqdsl_torch/cueq"), ".2f"),
                     f(sp.get("eqdsl_jax/e3nn_jax"), ".2f"),
                     f(r.get("eqdsl_torch_GBps"), ".0f"), f(None if r.get("eqdsl_torch_floor_frac") is None
                                                            else 100 * r["eqdsl_torch_floor_frac"], ".0f"),
                     f(r.get("eqdsl_jax_GBps"), ".0f"), f(None if r.get("eqdsl_jax_floor_frac") is None
                                                          else 100 * r["eqdsl_jax_floor_frac"], ".0f"),
                     f(r["floor_us"], ".1f")]
            table.append(line)
        widths = [max(len(c), *(len(x[j]) for x in table)) if table else len(c) for j, c in enumerate(cols)]
        print()
        if notes:
            print("Not timed (n/a: unavailable or failed; BAD: disagrees with e3nn float64; skip: time budget):")
            for (impl, tag, reason), where in notes.items():
                w = ", ".join(where[:2]) + (f" +{len(where) - 2}" if len(where) > 2 else "")
                r = reason if len(reason) <= 150 else reason[:147] + "..."
                print(f"  {tag} {impl}: {r} [{w}]")
        cq = sorted({(r["problem"], r["impl"], r.get("note", "").split(" (")[0]) for r in self.results
                     if r["impl"].startswith("cueq") and r["status"] == "ok"})
        groups: dict = {}
        for p, i, n in cq:
            groups.setdefault(f"{i}: {n}", []).append(p)
        for n, ps in groups.items():
            print(f"cuEquivariance {n}: {', '.join(dict.fromkeys(ps))}")
        for r in sorted(self.cueq_build_failures):
            print(f"  cuEquivariance method not built: {r}")
        how = "torch: CUDA events" if self.device.type == "cuda" else "torch: wall clock"
        print(f"Plain tensor product on {self.meta['device']}: median us per call "
              f"({how}; jax: wall / block_until_ready); copy bandwidth "
              f"{self.copy_bw / 1e9:.0f} GB/s; floor = minimal bytes / copy bandwidth (us)", flush=True)
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for x in table:
            print("  ".join(c.rjust(w) for c, w in zip(x, widths)))
        print("t/e3nn, t/cueq: eqdsl torch speedup over e3nn / cuEquivariance; j/e3jax: eqdsl jax over "
              "e3nn-jax; GB/s: minimal bytes / time; %fl: floor / time; floor: minimal bytes / copy bandwidth (us).")
        sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    setup_environment(args)
    import warnings

    for cat in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=cat)
    torch = import_torch()
    if not torch.cuda.is_available():
        # The generated Helion kernels run their Triton code in the interpreter on CPU.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    bench = Bench(args)
    bench.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
