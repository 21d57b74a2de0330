"""Choosing an op's tuning from its candidates' timings."""

from __future__ import annotations

from .grid import Candidate, TuneError

__all__ = ["MIN_GAIN", "winner", "label"]

MIN_GAIN = 0.01  # a candidate replaces the op's current tuning only if at least this much faster


def label(c: Candidate) -> str:
    """``"block_b=8, num_warps=4"``, or ``"as the spec has it"`` for ``()``."""
    return ", ".join(f"{k}={v}" for k, v in c) or "as the spec has it"


def winner(op: str, rs: list[tuple[Candidate, dict]]) -> Candidate:
    """The fastest candidate, unless the op's current tuning (``()``) is within ``MIN_GAIN``
    of it: timing noise (about 0.1% between runs on the H100) must not rewrite the spec.

    Args:
        op: the op's name (for the error).
        rs: ``(candidate, {"us": t} or {"error": why})`` per candidate.

    Raises:
        TuneError: no candidate ran (every one failed).
    """
    timed = sorted((r["us"], i) for i, (_, r) in enumerate(rs) if "error" not in r)
    if not timed:
        raise TuneError(f"{op}: no candidate ran: " + "; ".join(f"{label(c)}: {r['error']}" for c, r in rs))
    current = next((r["us"] for c, r in rs if c == () and "error" not in r), None)
    if current is not None and current <= timed[0][0] * (1 + MIN_GAIN):
        return ()
    return rs[timed[0][1]][0]
