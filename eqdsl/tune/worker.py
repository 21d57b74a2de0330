"""One tuning job in its own process: the parent's ``run_job`` and the child's ``main``.

A job compiles kernels (Helion, then Triton: single-threaded, 20 s to 2 min per kernel on
the H100 host), so ``eqdsl tune`` runs a pool of them; a subprocess also contains a job's
crash (out of resources, a CUDA error) to that candidate. The child prints one JSON line,
``{"us": <median microseconds>}``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from .grid import PALLAS_OPS
from .timing import LOCK, measure

__all__ = ["run_job", "error_line", "main"]


def error_line(stderr: str) -> str:
    """The exception line of a failed job's stderr (torch's CUDA errors end with a hint
    line, not the error), or its last line; at most 200 characters."""
    lines = stderr.strip().splitlines() or ["?"]
    errors = [s for s in lines if re.match(r"^[\w.]*(Error|Exception)\b", s)]
    return (errors or lines)[-1][:200]


def run_job(spec_file: str, package_dir: str, op: str, batch: int, dtype: str, timeout: float) -> dict:
    """Run ``timing.measure`` for one (op, candidate) in a subprocess.

    Returns:
        ``{"us": microseconds}``, or ``{"error": one line}`` if the job failed or ran past
        ``timeout`` seconds.
    """
    cmd = [sys.executable, "-m", "eqdsl.tune", "--worker", spec_file, package_dir, op, str(batch), dtype, str(LOCK)]
    # JAX workers compile side by side: each allocates GPU memory as it needs it, not 75% up front
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if op in PALLAS_OPS and dtype == "float64":
        env["JAX_ENABLE_X64"] = "1"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": error_line(r.stderr)}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    """The child: ``SPEC_FILE PACKAGE_DIR OP BATCH DTYPE LOCK``; prints ``{"us": ...}``."""
    spec_file, package_dir, op, batch, dtype, lock = argv[:6]
    print(json.dumps({"us": measure(spec_file, package_dir, op, int(batch), dtype, lock)}))
    return 0
