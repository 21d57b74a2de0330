#!/usr/bin/env python3
"""The Nsight Compute cases for the benchmark rows an anchor wins that have no measured reason yet.

    python3 benchmarks/tools/ncu_missing.py --tp bench_tp.json [--conv bench_conv.json] \
        --reasons benchmarks/results/reasons.json

Prints one line per case, ``GRAPH:problem:dtype:direction:impl,impl...`` (``GRAPH`` empty for the
plain tensor product), the form ``ncu_missing.sh`` hands to ``ncu_rows.py`` (``--conv GRAPH
--cases problem:...``). A case lists the losing eqdsl implementations (each framework at its faster
layout, as ``report.py`` compares them) and the fastest member of every anchor that beat one of
them, so the profile sets each against what won. Rows whose key ``reasons.json`` already holds
are left out; ``--all`` lists them too, after the others, except those whose reason begins with
``--current`` (e.g. ``"ncu (s21,"``: measured on the kernels of the table already). Pure: reads
JSON, runs nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the package benchmarks
from benchmarks import report  # noqa: E402


def ncu_cases(data: dict, reasons: dict, every: bool = False, current: str | None = None) -> list[str]:
    """``GRAPH:problem:dtype:direction:impls`` for every row of ``data`` (``report.load_inputs``'s
    ``{kind: (path, json)}``, kinds ``tp`` and ``conv``) that ``report.slower_rows`` lists and
    ``reasons`` has no entry for; one case per configuration, implementations in first-seen order.
    ``every``: the explained rows too, after the unexplained ones (their reasons measured on
    earlier kernels, profiled again), but not those whose reason begins with ``current``."""
    cases: dict[tuple, list[str]] = {}
    lost = [(kind, r) for kind in ("tp", "conv") for r in report.slower_rows(report.measurements(data, kind), kind)]
    unexplained = [(kind, r) for kind, r in lost if not reasons.get(r["key"])]
    explained = [(kind, r) for kind, r in lost
                 if reasons.get(r["key"]) and not (current and reasons[r["key"]].startswith(current))]
    for kind, r in unexplained + (explained if every else []):
        graph = r["config"] if kind == "conv" else ""
        impls = cases.setdefault((graph, r["problem"], r["dtype"], r["direction"]), [])
        for impl in [r["impl"]] + [member for _, _, member, _ in r["anchors"]]:
            if impl not in impls:
                impls.append(impl)
    return [":".join(k) + ":" + ",".join(v) for k, v in cases.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default=None, help="bench_tp.py JSON (merged: merge_json.py)")
    ap.add_argument("--conv", default=None, help="bench_conv.py JSON")
    ap.add_argument("--reasons", default=None, help="reasons.json: rows already explained")
    ap.add_argument("--all", action="store_true", help="the explained rows too, after the unexplained ones")
    ap.add_argument("--current", default=None, help="with --all: leave out rows whose reason begins with this")
    args = ap.parse_args(argv)
    data = report.load_inputs(argparse.Namespace(tp=args.tp, conv=args.conv, radial=None, latency=None, files=[]))
    reasons = json.loads(Path(args.reasons).read_text(encoding="utf-8")) if args.reasons else {}
    for case in ncu_cases(data, reasons, every=args.all, current=args.current):
        print(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
