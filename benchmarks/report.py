#!/usr/bin/env python3
"""Write BENCHMARKS.md (and a roofline PNG) from the benchmark JSON files.

    python benchmarks/report.py --tp bench_tp.json --conv bench_conv.json --latency bench_latency.json

or the same files as positional arguments (each recognised by its contents). Every input
is optional: a missing one gives a section that says so. Outputs: ``--out`` (default
<repo>/BENCHMARKS.md) and ``--png`` (default <repo>/benchmarks/roofline.png, linked from
the Markdown by its relative path).

What the tables show, per problem: the median time of every implementation measured in
that run, its speedup over each anchor measured in the same run (anchor time / its
time: e3nn; cuEquivariance at its best layout, the faster of its ``mul_ir`` and ``ir_mul``
runs; OpenEquivariance; e3nn-jax), achieved bandwidth (the fewest bytes the pass must
move / time) and the fraction of the memory floor (floor time / time, where floor =
those bytes / the copy bandwidth measured in the same run). The roofline plots achieved
FLOP/s (nominal FLOPs from eqdsl.lower / time) against arithmetic intensity (nominal
FLOPs / those bytes), under the measured copy-bandwidth and fp32 matrix-product ceilings,
float32 points only.

Needs only the standard library and matplotlib (numpy through it); eqdsl only for JSON
files written before the benchmarks recorded FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (anchor, column label, the implementations it stands for: the fastest of them in each row)
ANCHORS = [("e3nn", "e3nn", ("e3nn",)), ("cueq", "cuEq best", ("cueq", "cueq_irmul")), ("oeq", "OEQ", ("oeq",)),
           ("e3nn_jax", "e3nn-jax", ("e3nn_jax",))]
# conv_radial tables also compare with eqdsl's own unfused path (matmul + conv)
UNFUSED_ANCHOR = ("eqdsl_unfused", "eqdsl unfused", ("eqdsl_torch_unfused", "eqdsl_jax_unfused"))
IMPL_ORDER = ["eqdsl_torch", "eqdsl_torch_irmul", "eqdsl_torch_unfused", "eqdsl_jax", "eqdsl_jax_irmul",
              "eqdsl_jax_unfused", "e3nn", "e3nn_compile", "cueq",
              "cueq_irmul", "oeq", "e3nn_jax"]
IMPL_LABEL = {"eqdsl_torch": "eqdsl torch", "eqdsl_jax": "eqdsl jax", "eqdsl_torch_irmul": "eqdsl torch (ir_mul)",
              "eqdsl_jax_irmul": "eqdsl jax (ir_mul)", "eqdsl_torch_unfused": "eqdsl torch conv (unfused)",
              "eqdsl_jax_unfused": "eqdsl jax conv (unfused)", "e3nn": "e3nn", "e3nn_compile": "e3nn compiled",
              "cueq": "cuEquivariance (mul_ir)", "cueq_irmul": "cuEquivariance (ir_mul)", "oeq": "OpenEquivariance",
              "e3nn_jax": "e3nn-jax"}
COLORS = {"eqdsl_torch": "tab:red", "eqdsl_jax": "tab:orange", "eqdsl_torch_irmul": "tab:brown",
          "eqdsl_jax_irmul": "tab:pink", "eqdsl_torch_unfused": "salmon", "eqdsl_jax_unfused": "gold", "e3nn": "tab:blue", "e3nn_compile": "tab:cyan", "cueq": "tab:green",
          "cueq_irmul": "tab:olive", "oeq": "tab:gray", "e3nn_jax": "tab:purple"}
META_KEYS = [("device", "device"), ("date", "date (UTC)"), ("copy_bandwidth_Bps", "copy bandwidth"),
             ("matmul_float32_flops", "fp32 matmul (TF32 off)"), ("matmul_float64_flops", "fp64 matmul"),
             ("python", "python"), ("torch", "torch"), ("triton", "triton"), ("helion", "helion"), ("jax", "jax"),
             ("jaxlib", "jaxlib"), ("jax_backend", "jax backend"), ("e3nn", "e3nn"), ("e3nn_jax", "e3nn-jax"),
             ("cuequivariance", "cuequivariance"), ("cuequivariance_torch", "cuequivariance-torch"),
             ("cuequivariance_ops_torch", "cuequivariance-ops-torch"), ("argv", "arguments")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="JSON files (kind recognised from the contents)")
    p.add_argument("--tp", help="bench_tp.json")
    p.add_argument("--conv", help="bench_conv.json")
    p.add_argument("--radial", help="bench_radial.json (bench_conv.py --radial: conv_radial)")
    p.add_argument("--latency", nargs="+", help="bench_latency.json files, one table each (default: the latency "
                   "section of --conv, if any)")
    p.add_argument("--notes", nargs="+", help="Markdown files inserted, in order, as the 'Notes on these runs' section")
    p.add_argument("--mace", nargs="+", help="bench_mace.json files (MACE end to end), rows taken in order")
    p.add_argument("--mace-products", nargs="+", help="bench_mace.json files of a run with the symmetric "
                   "contraction (impl eqdsl_products): their own table, rows taken in order")
    p.add_argument("--scaling", help="bench_scaling.json (several GPUs)")
    p.add_argument("--startup", nargs="+", help="bench_startup.json files (start-up times; a later file's row of "
                   "the same target replaces an earlier one's)")
    p.add_argument("--small-graph", help="bench_small_graph.json (energy + forces per step, host overhead per call)")
    p.add_argument("--reasons", help="JSON {\"[radial/]problem/dtype/config/direction/eqdsl_torch|eqdsl_jax\" or "
                   "\"latency/problem/direction/eqdsl_torch|eqdsl_jax\": why eqdsl is slower than an anchor there "
                   "(measured, e.g. with ncu)}: printed under each table beside the rows eqdsl loses")
    p.add_argument("--symmetric", nargs="+", metavar="ELEMENTS=LOG",
                   help="logs of benchmarks/tools/symmetric_torch_bench.py (its RESULT line), each with its element "
                        "count, e.g. 10=sym_e10.log")
    p.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    p.add_argument("--png", default=str(ROOT / "benchmarks" / "roofline.png"))
    return p.parse_args(argv)


def kind_of(d: dict) -> str:
    what = str(d.get("meta", {}).get("what", ""))
    if "conv_radial" in what:
        return "radial"
    if "latency" in what or ("graph" in d and "rows" in d and "results" not in d):
        return "latency"
    if "convolution" in what or "graphs" in d:
        return "conv"
    return "tp"


def load_inputs(args):
    data = {}

    def read(path):
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"warning: {path}: {type(e).__name__}: {e}; its section will say so", file=sys.stderr)
            return None

    for k in ("tp", "conv", "radial"):
        if getattr(args, k):
            d = read(getattr(args, k))
            if d is not None:
                data[k] = (getattr(args, k), d)
    # (path, json, [the further latency JSONs]): one table each, the first one's metadata
    latency = [(path, d) for path, d in ((p, read(p)) for p in args.latency or []) if d is not None]
    if latency:
        data["latency"] = (*latency[0], [d for _, d in latency[1:]])
    for f in args.files:
        d = read(f)
        if d is not None:
            data.setdefault(kind_of(d), (f, d))
    if "latency" not in data and "conv" in data and data["conv"][1].get("latency", {}).get("rows"):
        lat = data["conv"][1]["latency"]
        data["latency"] = (data["conv"][0] + " (latency section)",
                           {"meta": data["conv"][1]["meta"], "graph": lat.get("graph"), "rows": lat["rows"]})
    return data


# ----------------------------------------------------------------------------- numbers


def fmt_us(t):
    if t is None:
        return "-"
    return f"{t:.1f}" if t < 100 else f"{t:.0f}"


def fmt_x(x):
    return "-" if x is None else f"{x:.2f}x"


def fmt_meta(key, v):
    if v is None:
        return "-"
    if key == "copy_bandwidth_Bps":
        return f"{v / 1e9:.0f} GB/s"
    if key.startswith("matmul_"):
        return f"{v / 1e12:.1f} TFLOP/s"
    if key == "argv":
        return "`" + " ".join(map(str, v)) + "`" if v else "(defaults)"
    return str(v).replace("|", "/")


_FLOPS_CACHE: dict = {}


def nominal_flops(problem: str):
    """flops_per_batch of a problem from its spec (for JSON files without FLOPs)."""
    if problem in _FLOPS_CACHE:
        return _FLOPS_CACHE[problem]
    val = None
    try:
        sys.path.insert(0, str(ROOT))
        from eqdsl.lower import lower
        from eqdsl.spec import load_spec

        for f in sorted((ROOT / "examples" / "specs").glob("*.toml")):
            for s in load_spec(f):
                if s.name == problem:
                    val = lower(s).flops_per_batch
    except Exception:  # noqa: BLE001
        val = None
    _FLOPS_CACHE[problem] = val
    return val


def row_flops(row, kind):
    if row.get("flops"):
        return row["flops"]
    fpb = nominal_flops(row["problem"])
    if fpb is None:
        return None
    if kind == "radial":  # written with its FLOPs (the matmul's included) since it exists
        return None
    n = row.get("batch") if kind == "tp" else row.get("num_edges")
    if not isinstance(n, int):
        return None
    return fpb * n * (1 if row["direction"] == "fwd" else 4)


def measurements(data, kind):
    """Flat list of dicts: one per (row, impl) with time or status."""
    if kind not in data:
        return []
    d = data[kind][1]
    res_by = {}
    for r in d.get("results", []):
        cfg = r.get("graph", r.get("batch"))
        res_by[(r["problem"], r["dtype"], cfg, r["direction"], r["impl"])] = r
    impls = d.get("meta", {}).get("impls") or sorted({i for row in d.get("rows", []) for i in row.get("times_us", {})})
    out = []
    for row in d.get("rows", []):
        cfg = row.get("graph", row.get("batch"))
        flops = row_flops(row, kind)
        for impl in impls:
            r = res_by.get((row["problem"], row["dtype"], cfg, row["direction"], impl))
            t = row.get("times_us", {}).get(impl)
            m = {"kind": kind, "problem": row["problem"], "dtype": row["dtype"], "config": cfg,
                 "direction": row["direction"], "impl": impl, "time_us": t, "floor_us": row.get("floor_us"),
                 "floor_bytes": row.get("floor_bytes"), "flops": flops,
                 "status": r["status"] if r else ("ok" if t is not None else "-"),
                 "reason": (r or {}).get("reason", ""), "note": (r or {}).get("note", ""),
                 "num_nodes": row.get("num_nodes"), "num_edges": row.get("num_edges"),
                 "device": row.get("device")}
            out.append(m)
    return out


# ----------------------------------------------------------------------------- markdown


def table(header, rows, align=None):
    align = align or ["---:" if i else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# eqdsl in each framework at its best layout: (the row's key, the layouts' implementations)
# eqdsl's rows per framework, each at its faster layout
EQDSL_FRAMEWORKS = (("eqdsl_torch", ("eqdsl_torch", "eqdsl_torch_irmul")), ("eqdsl_jax", ("eqdsl_jax", "eqdsl_jax_irmul")))


def anchor_times(cm: dict, anchors=ANCHORS) -> dict:
    """``{anchor: time}`` of one configuration's measurements ``cm`` (``{impl: row}``): each
    anchor's fastest member that was timed."""
    out = {}
    for a, _, members in anchors:
        times = [cm[m]["time_us"] for m in members if m in cm and cm[m].get("time_us")]
        if times:
            out[a] = min(times)
    return out


def slower_rows(ms, kind) -> list[dict]:
    """The rows where eqdsl in a framework, at its faster layout, is slower than an anchor at its
    best: ``{"key", "problem", "dtype", "config", "direction", "impl", "time_us", "anchors"}``
    with ``key`` = ``[radial/]problem/dtype/config/direction/eqdsl_torch|eqdsl_jax`` (the key of
    ``reasons.json``) and ``anchors`` = ``[(anchor, label, fastest member impl, its time)]`` of
    every anchor faster than it, in ``ANCHORS`` order."""
    anchor_list = ANCHORS + [UNFUSED_ANCHOR] if kind == "radial" else ANCHORS
    out = []
    groups: dict[tuple, dict] = {}
    for m in ms:
        groups.setdefault((m["problem"], m["dtype"], m["config"], m["direction"]), {})[m["impl"]] = m
    for (prob, dtype, cfg, direction), cm in groups.items():
        timed = {i: m["time_us"] for i, m in cm.items() if m["status"] == "ok" and m["time_us"]}
        for fw, members in EQDSL_FRAMEWORKS:
            mine = [(timed[i], i) for i in members if i in timed]
            if not mine:
                continue
            t, impl = min(mine)
            beat = []
            for a, lbl, amembers in anchor_list:
                at = [(timed[i], i) for i in amembers if i in timed]
                if at and min(at)[0] < t:
                    beat.append((a, lbl, min(at)[1], min(at)[0]))
            if beat:
                key = ("radial/" if kind == "radial" else "") + f"{prob}/{dtype}/{cfg}/{direction}/{fw}"
                out.append({"key": key, "problem": prob, "dtype": dtype, "config": cfg, "direction": direction,
                            "impl": impl, "time_us": t, "anchors": beat})
    return out


def lost_lines(rows, reasons: dict, unit: str = "") -> list[str]:
    """One Markdown line per lost row (``slower_rows``' dicts): key, time, the anchors that won, and
    its measured reason from ``reasons`` or "reason not measured yet"."""
    return [f"- `{r['key']}` ({IMPL_LABEL[r['impl']]}, {fmt_us(r['time_us'])} µs{unit}): slower than "
            f"{', '.join(lbl for _, lbl, _, _ in r['anchors'])}: " + (reasons.get(r["key"]) or "reason not measured yet")
            for r in rows]


def perf_tables(ms, kind, graphs=None, reasons=None):
    """One table per problem: configuration x implementation rows, then the rows where eqdsl
    in a framework, at its faster layout, is slower than an anchor at its best, each with its
    measured reason from ``reasons`` (``{"problem/dtype/config/direction/eqdsl_torch|eqdsl_jax":
    text}``) or "not measured yet"."""
    reasons = reasons or {}
    out = []
    anchor_list = ANCHORS + [UNFUSED_ANCHOR] if kind == "radial" else ANCHORS
    problems = list(dict.fromkeys(m["problem"] for m in ms))
    # a merged file's rows from another card than most rows name their card (merge_json stamps them)
    cards = Counter(m["device"] for m in ms if m.get("device"))
    usual = cards.most_common(1)[0][0] if cards else None
    for prob in problems:
        pm = [m for m in ms if m["problem"] == prob]
        out.append(f"### {prob}\n")
        cfgs = list(dict.fromkeys((m["dtype"], m["config"], m["direction"]) for m in pm))
        rows = []
        lost = lost_lines(slower_rows(pm, kind), reasons)
        for dtype, cfg, direction in cfgs:
            cm = {m["impl"]: m for m in pm if (m["dtype"], m["config"], m["direction"]) == (dtype, cfg, direction)}
            anchors = anchor_times(cm, anchor_list)
            first = True
            for impl in sorted(cm, key=lambda i: IMPL_ORDER.index(i) if i in IMPL_ORDER else 99):
                m = cm[impl]
                if m["status"] != "ok" or not m["time_us"]:
                    continue
                t = m["time_us"]
                ratios = [fmt_x(anchors[a] / t) if a in anchors and impl not in members else "-"
                          for a, _, members in anchor_list]
                gbps = m["floor_bytes"] / (t * 1e-6) / 1e9 if m["floor_bytes"] else None
                frac = m["floor_us"] / t if m["floor_us"] else None
                if kind in ("conv", "radial"):
                    cfg_s = f"{cfg} ({m['num_nodes']} / {m['num_edges']})"
                else:
                    cfg_s = f"{cfg}"
                if m.get("device") and m["device"] != usual:
                    cfg_s += f", {m['device']}"
                lead = [dtype, cfg_s, direction, fmt_us(m["floor_us"])] if first else ["", "", "", ""]
                name = f"**{IMPL_LABEL.get(impl, impl)}**" if impl.startswith("eqdsl") else IMPL_LABEL.get(impl, impl)
                rows.append(lead + [name, fmt_us(t), *ratios, "-" if gbps is None else f"{gbps:.0f}",
                                    "-" if frac is None else f"{100 * frac:.0f}%"])
                first = False
            missing = [f"{IMPL_LABEL.get(i, i)}: {cm[i]['status']}" for i in cm if cm[i]["status"] != "ok"]
            if first:  # nothing timed for this configuration
                rows.append([dtype, str(cfg), direction, fmt_us(cm[next(iter(cm))]["floor_us"]) if cm else "-",
                             "(none timed)", "-", *["-"] * len(anchor_list), "-", "-"])
            if missing:
                rows.append(["", "", "", "", "<sub>not timed: " + ", ".join(missing) + "</sub>", "",
                             *[""] * len(anchor_list), "", ""])
        cfg_name = "graph (nodes / edges)" if kind in ("conv", "radial") else "batch"
        out.append(table(["dtype", cfg_name, "direction", "floor µs", "implementation", "µs",
                          *[f"vs {lbl}" for _, lbl, _ in anchor_list], "GB/s", "% of floor"], rows,
                         ["---", "---", "---", "---:", "---", "---:", *["---:"] * len(anchor_list), "---:", "---:"]))
        out.append("")
        if lost:
            out += ["Where eqdsl is slower than an anchor:", ""] + lost + [""]
    notes = {}
    for m in ms:
        if m["status"] not in ("ok", "-"):
            key = (m["impl"], m["status"], m["reason"])
            notes.setdefault(key, []).append(f"{m['problem']}/{m['dtype']}/{m['config']}/{m['direction']}")
    if notes:
        out.append("Not timed (n/a: unavailable or failed; BAD: disagreed with e3nn in float64; skip: time budget):\n")
        for (impl, st, reason), where in notes.items():
            w = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
            out.append(f"- {st} **{IMPL_LABEL.get(impl, impl)}**: {reason or '?'} ({w})")
        out.append("")
    ran = sorted({(m["impl"], m["note"]) for m in ms if m["status"] == "ok" and m["impl"].startswith("cueq") and m["note"]})
    if ran:
        out.append("cuEquivariance method that ran: " + "; ".join(sorted({n for _, n in ran})) + "\n")
    return out


def env_section(data):
    srcs = [k for k in ("tp", "conv", "latency") if k in data]
    if not srcs:
        return ["No benchmark JSON given.\n"]
    metas = {k: data[k][1].get("meta", {}) for k in srcs}
    header = ["", *[{"tp": "tensor product", "conv": "convolution", "latency": "latency"}[k] for k in srcs]]
    rows = []
    for key, label in META_KEYS:
        vals = [metas[k].get(key) for k in srcs]
        if all(v is None for v in vals):
            continue
        rows.append([label, *[fmt_meta(key, v) for v in vals]])
    rows.append(["file", *[f"`{Path(data[k][0]).name}`" for k in srcs]])
    return [table(header, rows, ["---", *["---"] * len(srcs)]), ""]


def latency_section(data, reasons=None):
    if "latency" not in data:
        return ["No latency JSON given.\n"]
    out = latency_table(data["latency"][1], reasons)
    for d in data["latency"][2] if len(data["latency"]) > 2 else []:
        out += latency_table(d, reasons)
    return out


def latency_slower_rows(d: dict) -> list[dict]:
    """The latency rows where eqdsl in a framework (at its faster layout) takes more wall time per
    synchronized call than an anchor at its best, as ``slower_rows`` gives them, with ``key`` =
    ``latency/problem/direction/eqdsl_torch|eqdsl_jax`` (the key of ``reasons.json``)."""
    out = []
    ok = [r for r in d.get("rows", []) if r.get("status") == "ok" and r.get("wall_sync_us")]
    for prob, direction in dict.fromkeys((r["problem"], r["direction"]) for r in ok):
        cm = {r["impl"]: {"time_us": r["wall_sync_us"]} for r in ok if (r["problem"], r["direction"]) == (prob, direction)}
        anchors = anchor_times(cm)
        for fw, members in EQDSL_FRAMEWORKS:
            mine = [(cm[i]["time_us"], i) for i in members if i in cm]
            if not mine:
                continue
            t, impl = min(mine)
            beat = [(a, lbl, min((cm[i]["time_us"], i) for i in am if i in cm)[1], anchors[a])
                    for a, lbl, am in ANCHORS if a in anchors and anchors[a] < t]
            if beat:
                out.append({"key": f"latency/{prob}/{direction}/{fw}", "problem": prob, "direction": direction,
                            "impl": impl, "time_us": t, "anchors": beat})
    return out


def latency_table(d: dict, reasons=None) -> list[str]:
    """One bench_latency.json as a Markdown table (one problem), then the rows eqdsl loses with
    their reasons from ``reasons`` (keys ``latency/problem/direction/eqdsl_torch|eqdsl_jax``)."""
    g = d.get("graph") or {}
    out = [f"{g.get('desc', '?')}, {g.get('num_edges', '?')} edges; problem "
           f"{(d.get('rows') or [{}])[0].get('problem', '?')}, float32. Microseconds per call (medians).\n"]
    rows, notes = [], []
    for r in d.get("rows", []):
        if r.get("status") == "ok":
            rows.append([IMPL_LABEL.get(r["impl"], r["impl"]), r["direction"], fmt_us(r.get("wall_sync_us")),
                         fmt_us(r.get("host_us")), fmt_us(r.get("pipelined_us")), fmt_us(r.get("cuda_event_us")),
                         f"{r.get('rel_err', float('nan')):.1e}"])
        else:
            rows.append([IMPL_LABEL.get(r["impl"], r["impl"]), r["direction"], r.get("status"), "-", "-", "-", "-"])
            notes.append(f"- {r.get('status')} **{IMPL_LABEL.get(r['impl'], r['impl'])}** {r['direction']}: "
                         f"{r.get('reason', '')}")
    out.append(table(["implementation", "direction", "wall per synchronized call", "host per call (no sync)",
                      "pipelined per call", "CUDA events", "rel. error"], rows,
                     ["---", "---", "---:", "---:", "---:", "---:", "---:"]))
    out.append("")
    out.append("wall: one call then synchronize, median; host: N calls back to back without synchronizing, host "
               "time / N (what the Python side costs); pipelined: the same N calls and one synchronize / N; CUDA "
               "events: device time of one synchronized call (torch only).\n")
    out += notes + ([""] if notes else [])
    lost = lost_lines(latency_slower_rows(d), reasons or {}, " wall")
    if lost:
        out += ["Where eqdsl is slower than an anchor (wall per synchronized call):", ""] + lost + [""]
    return out


# ----------------------------------------------------------------------------- roofline


def roofline(data, ms, png: str):
    """Plot float32 points; returns a short description or an error string."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except Exception as e:  # noqa: BLE001
        return f"matplotlib unavailable ({type(e).__name__}: {e}): no plot"
    meta = {}
    for k in ("tp", "conv", "radial", "latency"):
        if k in data:
            for key in ("copy_bandwidth_Bps", "matmul_float32_flops", "device"):
                meta.setdefault(key, data[k][1].get("meta", {}).get(key))
    pts = [m for m in ms if m["status"] == "ok" and m["time_us"] and m["flops"] and m["floor_bytes"]
           and m["dtype"] == "float32"]
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    xs = [m["flops"] / m["floor_bytes"] for m in pts] or [1.0]
    xmin, xmax = min(xs) / 4, max(xs) * 4
    bw, peak = meta.get("copy_bandwidth_Bps"), meta.get("matmul_float32_flops")
    import numpy as np

    grid = np.logspace(np.log10(xmin), np.log10(max(xmax, (peak / bw) * 2 if bw and peak else xmax)), 200)
    if bw:
        ax.plot(grid, bw * grid, "k--", lw=1, label=f"copy bandwidth {bw / 1e9:.0f} GB/s")
    if peak:
        ax.axhline(peak, color="k", ls=":", lw=1, label=f"fp32 matmul (TF32 off) {peak / 1e12:.1f} TFLOP/s")
    if bw and peak:
        ax.plot(grid, np.minimum(bw * grid, peak), "k-", lw=2, alpha=0.25)
    markers = {("tp", "fwd"): ("o", True), ("tp", "fwd+bwd"): ("o", False),
               ("conv", "fwd"): ("s", True), ("conv", "fwd+bwd"): ("s", False),
               ("radial", "fwd"): ("D", True), ("radial", "fwd+bwd"): ("D", False)}
    for m in pts:
        x = m["flops"] / m["floor_bytes"]
        y = m["flops"] / (m["time_us"] * 1e-6)
        mk, filled = markers.get((m["kind"], m["direction"]), ("x", True))
        c = COLORS.get(m["impl"], "gray")
        ax.scatter([x], [y], marker=mk, s=36, facecolors=c if filled else "none", edgecolors=c, linewidths=1.2,
                   alpha=0.85)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, nominal FLOP / minimal byte (eqdsl.lower)")
    ax.set_ylabel("achieved FLOP/s (nominal FLOPs / median time)")
    ax.set_title(f"Roofline, float32, {meta.get('device') or '?'}")
    impls = [i for i in IMPL_ORDER if any(m["impl"] == i for m in pts)]
    handles = [Line2D([], [], marker="o", ls="", color=COLORS[i], label=IMPL_LABEL[i]) for i in impls]
    handles += [Line2D([], [], marker="o", ls="", color="gray", label="tensor product, fwd"),
                Line2D([], [], marker="o", ls="", mfc="none", color="gray", label="tensor product, fwd+bwd"),
                Line2D([], [], marker="s", ls="", color="gray", label="convolution, fwd"),
                Line2D([], [], marker="s", ls="", mfc="none", color="gray", label="convolution, fwd+bwd")]
    if any(m["kind"] == "radial" for m in pts):
        handles += [Line2D([], [], marker="D", ls="", color="gray", label="conv_radial rows, fwd"),
                    Line2D([], [], marker="D", ls="", mfc="none", color="gray", label="conv_radial rows, fwd+bwd")]
    h0, _ = ax.get_legend_handles_labels()
    ax.legend(handles=h0 + handles, fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return f"{len(pts)} float32 points"


# ----------------------------------------------------------------------------- main


MACE_IMPL = {"e3nn": "e3nn (mace-torch as built)", "cueq": "cuEquivariance (MACE's own conversion)",
             "eqdsl": "eqdsl (`integrations.mace.accelerate`, convs only)",
             "eqdsl_products": "eqdsl (`accelerate`: convs and symmetric contractions)"}


def mace_section(paths) -> list[str]:
    """The MACE end-to-end table (benchmarks/bench_mace.py): one row per dtype and implementation."""
    if not paths:
        return ["No bench_mace.json given.", ""]
    rows, metas = [], []
    for path in paths:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return [f"{path}: unreadable ({type(e).__name__})", ""]
        metas.append(d.get("meta", {}))
        seen = {(r.get("dtype"), r.get("impl")) for r in rows}
        rows += [dict(r, _date=d.get("meta", {}).get("date"), _device=d.get("meta", {}).get("device"))
                 for r in d.get("rows", []) if "train_ms" in r and (r.get("dtype"), r.get("impl")) not in seen]
    m = metas[0]
    out = [f"mace-torch {m.get('mace', '?')} `ScaleShiftMACE`, random weights: hidden `{m.get('hidden')}`, max_ell "
           f"{m.get('max_ell')}, correlation {m.get('correlation')}, 2 interactions, radial MLP {m.get('radial_mlp')}. "
           f"Training batch: rattled 512-atom Si cells, {m.get('edges_float32', m.get('edges_float64', '?'))} edges; "
           "MD: one 64-atom cell (1,792 edges). A training step is energy, forces (`create_graph`), a loss on both "
           "and `loss.backward()`; an MD step is energy and forces. CUDA events, median of 10 after 3 warm-up "
           "steps. `edge TP` and `sym. contraction` are CUDA events around each interaction's `conv_tp` (eqdsl: "
           "the fused conv with its scatter) and each product's `symmetric_contractions`, summed over layers, "
           "in one forward; `rest` is the forward minus both. `forces err`: relative to the e3nn model.", ""]
    hdr = ["dtype", "implementation", "training step (ms)", "MD step (ms)", "forward (ms)", "edge TP (ms)",
           "sym. contraction (ms)", "rest (ms)", "forces err", "device, date"]
    body = []
    for r in rows:
        f = lambda k: "-" if r.get(k) is None else f"{r[k]:.2f}"  # noqa: E731
        err = r.get("forces_rel_err")
        body.append([r.get("dtype"), MACE_IMPL.get(r.get("impl"), r.get("impl")), f("train_ms"), f("md_ms"),
                     f("fwd_ms"), f("conv_tp_ms"), f("products_ms"), f("rest_ms"),
                     "-" if err is None else f"{err:.1e}", f"{r.get('_device')}, {r.get('_date')}"])
    align = ["---", "---"] + ["---:"] * 7 + ["---"]
    return out + [table(hdr, body, align), ""]


def symmetric_section(items) -> list[str]:
    """The symmetric contraction's table (benchmarks/tools/symmetric_torch_bench.py logs: the
    ``device`` line and the ``RESULT {...}`` line), one row per element count, dtype and implementation."""
    rows, devices, dates = [], set(), set()
    for item in items:
        elements, _, path = item.partition("=")
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            return [f"{path}: unreadable ({type(e).__name__})", ""]
        devices |= {ln.split(",")[0].removeprefix("device ").strip() for ln in lines if ln.startswith("device ")}
        dates |= {ln.removeprefix("date ").split(" (")[0] for ln in lines if ln.startswith("date ")}
        results = [json.loads(ln[len("RESULT "):]) for ln in lines if ln.startswith("RESULT ")]
        if not results:
            return [f"{path}: no RESULT line", ""]
        for key, r in sorted(results[-1].items()):
            impl, _, rest = key.partition("_")
            dtype = rest.rsplit("_", 1)[-1]
            rows.append((elements, dtype, impl, rest, r))
    out = ["MACE-MP's product basis: `128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o`, correlation 3, 3,072 nodes, "
           "random inputs, weights and elements (`benchmarks/tools/symmetric_torch_bench.py`; checked against a "
           "float64 contraction of mace's dense U tensors first). eqdsl: the generated torch ops on `mul_ir` rows "
           "(MACE's); cuEquivariance: `cuequivariance_torch.SymmetricContraction(original_mace=True)` on `ir_mul` "
           "rows, same run. `forces`: `E = <out, G>`, `F = dE/dx` with `create_graph`, `|F|^2` backward to x "
           "and W (a force-trained step's second-order pass). Median CUDA-event times. The floor: x, W and out "
           "each moved once at 3.35 TB/s. Device: " + (", ".join(sorted(devices)) or "?") + "; run: "
           + (", ".join(sorted(dates)) or "?") + ".", ""]
    hdr = ["elements", "dtype", "implementation", "fwd (ms)", "fwd+bwd (ms)", "forces (ms)", "vs cuEq fwd",
           "vs cuEq fwd+bwd", "vs cuEq forces", "floor (us)"]
    cueq = {(e, d): r for e, d, impl, _, r in rows if impl == "cueq"}
    body = []
    for e, d, impl, name, r in rows:
        c = cueq.get((e, d))
        vs = [("-" if c is None or impl == "cueq" or not r.get(k) else f"{c[k] / r[k]:.2f}x")
              for k in ("fwd", "fwd+bwd", "forces")]
        f = lambda k: "-" if r.get(k) is None else f"{r[k]:.2f}"  # noqa: E731
        label = "cuEquivariance" if impl == "cueq" else f"eqdsl ({name.rsplit('_', 1)[0].removeprefix('mp_')})"
        body.append([e, d, label, f("fwd"), f("fwd+bwd"), f("forces"), *vs,
                     "-" if r.get("floor_us") is None else f"{r['floor_us']:.1f}"])
    return out + [table(hdr, body, ["---:", "---", "---"] + ["---:"] * 7), ""]


def scaling_section(path) -> list[str]:
    """Training-step throughput on 1 and N GPUs (benchmarks/bench_scaling.py), as its JSON says."""
    if not path:
        return ["No bench_scaling.json given.", ""]
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{path}: unreadable ({type(e).__name__})", ""]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scaling import table as scaling_table  # the table bench_scaling.py prints

    return [scaling_table(d), ""]


def _met(r: dict) -> str:
    return {"met": "met", "missed": "**missed**"}.get(r.get("met") or "", "-")


def startup_section(paths) -> list[str]:
    """Start-up times (benchmarks/bench_startup.py): one row per target, the parts beside it."""
    rows, metas, notes = {}, [], {}  # notes per step: a later file's step replaces an earlier one's
    for path in paths:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return [f"{path}: unreadable ({type(e).__name__})", ""]
        m = d.get("meta", {})
        metas.append(m)
        for r in d.get("rows", []):
            rows[r.get("key")] = dict(r, _jobs=m.get("jobs", 1), _device=m.get("device"), _date=m.get("date"))
        for s in d.get("steps", []):
            notes[s["step"]] = []
            k = s.get("kernels")
            if k and k.get("kernels"):
                notes[s["step"]].append(
                    f"- `{s['step']}`: {len(k['compiled'])} of {len(k['kernels'])} kernels of the package compiled "
                    "in the run" + (f" (not: {', '.join(k['missing'])})" if k["missing"] else ""))
            if s.get("status") not in (None, "ok"):
                notes[s["step"]].append(f"- `{s['step']}`: {s.get('status')}: {s.get('reason', '')}")
    m = metas[0] if metas else {}
    out = [f"Problem {m.get('problem', '?')}, float32. Each step in a fresh process with empty caches (Triton, "
           "eqdsl, XDG, CUDA, inductor; no JAX persistent cache), wall seconds, each part ended by a device "
           "synchronization; after them, every result checked against e3nn in float64. Targets: issue 22.", ""]
    body = []
    for r in rows.values():
        parts = ", ".join(f"{k} {v:.2f}" for k, v in (r.get("parts") or {}).items()) or r.get("reason", "")
        body.append([r.get("what"), r.get("seconds_str"), "-" if r.get("target_s") is None else f"≤ {r['target_s']:g}",
                     _met(r), parts, f"{r.get('_device') or '?'}, {r.get('_date')}"
                     + (f", {r['_jobs']} steps at once" if (r.get("_jobs") or 1) > 1 else "")])
    out.append(table(["what", "seconds", "target", "", "parts (s)", "device, date"], body,
                     ["---", "---:", "---:", "---", "---", "---"]))
    out.append("")
    notes = [n for ns in notes.values() for n in ns]
    return out + notes + ([""] if notes else [])


def small_graph_section(path) -> list[str]:
    """Energy + forces per step on a small graph, and host overhead per eager call
    (benchmarks/bench_small_graph.py)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{path}: unreadable ({type(e).__name__})", ""]
    m = d.get("meta", {})
    out = [f"{m.get('problem', '?')} conv, {m.get('atoms')} atoms, {m.get('edges')} edges (random graph, fixed "
           f"seed), {m.get('dtype', 'float32')}; {m.get('device', '?')}, {m.get('date', '?')}. One step: "
           f"{m.get('step', '?')}. Median wall time per synchronized step over {m.get('steps')} steps; pipelined: "
           "the same steps back to back, one synchronization, per step. Energy and forces checked against e3nn "
           "in float64 first.", ""]
    body, notes = [], []
    for r in d.get("steps", []):
        target = "-" if r.get("target_us") is None else f"≤ {r['target_us']:g}"
        if "median_us" in r:
            body.append([f"`{r['impl']}`", fmt_us(r["median_us"]), fmt_us(r.get("pipelined_us")), target, _met(r),
                         "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"])
        else:
            body.append([f"`{r['impl']}`", r.get("status", "n/a"), "-", target, "-", "-"])
        if r.get("status") != "ok" or r.get("note"):
            notes.append(f"- `{r['impl']}`: " + "; ".join(x for x in (r.get("status") if r.get("status") != "ok"
                                                                         else "", r.get("reason"), r.get("note")) if x))
    out.append(table(["implementation", "µs per step", "pipelined µs", "target", "", "rel. error"], body,
                     ["---", "---:", "---:", "---:", "---", "---:"]))
    out.append("")
    out += notes + ([""] if notes else [])
    if d.get("host"):
        out.append("Host time per eager call: calls back to back with no synchronization inside, host time / calls "
                   "(minimum over loops); pipelined: until the device is done, per call.\n")
        body = [[r["impl"], r["case"], fmt_us(r["host_us"]), fmt_us(r["pipelined_us"]),
                 "-" if r.get("target_us") is None else f"≤ {r['target_us']:g}", _met(r)] for r in d["host"]]
        out.append(table(["implementation", "call", "host µs", "pipelined µs", "target", ""], body,
                         ["---", "---", "---:", "---:", "---:", "---"]))
        out.append("")
    return out


def main(argv=None):
    args = parse_args(argv)
    data = load_inputs(args)
    tp = measurements(data, "tp")
    conv = measurements(data, "conv")
    radial = measurements(data, "radial")
    md = ["# Benchmarks", "",
          "Written by `benchmarks/report.py` from the JSON files of `benchmarks/bench_tp.py`, "
          "`benchmarks/bench_conv.py`" + (", `benchmarks/bench_mace.py`" if args.mace else "")
          + (", `benchmarks/bench_scaling.py`" if args.scaling else "")
          + (", `benchmarks/bench_startup.py`" if args.startup else "")
          + (", `benchmarks/bench_small_graph.py`" if args.small_graph else "") + " (how to run them: "
          "`benchmarks/README.md`). Do not edit by hand: "
          "rerun the benchmarks and the report.", ""]
    dates = sorted({str(data[k][1].get("meta", {}).get("date")) for k in data if data[k][1].get("meta", {}).get("date")})
    devs = sorted({str(data[k][1].get("meta", {}).get("device")) for k in data if data[k][1].get("meta", {}).get("device")})
    md += [f"Device: {', '.join(devs) or '?'}; run: {', '.join(dates) or '?'}.", ""]
    if args.notes:
        md += ["## Notes on these runs", ""]
        for notes in args.notes:
            md += [Path(notes).read_text(encoding="utf-8").strip(), ""]
    md += ["## Environment", ""] + env_section(data)
    md += ["## How to read the tables", "",
           "Times are medians of many calls after warm-up (torch: CUDA events around each call; JAX: wall clock "
           "over groups of calls ended by `block_until_ready`), with inputs rotating over sets larger than the L2 "
           "cache. Every implementation was first checked against e3nn in float64 (relative Frobenius error of the "
           "output and of the three gradients, at most 1e-4 in float32 and 1e-9 in float64); one that disagreed is "
           "BAD and was not timed. `vs X` = time of X / this time, X measured in the same run (above 1: faster "
           "than X). The floor is the fewest bytes the pass must move (every input read once, every output "
           "written once; forward+backward: 3x the inputs + 2x the output, plus the indices for the convolution) "
           "over the copy bandwidth measured in the same run; GB/s = those bytes / time; % of floor = floor / "
           "time.", ""]
    png_rel = os.path.relpath(args.png, Path(args.out).resolve().parent)
    desc = roofline(data, tp + conv + radial, args.png)
    md += ["## Roofline", "",
           f"![roofline]({png_rel})", "",
           f"[`{png_rel}`]({png_rel}): {desc}. x: nominal FLOPs (eqdsl.lower's `flops_per_batch` x batch or "
           "edges; the convolution adds one add per edge and output component; forward+backward counted as 4x "
           "the forward) over the minimal bytes of the floor; y: those FLOPs / median time. Lines: the copy "
           "bandwidth and a large float32 matrix product with TF32 off, both measured in the same run. Filled "
           "markers: forward; hollow: forward+backward; circles: plain tensor product; squares: fused "
           "convolution; diamonds: the conv_radial rows (their own floor: hidden features and matrix in place of "
           "the weights; FLOPs with the matmul's).", ""]
    md += ["## Plain tensor product", ""]
    reasons = json.loads(Path(args.reasons).read_text(encoding="utf-8")) if args.reasons else {}
    md += perf_tables(tp, "tp", reasons=reasons) if tp else ["No tensor-product JSON given.", ""]
    md += ["## Fused convolution", ""]
    if conv:
        gi = data["conv"][1].get("graphs", {})
        if gi:
            md += ["Graphs (edges sorted by destination):", ""]
            md += [f"- `{k}`: {v.get('desc')}, {v.get('num_edges')} edges, max in-degree {v.get('max_in_degree')} "
                   f"({v.get('builder')})" for k, v in gi.items()]
            md.append("")
        md += perf_tables(conv, "conv", reasons=reasons)
    else:
        md += ["No convolution JSON given.", ""]
    if radial:
        md += ["## Fused radial weights (`conv_radial`)", "",
               "`conv_radial(x, edge_attr, radial_features, radial_weight, src, dst, num_nodes)` = "
               "`conv(x, edge_attr, radial_features @ radial_weight, ...)` with `radial_features` (edges, H) and "
               "`radial_weight` (H, weight_numel). The `eqdsl torch` / `eqdsl jax` rows are `conv_radial` as each "
               "package's spec generates it: the weights formed on chip, or by a matmul where the spec sets "
               "`materialize = 1` / `pallas_radial_materialize = 1` (mace_large's and nequip_toluene's since "
               "2026-11-27, measured faster: `docs/conv_radial.md`); every other row is the matmul (full float32 precision) followed by that "
               "implementation's convolution, the matmul inside its time (`eqdsl ... conv (unfused)`: eqdsl's own "
               "conv). Forward+backward computes the gradients of x, edge_attr, radial_features and radial_weight "
               "(radial_weight's timed, not compared). The floor counts the hidden features and the matrix in place "
               "of the weights; the weight-forming matmul is compute, not traffic (see the roofline's diamonds).", ""]
        md += perf_tables(radial, "radial", reasons=reasons)
    md += ["## Small-graph latency", ""] + latency_section(data, reasons)
    if args.symmetric:
        md += ["## Symmetric contraction (MACE's product basis)", ""] + symmetric_section(args.symmetric)
    if args.mace:
        md += ["## MACE end to end", ""] + mace_section(args.mace)
    if args.mace_products:
        md += ["## MACE end to end with eqdsl's symmetric contraction", "",
               "The same model in mace's e3nn basis (`use_reduced_cg=False`, which eqdsl's symmetric contraction "
               "reproduces; cuEquivariance's row is MACE's own conversion of it), every implementation in one "
               "run. `eqdsl (accelerate: convs and symmetric contractions)` replaces both hot ops. float64: the "
               "e3nn row was not run (its error column is n/a); the float64 accuracy of the accelerated model "
               "(energy, forces and every force-loss parameter gradient within 2.5e-15 of e3nn's, H100) is in "
               "`benchmarks/results/symmetric/mace/`.", ""] + mace_section(args.mace_products)
    if args.scaling:
        md += ["## Several GPUs", ""] + scaling_section(args.scaling)
    if args.startup:
        md += ["## Start-up", ""] + startup_section(args.startup)
    if args.small_graph:
        md += ["## Small graph: energy + forces per step, host overhead", ""] + small_graph_section(args.small_graph)
    Path(args.out).write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {args.png} ({desc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
