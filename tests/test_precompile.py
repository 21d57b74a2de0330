"""benchmarks/precompile.py's planning, checked against the committed generated modules (no GPU, a few seconds).

Covers op_kernels / kernel_lines / needed_ops (every ``helion.kernel`` of a problem is compiled by the
full plan; ``--bench`` keeps the forward and the fused backward, or the three backward ops),
torch_jobs (one job per problem, dtype, op and kernel; argv that names real things), jax_jobs (warm-up
runs with flags the bench scripts accept), schedule, the _OnlyKernel stub and ``main(["--list", ...])``.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "generated"
SPECS = ROOT / "examples" / "specs"
from benchmarks import precompile  # noqa: E402

PROBLEMS = sorted(d.name for d in GEN.iterdir() if (d / "torch_ops.py").is_file())
# (problem, ops module, kernels module, conv) for every generated torch module
MODULES = [(p, m, k, m == "torch_conv.py") for p in PROBLEMS
           for m, k in (("torch_ops.py", "helion_kernels.py"), ("torch_conv.py", "helion_conv_kernels.py"))
           if (GEN / p / m).is_file()]
IDS = [f"{p}/{m}" for p, m, _, _ in MODULES]


@functools.cache
def _read(p, name):
    return (GEN / p / name).read_text(encoding="utf-8")


@functools.cache
def helion_kernels(p, name):
    """Functions of a kernels module decorated with a call to ``helion.kernel``, but the copies
    tuned for one dtype (``<kernel>__<dtype>``: that dtype's code of ``<kernel>``, launched
    under its name)."""
    names = {n.name for n in ast.parse(_read(p, name)).body if isinstance(n, ast.FunctionDef)
             and any(isinstance(d, ast.Call) and ast.unparse(d.func) == "helion.kernel" for d in n.decorator_list)}
    return {n for n in names if n.rpartition("__")[0] not in names}


def launcher_ops(source, conv):
    """The ops a generated torch module has a ``_launch_<op>`` for (``conv_`` prefixed in torch_conv.py)."""
    return [("conv_" if conv else "") + n.name.removeprefix("_launch_") for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("_launch_")]


@pytest.mark.parametrize("p,module,kernels_file,conv", MODULES, ids=IDS)
def test_full_plan_compiles_every_kernel(p, module, kernels_file, conv):
    source, kernels = _read(p, module), helion_kernels(p, kernels_file)
    ops = precompile.needed_ops(source, conv, bench=False)
    assert sorted(ops) == sorted(launcher_ops(source, conv))  # no launcher left out, none invented
    covered = set()
    for op in ops:
        assert re.search(rf"^{op}_op = _(OPS|RADIAL)\.ops\[", source, re.M)  # what run_job calls
        names = precompile.op_kernels(source, op)
        assert names and set(names) <= kernels, op
        covered |= set(names)
    assert covered == kernels
    assert set(precompile.kernel_lines(_read(p, kernels_file))) >= kernels


@pytest.mark.parametrize("p,module,kernels_file,conv", MODULES, ids=IDS)
def test_bench_plan(p, module, kernels_file, conv):
    source = _read(p, module)
    prefix = "conv_" if conv else ""
    fused = "def _launch_bwd(" in source
    want = {prefix + "fwd", prefix + "bwd"} if fused else set(launcher_ops(source, conv))
    assert set(precompile.needed_ops(source, conv, bench=True)) == want
    assert fused or want == {prefix + o for o in (("fwd", "bwd_x", "bwd_y", "bwd_w") if conv else precompile.TP_OPS)}


def test_bench_plan_examples():
    assert set(precompile.needed_ops(_read("mace_large", "torch_ops.py"), False, True)) == {"fwd", "bwd"}
    assert set(precompile.needed_ops(_read("tetris_poly_1", "torch_ops.py"), False, True)) == {
        "fwd", "bwd_x1", "bwd_x2", "bwd_w"}


@functools.cache
def torch_jobs(dtypes=None, conv="with", bench=False, per_kernel=True):
    """precompile.torch_jobs over every problem, cached (each call parses 2.5 MB of kernels)."""
    return precompile.torch_jobs(PROBLEMS, dtypes and list(dtypes), conv, bench, per_kernel, GEN)


def _keys(jobs):
    return [tuple(j.label.split("/")) for j in jobs]


@pytest.mark.parametrize("bench", [False, True])
def test_torch_jobs(bench):
    per_kernel, per_op = torch_jobs(bench=bench), torch_jobs(bench=bench, per_kernel=False)
    keys = _keys(per_kernel)
    assert len(set(keys)) == len(keys) and all(len(k) == 4 for k in keys)
    assert sorted({k[:3] for k in keys}) == sorted(_keys(per_op))  # one per-op job per (problem, dtype, op)
    assert {k[0] for k in keys} == set(PROBLEMS)
    assert {k[0] for k in keys if k[1] == "float64"} == {"mace_large", "nequip_toluene"}
    assert {k[1] for k in keys} == {"float32", "float64"}
    conv_problems = {k[0] for k in keys if k[2].startswith("conv_")}
    with_conv = {p for p in PROBLEMS if (GEN / p / "torch_conv.py").is_file()}
    assert conv_problems == ({"mace_large", "nequip_toluene"} if bench else with_conv)
    if bench:  # bench_conv times float32
        assert all(k[1] == "float32" for k in keys if k[2].startswith("conv_"))
    by_op = {}
    for p, dt, op, k in keys:
        by_op.setdefault((p, dt, op), []).append(k)
    for (p, dt, op), ks in by_op.items():
        module = "torch_conv.py" if op.startswith("conv_") else "torch_ops.py"
        assert ks == precompile.op_kernels(_read(p, module), op)
    assert all(j.cost > 0 for j in per_kernel + per_op)


def test_torch_jobs_filters():
    only32 = _keys(torch_jobs(("float32",), "no", bench=True, per_kernel=False))
    assert {k[1] for k in only32} == {"float32"} and not any(k[2].startswith("conv_") for k in only32)
    assert {k[2] for k in only32} == {"fwd", "bwd", "bwd_x1", "bwd_x2", "bwd_w"}
    # bench_conv times float32 unless told otherwise: float64 conv kernels only when asked for
    asked = _keys(torch_jobs(("float64",), "only", bench=True, per_kernel=False))
    assert asked and {k[1] for k in asked} == {"float64"} and {k[0] for k in asked} == {"mace_large", "nequip_toluene"}
    conv_only = _keys(torch_jobs(conv="only", bench=False, per_kernel=False))
    # and conv_radial's ops where a spec has radial_features
    assert {k[2] for k in conv_only} - set(precompile.RADIAL_OPS) == {
        "conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w", "conv_bwd"}


def test_torch_job_argv_names_real_things():
    for j in torch_jobs():
        argv = list(j.argv)
        assert argv[:2] == [sys.executable, str(ROOT / "benchmarks" / "precompile.py")]
        assert argv[argv.index("--generated") + 1] == str(GEN)
        i = argv.index("--job")
        p, dt, op, kernel = argv[i + 1], argv[i + 2], argv[i + 3], argv[argv.index("--kernel") + 1]
        assert j.label == f"{p}/{dt}/{op}/{kernel}" and dt in ("float32", "float64")
        module, kernels_file = ("torch_conv.py", "helion_conv_kernels.py") if op.startswith("conv_") else (
            "torch_ops.py", "helion_kernels.py")
        source = _read(p, module)
        assert re.search(rf"^def {precompile.launcher_name(op)}\(", source, re.M)
        assert re.search(rf"^{op}_op = ", source, re.M)
        assert kernel in helion_kernels(p, kernels_file)  # op_kernels is checked in test_torch_jobs


def _flags(script):
    return set(re.findall(r"add_argument\(\s*\"(--[a-z-]+)\"", (ROOT / "benchmarks" / script).read_text()))


def test_jax_jobs():
    jobs = precompile.jax_jobs(PROBLEMS, "with", GEN, SPECS)
    with_jax = {p for p in PROBLEMS if (GEN / p / "jax_ops.py").is_file()}
    impls = precompile.JAX_IMPLS.split(",")
    assert {j.label for j in jobs if "/jax/tp/" in j.label} == {f"{p}/jax/tp/{i}" for p in with_jax for i in impls}
    conv = {p for p in with_jax if p in precompile.CONV_PROBLEMS and "def conv(" in _read(p, "jax_ops.py")}
    assert conv == {"mace_large", "nequip_toluene"}
    assert {j.label for j in jobs if "/jax/conv/" in j.label} == {f"{p}/jax/conv/{i}" for p in conv for i in impls}
    assert len(jobs) == len(impls) * (len(with_jax) + len(conv))
    for j in jobs:
        p, _, kind, impl = j.label.split("/")
        script = Path(j.argv[1])
        assert script.is_file() and script.name == ("bench_conv.py" if kind == "conv" else "bench_tp.py")
        # the timed run's problems, order and implementations (no --problems), compiling only this
        # problem's implementation
        assert "--warm-only" in j.argv and j.argv[j.argv.index("--warm-target") + 1] == p
        assert j.argv[j.argv.index("--impls") + 1] == precompile.JAX_IMPLS
        assert j.argv[j.argv.index("--warm-impl") + 1] == impl
        assert "--problems" not in j.argv
        assert {a for a in j.argv if a.startswith("--")} <= _flags(script.name)
        # the timed conv run starts with the latency section: every conv job replays it
        assert ("--latency-impls" in j.argv) == (kind == "conv")
        assert "--no-latency" not in j.argv
    # a subset is passed on, as the timed run is given it (the conv's restricted to its problems)
    sub = precompile.jax_jobs(["nequip_water", "mace_large"], "with", GEN, SPECS, subset=True)
    for j in sub:
        want = "mace_large" if "/jax/conv/" in j.label else "nequip_water,mace_large"
        assert j.argv[j.argv.index("--problems") + 1] == want
    # dtypes are passed on too (harness.sh conv64 times float64 alone)
    for j in precompile.jax_jobs(["mace_large"], "only", GEN, SPECS, subset=True, dtypes=["float64"]):
        assert j.argv[j.argv.index("--dtypes") + 1] == "float64"
    assert all("--dtypes" not in j.argv for j in jobs)
    # harness.sh radial: the conv warm-ups replay bench_conv --radial with its JAX implementations
    from benchmarks import bench_conv
    rad = precompile.jax_jobs(["mace_large"], "only", GEN, SPECS, subset=True, radial=True)
    assert rad and all("--radial" in j.argv for j in rad) and all("--radial" not in j.argv for j in jobs)
    impls = rad[0].argv[rad[0].argv.index("--impls") + 1].split(",")
    assert impls == [i for i in bench_conv.RADIAL_IMPLS if i in bench_conv.JAX_IMPLS]
    assert [j.argv[j.argv.index("--warm-impl") + 1] for j in rad] == impls
    # harness.sh conv64: no latency section in the timed run, none in its warm-ups
    quiet = precompile.jax_jobs(["mace_large"], "only", GEN, SPECS, subset=True, latency=False)
    assert quiet and all("--no-latency" in j.argv and "--latency-impls" not in j.argv for j in quiet)
    assert all("/jax/tp/" in j.label for j in precompile.jax_jobs(PROBLEMS, "no", GEN, SPECS))
    assert all("/jax/conv/" in j.label for j in precompile.jax_jobs(PROBLEMS, "only", GEN, SPECS))


def test_schedule():
    jobs = torch_jobs() + precompile.jax_jobs(PROBLEMS, "with", GEN, SPECS)
    order = precompile.schedule(jobs)
    assert Counter(order) == Counter(jobs)
    assert all(a.cost >= b.cost for a, b in zip(order, order[1:]))
    ties = [precompile.Job(n, (), 5.0) for n in "cab"]
    assert [j.label for j in precompile.schedule(ties)] == ["a", "b", "c"]


def test_only_kernel_stubs_the_others():
    calls = []
    real = types.SimpleNamespace(keep=lambda *a: calls.append(("keep", a)) or "kept",
                                 other=lambda *a: calls.append(("other", a)) or "other")
    only = precompile._OnlyKernel(real, "keep")
    assert only.keep is real.keep and only.keep(1) == "kept"
    assert only.other(1, 2) is None and only.missing(3) is None
    assert calls == [("keep", (1,))]


SYNTHETIC = '''
def _launch_fwd(x, out):
    if x.numel() == 0:
        _k.b(x, out)
        return
    _k.a(x, out)
    _k.b(x, out)
    other.c(x)
    _k.a(x, out)


def _launch_bwd_x(g, out):
    _k.d(g, out)
'''


def test_op_kernels_synthetic():
    assert precompile.op_kernels(SYNTHETIC, "fwd") == ["b", "a"]
    assert precompile.op_kernels(SYNTHETIC, "conv_bwd_x") == ["d"]
    with pytest.raises(ValueError, match="_launch_bwd_w"):
        precompile.op_kernels(SYNTHETIC, "bwd_w")
    assert precompile.kernel_lines(SYNTHETIC) == {"_launch_fwd": 8, "_launch_bwd_x": 2}


def test_main_list(capsys):
    assert precompile.main(["--list", "--bench", "--jax"]) == 0
    lines = capsys.readouterr().out.splitlines()
    jobs = precompile.schedule(torch_jobs(bench=True) + precompile.jax_jobs(PROBLEMS, "with", GEN, SPECS))
    assert lines[:-1] == [f"{j.label} (~{j.cost:.0f} s)" for j in jobs]  # one line per job, in start order
    assert re.fullmatch(rf"{len(jobs)} jobs, ~\d+ s of compiling estimated", lines[-1])


def test_bench_tp_warm_target_lowers_before_and_stops_after(monkeypatch):
    """``bench_tp.py --warm-only --warm-target P`` (what a JAX warm-up job runs): the timed run's
    configurations before P are lowered only, P's are called once (compiled), later ones never
    start; nothing is timed and no reference is computed."""
    from benchmarks import bench_tp

    monkeypatch.setattr(bench_tp.Reference, "compute", lambda *a, **k: pytest.fail("reference computed"))
    monkeypatch.setattr(bench_tp.Timer, "jax_time", lambda *a, **k: pytest.fail("timed"))
    args = bench_tp.parse_args(["--quick", "--warm-only", "--impls", "eqdsl_jax", "--problems",
                                "nequip_water,tetris_poly_1,mace_medium", "--warm-target", "tetris_poly_1"])
    bench = bench_tp.Bench(args)
    bench.run()
    seen = {(r["problem"], r["direction"]): r["status"] for r in bench.results}
    assert seen == {("nequip_water", "fwd"): "lowered", ("nequip_water", "fwd+bwd"): "lowered",
                    ("tetris_poly_1", "fwd"): "warm", ("tetris_poly_1", "fwd+bwd"): "warm"}


def test_bench_tp_warm_impl_compiles_one_implementation(monkeypatch):
    """``--warm-impl I`` (one warm-up job per implementation): of the target problem only I is
    called (compiled); its other implementations are lowered, in the timed run's order, as
    the problems before it are."""
    from benchmarks import bench_tp

    monkeypatch.setattr(bench_tp.Timer, "jax_time", lambda *a, **k: pytest.fail("timed"))
    args = bench_tp.parse_args(["--quick", "--warm-only", "--impls", "eqdsl_jax,e3nn_jax", "--problems",
                                "nequip_water,tetris_poly_1", "--warm-target", "tetris_poly_1",
                                "--warm-impl", "e3nn_jax"])
    bench = bench_tp.Bench(args)
    bench.run()
    seen = {(r["problem"], r["impl"], r["direction"]): r["status"] for r in bench.results}
    assert seen == {(p, i, d): "warm" if (p, i) == ("tetris_poly_1", "e3nn_jax") else "lowered"
                    for p in ("nequip_water", "tetris_poly_1") for i in ("eqdsl_jax", "e3nn_jax")
                    for d in ("fwd", "fwd+bwd")}


def test_bench_plan_of_twins(tmp_path):
    """An ``ir_mul`` twin (``<problem>_irmul``, benchmarks/layout_twins.py) is planned as its problem:
    ``--bench --conv-only`` compiles mace_large's twin conv (float32 only, as bench_conv times it),
    and its plain product in float64 too (bench_tp's float64 rows)."""
    import shutil
    shutil.copytree(GEN / "mace_large", tmp_path / "mace_large_irmul")
    conv = precompile.torch_jobs(["mace_large_irmul"], None, "only", True, False, tmp_path)
    assert conv and {j.label.split("/")[1] for j in conv} == {"float32"}
    assert all(j.label.startswith("mace_large_irmul/float32/conv_") for j in conv)
    plain = precompile.torch_jobs(["mace_large_irmul"], None, "no", True, False, tmp_path)
    assert {j.label.split("/")[1] for j in plain} == {"float32", "float64"}
