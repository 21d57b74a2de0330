"""benchmarks/report.py on synthetic JSON, and bench_conv's graph builders (no GPU, a few seconds)."""

from __future__ import annotations

import importlib
import json
from collections import Counter

import numpy as np
import pytest


def _load(name):
    """``benchmarks.<name>``, imported on first use (bench_conv imports bench_tp's harness)."""
    return importlib.import_module(f"benchmarks.{name}")


META = {"device": "NVIDIA H100 80GB HBM3, 132 SMs", "date": "2026-11-22T15:00:00+00:00", "torch": "2.11.0",
        "copy_bandwidth_Bps": 3.0e12, "matmul_float32_flops": 5.0e13,
        "impls": ["eqdsl_torch", "eqdsl_jax", "e3nn", "cueq", "e3nn_jax"]}


def _synthetic(tmp_path):
    times = {"eqdsl_torch": 400.0, "eqdsl_jax": None, "e3nn": 4000.0, "cueq": 800.0, "e3nn_jax": 1600.0}
    tp = {"meta": META, "rows": [{"problem": "mace_large", "dtype": "float32", "batch": 20000, "direction": "fwd",
                                  "floor_bytes": 10**9, "floor_us": 333.3, "flops": 2 * 10**9, "times_us": times}],
          "results": [{"problem": "mace_large", "dtype": "float32", "batch": 20000, "direction": "fwd", "impl": k,
                       "status": "ok" if v else "n/a", "time_us": v, "reason": "" if v else "no conv yet"}
                      for k, v in times.items()]}
    ctimes = dict(times, cueq=None)
    conv = {"meta": dict(META, what="fused graph convolution"),
            "graphs": {"rand512x64": {"desc": "random", "num_edges": 32768, "max_in_degree": 64, "builder": "numpy"}},
            "rows": [{"problem": "mace_large", "dtype": "float32", "graph": "rand512x64", "num_nodes": 512,
                      "num_edges": 32768, "direction": "fwd+bwd", "floor_bytes": 9 * 10**8, "floor_us": 300.0,
                      "flops": 10**10, "times_us": ctimes}],
            "results": [{"problem": "mace_large", "dtype": "float32", "batch": "rand512x64", "graph": "rand512x64",
                         "direction": "fwd+bwd", "impl": k, "status": "ok" if v else "BAD", "time_us": v,
                         "reason": "" if v else "rel err 1e-2 > 1e-04 (grad_x1)"} for k, v in ctimes.items()],
            "latency": {"graph": {"desc": "Si 32 atoms", "num_edges": 512},
                        "rows": [{"problem": "mace_large", "impl": "e3nn_jax", "direction": "fwd", "status": "ok",
                                  "wall_sync_us": 172.0, "host_us": 20.0, "pipelined_us": 150.0, "rel_err": 1e-7},
                                 {"problem": "mace_large", "impl": "eqdsl_torch", "direction": "fwd",
                                  "status": "n/a", "reason": "no conv yet"}]}}
    paths = []
    for name, d in (("bench_tp.json", tp), ("bench_conv.json", conv)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(d))
    return paths


def test_report_writes_markdown_and_roofline(tmp_path):
    pytest.importorskip("matplotlib")
    report = _load("report")
    tp, conv = _synthetic(tmp_path)
    out, png = tmp_path / "BENCHMARKS.md", tmp_path / "img" / "roofline.png"
    assert report.main([str(tp), str(conv), "--out", str(out), "--png", str(png)]) == 0
    md = out.read_text()
    assert png.stat().st_size > 1000
    assert "](img/roofline.png)" in md
    for section in ("## Environment", "## Roofline", "## Plain tensor product", "## Fused convolution",
                    "## Small-graph latency"):
        assert section in md
    # ratios (e3nn, cuEq best, OEQ: not run, e3nn-jax), GB/s, % of floor
    assert "| **eqdsl torch** | 400 | 10.00x | 2.00x | - | 4.00x | 2500 | 83% |" in md
    assert "BAD **cuEquivariance (mul_ir)**: rel err 1e-2" in md
    assert "n/a **eqdsl torch** fwd: no conv yet" in md
    assert "5000 GB/s" not in md and "3000 GB/s" in md


def test_report_has_one_latency_table_per_file(tmp_path):
    """``--latency A B``: a table per file, each naming its problem."""
    pytest.importorskip("matplotlib")
    report = _load("report")
    lat = json.loads(_synthetic(tmp_path)[1].read_text())["latency"]
    paths = []
    for problem, host in (("mace_large", 20.0), ("nequip_water", 7.5)):
        rows = [dict(lat["rows"][0], problem=problem, host_us=host)]
        paths.append(tmp_path / f"lat_{problem}.json")
        paths[-1].write_text(json.dumps({"meta": dict(META, what="small-graph latency"), "graph": lat["graph"],
                                         "rows": rows}))
    out = tmp_path / "B.md"
    assert report.main(["--latency", *map(str, paths), "--out", str(out), "--png", str(tmp_path / "r.png")]) == 0
    md = out.read_text().split("## Small-graph latency", 1)[1]
    assert "problem mace_large, float32" in md and "problem nequip_water, float32" in md
    assert "| e3nn-jax | fwd | 172 | 20.0 | 150 |" in md and "| e3nn-jax | fwd | 172 | 7.5 | 150 |" in md


def test_latency_rows_eqdsl_loses_are_listed_with_their_reasons():
    """A latency row where eqdsl (at its faster layout) takes more wall time than an anchor at its
    best is listed under the table with its reason; rows it wins are not."""
    report = _load("report")

    def row(impl, direction, wall):
        return {"problem": "mace_large", "impl": impl, "direction": direction, "status": "ok",
                "wall_sync_us": wall, "host_us": wall / 2, "pipelined_us": wall, "rel_err": 1e-7}

    d = {"graph": {"desc": "Si 32 atoms", "num_edges": 512},
         "rows": [row("eqdsl_torch", "fwd", 300.0), row("eqdsl_jax", "fwd", 120.0), row("e3nn_jax", "fwd", 250.0),
                  row("eqdsl_torch", "fwd+bwd", 900.0), row("cueq", "fwd+bwd", 950.0), row("cueq_irmul", "fwd+bwd", 800.0),
                  row("eqdsl_jax", "fwd+bwd", 200.0)]}
    lost = {r["key"]: r for r in report.latency_slower_rows(d)}
    assert set(lost) == {"latency/mace_large/fwd/eqdsl_torch", "latency/mace_large/fwd+bwd/eqdsl_torch"}
    assert [(a, member) for a, _, member, _ in lost["latency/mace_large/fwd+bwd/eqdsl_torch"]["anchors"]] \
        == [("cueq", "cueq_irmul")]
    text = "\n".join(report.latency_table(d, {"latency/mace_large/fwd/eqdsl_torch": "host-bound: measured"}))
    assert "- `latency/mace_large/fwd/eqdsl_torch` (eqdsl torch, 300 µs wall): slower than e3nn-jax: host-bound" in text
    assert "`latency/mace_large/fwd+bwd/eqdsl_torch` (eqdsl torch, 900 µs wall): slower than cuEq best: reason " \
           "not measured yet" in text
    assert "eqdsl_jax`" not in text


def test_report_survives_missing_inputs(tmp_path):
    pytest.importorskip("matplotlib")
    report = _load("report")
    out = tmp_path / "B.md"
    assert report.main(["--tp", str(tmp_path / "missing.json"), "--out", str(out), "--png", str(tmp_path / "r.png")]) == 0
    assert "No tensor-product JSON given." in out.read_text()


@pytest.mark.parametrize("element,reps,cutoff", [("Si", (2, 2, 1), 4.0), ("Si", (2, 2, 2), 5.0), ("C", (1, 1, 1), 5.0)])
def test_diamond_fallback_matches_ase(element, reps, cutoff):
    pytest.importorskip("scipy")
    ase_nl = pytest.importorskip("ase.neighborlist")
    from ase.build import bulk

    bc = _load("bench_conv")
    i, j, n = bc._diamond_pairs_scipy(bc.LATTICE[element], reps, cutoff)
    atoms = bulk(element, "diamond", a=bc.LATTICE[element], cubic=True).repeat(reps)
    i2, j2 = ase_nl.neighbor_list("ij", atoms, cutoff)
    assert n == len(atoms)
    assert Counter(zip(i.tolist(), j.tolist())) == Counter(zip(i2.tolist(), j2.tolist()))


def test_random_graph_is_dst_sorted_with_fixed_in_degree():
    bc = _load("bench_conv")
    g = bc.random_graph("g", 64, 8, 0)
    assert g.num_edges == 512 and np.all(np.diff(g.dst) >= 0)
    assert np.all(np.bincount(g.dst, minlength=64) == 8) and g.src.min() >= 0 and g.src.max() < 64


def test_merge_replaces_rows_and_keeps_one_date_range():
    """A later file's rows replace the earlier file's rows of the same (problem, dtype, batch);
    merging an already merged file keeps one ``first to last`` date range."""
    mj = _load("merge_json")

    def bench(date, rows):
        return {"meta": {"date": date, "argv": ["--x"]}, "rows": rows, "results": [], "elapsed_s": 1.0}

    row = lambda p, t: {"problem": p, "dtype": "float32", "batch": 20000, "t": t}  # noqa: E731
    first = mj.merge([bench("2026-11-23T02:00", [row("a", 1), row("b", 2)]), bench("2026-11-23T05:00", [row("b", 3)])],
                     ["c1", "c2"])
    assert first["meta"]["date"] == "2026-11-23T02:00 to 2026-11-23T05:00"
    again = mj.merge([first, bench("2026-11-23T08:00", [row("a", 4)])], ["merged", "c3"])
    assert again["meta"]["date"] == "2026-11-23T02:00 to 2026-11-23T08:00"
    assert sorted((r["problem"], r["t"]) for r in again["rows"]) == [("a", 4), ("b", 3)]
    assert again["meta"]["argv"] == ["c1: --x", "c2: --x", "c3: --x"]


def test_merge_names_every_card_and_stamps_each_row_with_its_own():
    """Rows of calls on different cards keep their card; the meta names both (one card: unchanged)."""
    mj = _load("merge_json")

    def bench(device, rows):
        return {"meta": {"date": "2026-12-07T17:00", "device": device, "argv": []}, "rows": rows,
                "results": [dict(r, impl="x") for r in rows], "elapsed_s": 1.0}

    row = lambda g: {"problem": "p", "dtype": "float64", "graph": g}  # noqa: E731
    one = mj.merge([bench("H100", [row("bulk")]), bench("H100", [row("rand")])], ["c1", "c2"])
    assert one["meta"]["device"] == "H100"
    two = mj.merge([one, bench("H200", [row("rand"), row("small")])], ["merged", "c3"])
    assert two["meta"]["device"] == "H100, H200"
    assert {(r["graph"], r["device"]) for r in two["rows"]} == {("bulk", "H100"), ("rand", "H200"), ("small", "H200")}
    assert {(r["graph"], r["device"]) for r in two["results"]} == {("bulk", "H100"), ("rand", "H200"), ("small", "H200")}


def test_report_names_the_card_of_rows_from_another_card(tmp_path):
    """A conv table merged from calls on two cards: the rows of the rarer card name it, the others don't."""
    report, mj = _load("report"), _load("merge_json")
    _, conv_path = _synthetic(tmp_path)
    h100 = json.loads(conv_path.read_text())
    other = json.loads(json.dumps(h100))
    other["meta"]["device"] = "NVIDIA H200"
    other["graphs"] = {"bulk": dict(h100["graphs"]["rand512x64"], desc="bulk")}
    for r in other["rows"] + other["results"]:
        r["graph"] = r["batch"] = "bulk"
    for k in ("rows", "results"):  # a second H100 configuration: H100 is the usual card
        h100[k] += [dict(r, dtype="float64") for r in h100[k]]
    merged = mj.merge([h100, other], ["c1", "c2"])
    ms = report.measurements({"conv": (None, merged)}, "conv")
    text = "\n".join(report.perf_tables(ms, "conv"))
    assert "bulk (512 / 32768), NVIDIA H200" in text
    assert "rand512x64 (512 / 32768) |" in text and "rand512x64 (512 / 32768), NVIDIA" not in text


def test_report_startup_and_small_graph_sections(tmp_path):
    """``--startup`` (two files: the second's row of a target replaces the first's) and
    ``--small-graph``: rows, targets met / missed, n/a reasons; bench_startup's own row builder
    makes the startup rows from step results."""
    pytest.importorskip("matplotlib")
    report, bs = _load("report"), _load("bench_startup")
    meta = {"what": "start-up", "device": "NVIDIA H100", "date": "2026-11-26T16:00:00+00:00", "problem": "mace_large"}
    steps1 = [{"step": "torch_cubins", "status": "n/a", "reason": "mace_large/cubins/ absent"},
              {"step": "family", "status": "ok", "first_results_s": 75.5, "parts": {"tp fwd": 20.0, "conv fwd": 55.5},
               "kernels": {"kernels": ["a", "b"], "compiled": ["a"], "missing": ["b"]}},
              {"step": "jax", "status": "ok", "tp_s": 9.5, "conv_s": 21.0, "parts": {"tp fwd": 4.0}}]
    steps2 = [{"step": "torch_cubins", "status": "ok", "first_results_s": 1.25, "parts": {"fwd": 0.5, "bwd": 0.5,
                                                                                          "dbl": 0.25}}]
    paths = []
    for i, steps in enumerate((steps1, steps2)):
        paths.append(tmp_path / f"startup{i}.json")
        paths[-1].write_text(json.dumps({"meta": dict(meta, jobs=3 - 2 * i), "steps": steps,
                                         "rows": bs.target_rows(steps)}))
    small = {"meta": {"problem": "mace_large", "atoms": 32, "edges": 512, "dtype": "float32", "device": "NVIDIA H100",
                      "date": "2026-11-26", "steps": 300, "step": "positions -> conv -> energy; forces"},
             "steps": [{"impl": "torch_graph", "status": "ok", "median_us": 88.0, "pipelined_us": 60.0,
                        "target_us": 100.0, "met": "met", "rel_err": 2e-7},
                       {"impl": "jax_jit", "status": "ok", "median_us": 170.0, "pipelined_us": 150.0,
                        "target_us": 100.0, "met": "missed", "rel_err": 3e-7, "note": "jax_ops.conv"},
                       {"impl": "torch_compile", "status": "n/a", "target_us": None,
                        "reason": "BackendCompilerFailed: boom"}],
             "host": [{"impl": "eqdsl", "case": "conv, no grad, check=False", "host_us": 12.5, "pipelined_us": 40.0,
                       "target_us": 15.0, "met": "met"}]}
    (tmp_path / "small.json").write_text(json.dumps(small))
    out = tmp_path / "B.md"
    assert report.main(["--startup", *map(str, paths), "--small-graph", str(tmp_path / "small.json"),
                        "--out", str(out), "--png", str(tmp_path / "r.png")]) == 0
    md = out.read_text()
    start = md.split("## Start-up", 1)[1].split("## Small graph", 1)[0]
    assert "| torch: conv first fwd + bwd + double bwd, built cubins | 1.25 | ≤ 2 | met | fwd 0.50, bwd 0.50, dbl 0.25 |" in start
    assert "| torch: whole op family JIT, one process | 75.50 | ≤ 60 | **missed** |" in start
    assert "| jax: tensor_product first fwd + bwd | 9.50 | ≤ 15 | met |" in start
    assert "| jax: conv first fwd + bwd | 21.00 | ≤ 15 | **missed** |" in start
    assert "3 steps at once" in start
    assert start.count("built cubins") == 1 and "cubins/ absent" not in start  # the second file's row replaced it
    assert "1 of 2 kernels of the package compiled in the run (not: b)" in start
    small_md = md.split("## Small graph", 1)[1]
    assert "| `torch_graph` | 88.0 | 60.0 | ≤ 100 | met | 2.0e-07 |" in small_md
    assert "| `jax_jit` | 170 | 150 | ≤ 100 | **missed** | 3.0e-07 |" in small_md
    assert "| `torch_compile` | n/a | - | - | - | - |" in small_md and "BackendCompilerFailed: boom" in small_md
    assert "| eqdsl | conv, no grad, check=False | 12.5 | 40.0 | ≤ 15 | met |" in small_md


def test_report_anchors_at_their_best_and_lost_rows(tmp_path):
    """cuEquivariance's column is its faster layout; a row eqdsl loses is listed with its reason."""
    pytest.importorskip("matplotlib")
    report = _load("report")
    tp_path = _synthetic(tmp_path)[0]
    tp = json.loads(tp_path.read_text())
    extra = {"cueq_irmul": 500.0, "oeq": 300.0}
    tp["results"] += [dict(tp["results"][0], impl=k, time_us=v, status="ok") for k, v in extra.items()]
    tp["rows"][0]["times_us"].update(extra)
    tp["meta"] = dict(tp["meta"], impls=tp["meta"]["impls"] + list(extra))
    tp_path.write_text(json.dumps(tp))
    key = "mace_large/float32/20000/fwd/eqdsl_torch"
    reasons = tmp_path / "reasons.json"
    reasons.write_text(json.dumps({key: "measured: 40 registers short"}))
    out = tmp_path / "B.md"
    assert report.main(["--tp", str(tp_path), "--out", str(out), "--png", str(tmp_path / "r.png"),
                        "--reasons", str(reasons)]) == 0
    md = out.read_text()
    # cuEq best = min(800 mul_ir, 500 ir_mul) = 500 -> 1.25x; OEQ 300 -> 0.75x
    assert "| **eqdsl torch** | 400 | 10.00x | 1.25x | 0.75x | 4.00x |" in md
    assert "| cuEquivariance (ir_mul) | 500 | 8.00x | - | 0.60x | 3.20x |" in md
    assert f"- `{key}` (eqdsl torch, 400 µs): slower than OEQ: measured: 40 registers short" in md



def test_ncu_cases_of_unexplained_rows(tmp_path):
    """``tools/ncu_missing.py`` lists a case for each lost row with no reason: the losing eqdsl
    framework's faster layout and the fastest member of each anchor that beat it; explained rows
    and rows eqdsl wins are left out, and conv cases carry their graph."""
    ncu_missing = _load("tools.ncu_missing")
    report = _load("report")
    tp_path, conv_path = _synthetic(tmp_path)[:2]
    tp = json.loads(tp_path.read_text())
    extra = {"eqdsl_torch_irmul": 350.0, "cueq_irmul": 500.0, "oeq": 300.0, "eqdsl_jax_irmul": 250.0}
    tp["results"] += [dict(tp["results"][0], impl=k, time_us=v, status="ok") for k, v in extra.items()]
    tp["rows"][0]["times_us"].update(extra)
    tp["meta"] = dict(tp["meta"], impls=tp["meta"]["impls"] + list(extra))
    tp_path.write_text(json.dumps(tp))
    args = report.parse_args(["--tp", str(tp_path), "--conv", str(conv_path)])
    data = report.load_inputs(args)
    # torch at its faster layout (ir_mul, 350) loses to OEQ (300); jax (ir_mul, 250) wins;
    # conv: eqdsl torch 400 loses to nothing timed but e3nn (4000): no case
    assert ncu_missing.ncu_cases(data, {}) == [":mace_large:float32:fwd:eqdsl_torch_irmul,oeq"]
    assert ncu_missing.ncu_cases(data, {"mace_large/float32/20000/fwd/eqdsl_torch": "measured"}) == []
    # --all: explained rows are profiled again (measured on earlier kernels)
    assert ncu_missing.ncu_cases(data, {"mace_large/float32/20000/fwd/eqdsl_torch": "measured"}, every=True) \
        == [":mace_large:float32:fwd:eqdsl_torch_irmul,oeq"]
    conv = json.loads(conv_path.read_text())
    conv["rows"][0]["times_us"]["cueq_irmul"] = 100.0
    conv["results"].append(dict(conv["results"][0], impl="cueq_irmul", time_us=100.0, status="ok"))
    conv["meta"] = dict(conv["meta"], impls=conv["meta"]["impls"] + ["cueq_irmul"])
    conv_path.write_text(json.dumps(conv))
    cases = ncu_missing.ncu_cases(report.load_inputs(args), {"mace_large/float32/20000/fwd/eqdsl_torch": "x"})
    assert cases == ["rand512x64:mace_large:float32:fwd+bwd:eqdsl_torch,cueq_irmul"]
    # the unexplained rows come first
    cases = ncu_missing.ncu_cases(report.load_inputs(args), {"mace_large/float32/20000/fwd/eqdsl_torch": "x"}, True)
    assert cases == ["rand512x64:mace_large:float32:fwd+bwd:eqdsl_torch,cueq_irmul",
                     ":mace_large:float32:fwd:eqdsl_torch_irmul,oeq"]
    # a reason measured on the table's kernels (--current) is not profiled again; an older one is
    fresh = {"mace_large/float32/20000/fwd/eqdsl_torch": "ncu (s21, H100): x"}
    assert ncu_missing.ncu_cases(report.load_inputs(args), fresh, True, current="ncu (s21,") \
        == ["rand512x64:mace_large:float32:fwd+bwd:eqdsl_torch,cueq_irmul"]
    assert ncu_missing.ncu_cases(report.load_inputs(args), fresh, True, current="ncu (s22,") == cases

def test_report_symmetric_section(tmp_path):
    """``--symmetric ELEMENTS=LOG``: the bench log's date, device and RESULT lines become rows,
    eqdsl's ratios against cuEquivariance of the same log and dtype (time of cuEq / time of eqdsl)."""
    report = _load("report")
    result = {"cueq_float32": {"fwd": 8.0, "fwd+bwd": 16.0, "forces": 20.0},
              "eqdsl_mp_mul_ir_float32": {"fwd": 2.0, "fwd+bwd": 8.0, "forces": 25.0, "floor_us": 9.5}}
    log = tmp_path / "sym.log"
    log.write_text("date 2026-11-27 01:50 UTC\ndevice NVIDIA H100 80GB HBM3, torch 2.11.0\nnoise\n"
                   f"RESULT {json.dumps(result)}\n")
    md = "\n".join(report.symmetric_section([f"10={log}"]))
    assert "run: 2026-11-27 01:50 UTC" in md and "NVIDIA H100 80GB HBM3" in md
    row = next(ln for ln in md.splitlines() if "eqdsl (mul_ir)" in ln)
    assert [c.strip() for c in row.strip("|").split("|")] == \
        ["10", "float32", "eqdsl (mul_ir)", "2.00", "8.00", "25.00", "4.00x", "2.00x", "0.80x", "9.5"]
    (tmp_path / "empty.log").write_text("device X\n")
    assert "no RESULT line" in "\n".join(report.symmetric_section([f"10={tmp_path / 'empty.log'}"]))
