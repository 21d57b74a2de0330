#!/usr/bin/env python3
"""Merge ``bench_tp.py`` (or ``bench_conv.py``) JSON files from several device calls into one for ``report.py``.

    python benchmarks/merge_json.py OUT.json FIRST.json LATER.json ...

A later file's measurements of a (problem, dtype, batch or graph) replace every row and
result of that key in the earlier ones: each row keeps the anchors measured in the same
call as eqdsl, and its own floor (computed from that call's measured copy bandwidth). The
meta of the first file is kept, with ``argv`` listing every call's arguments and
``copy_bandwidth_Bps`` the first call's (the rows' ``floor_us`` are per call); a conv
file's ``graphs`` are joined and its ``latency`` section is the last one present. Each row and
result carries its call's ``device`` (from that file's meta, unless it has one already); when the
calls ran on different cards the meta's ``device`` names them all, so that a table never says
one card for rows timed on another.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def key(r: dict) -> tuple:
    return (r["problem"], r["dtype"], r.get("graph", r.get("batch")))


def merge(files: list[dict], labels: list[str]) -> dict:
    out = {"meta": dict(files[0]["meta"]), "rows": [], "results": [], "elapsed_s": 0.0}
    argv = []
    for d, label in zip(files, labels):
        a = d["meta"].get("argv", [])
        # (the 2026-11-23 merge predates the "merged" flag: its argv entries are "callN: ...")
        merged_before = d["meta"].get("merged") or (bool(a) and all(isinstance(x, str) and x.startswith("call") for x in a))
        argv += a if merged_before else [f"{label}: {' '.join(map(str, a))}"]
        keys = {key(r) for r in d["rows"]}
        rows, results = (_stamped(d[k], d["meta"].get("device")) for k in ("rows", "results"))
        out["rows"] = [r for r in out["rows"] if key(r) not in keys] + rows
        out["results"] = [r for r in out["results"] if key(r) not in keys] + results
        out["elapsed_s"] += d.get("elapsed_s", 0.0)
        if "graphs" in d:
            out["graphs"] = _join(out.get("graphs"), d["graphs"])
        if d.get("latency"):
            out["latency"] = d["latency"]
    # a merged file's date is already a range "A to B": its ends count, not the whole string
    dates = sorted({end for d in files if d["meta"].get("date") for end in str(d["meta"]["date"]).split(" to ")})
    if len(dates) > 1:  # the first call's date alone would misdate the later rows
        out["meta"]["date"] = f"{dates[0]} to {dates[-1]}"
    devices = sorted({r["device"] for r in out["rows"] if r.get("device")})
    if len(devices) > 1:
        out["meta"]["device"] = ", ".join(devices)
    out["meta"]["argv"] = argv
    out["meta"]["merged"] = True
    return out


def _stamped(rows: list[dict], device) -> list[dict]:
    """``rows``, each with its call's ``device`` unless it names one already (a merged file's rows)."""
    return [r if "device" in r or device is None else dict(r, device=device) for r in rows]


def _join(a, b):
    if a is None:
        return b
    if isinstance(a, dict):
        return {**a, **b}
    return a + [x for x in b if x not in a]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    paths = [Path(p) for p in argv[1:]]
    merged = merge([json.loads(p.read_text()) for p in paths], [f"{p.parent.parent.name}/{p.parent.name}" for p in paths])
    Path(argv[0]).write_text(json.dumps(merged, indent=1) + "\n")
    print(f"{argv[0]}: {len(merged['rows'])} rows from {len(paths)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
