"""The flax and equinox examples run as a user runs them: each checks its output against
e3nn-jax (relative 1e-5, float32) and that three gradient steps lower its loss, and exits
non-zero otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["flax_tp.py", "equinox_tp.py"])
def test_example_runs_and_checks_itself(script, tmp_path):
    env = dict(os.environ, EQDSL_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "relative difference to e3nn-jax" in proc.stdout
