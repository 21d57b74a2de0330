"""What ``eqdsl tune`` prints: progress while the jobs run, then the results table."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .grid import Candidate
from .choose import label, winner

__all__ = ["Progress", "format_results"]


class Progress:
    """A context manager: a rich progress bar on a terminal (when ``report`` is ``print``,
    stderr is a terminal and rich is installed), and one ``report`` line per finished job."""

    def __init__(self, total: int, report: Callable[[str], None]):
        self.total, self.report, self.done, self.bar = total, report, 0, None

    def __enter__(self):
        try:
            from rich.progress import Progress as Bar

            if self.report is print and sys.stderr.isatty():
                self.bar = Bar(transient=False)
                self.task = self.bar.add_task("tuning", total=self.total)
                self.bar.start()
        except ImportError:
            pass
        return self

    def advance(self, what: str) -> None:
        """One job done: ``[done/total] what``."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=what[:60])
        self.report(f"[{self.done}/{self.total}] {what}")

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


def format_results(results: dict[str, list[tuple[Candidate, dict]]]) -> str:
    """Plain text: per op, each candidate's microseconds (fastest first, the winner marked)."""
    lines = []
    for op, rs in results.items():
        lines.append(f"{op}:")
        ranked = sorted(rs, key=lambda cr: cr[1].get("us", float("inf")))
        best = winner(op, rs) if any("error" not in r for _, r in rs) else None
        for cand, r in ranked:
            what = f"failed: {r['error']}" if "error" in r else f"{r['us']:9.1f} us" + ("  <- best" if cand == best else "")
            lines.append(f"  {label(cand):40s} {what}")
    return "\n".join(lines)
