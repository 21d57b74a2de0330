"""Shared test setup.

Helion (and Triton) read their flags when a kernel object is created, so the
environment is set here, before anything imports helion or a generated module. Without
a CUDA GPU (CI), Triton's interpreter runs the generated Triton code on CPU tensors
(``TRITON_INTERPRET=1``); with one, the torch tests run compiled kernels on CUDA unless
``EQDSL_TEST_INTERPRET=1``. Nothing is autotuned, and the inductor cache of this run
lives in a temporary directory.
"""

import os
import tempfile

try:
    import torch as _torch

    _HAS_CUDA = _torch.cuda.is_available()
except ImportError:  # a JAX-only environment
    _HAS_CUDA = False

if not _HAS_CUDA or os.environ.get("EQDSL_TEST_INTERPRET") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("HELION_AUTOTUNE_EFFORT", "none")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="eqdsl-inductor-"))
os.environ.pop("HELION_INTERPRET", None)
# Without a GPU, packages are generated without their Triton code (lowering costs seconds
# per kernel on CI's 2 cores) and run the same kernels through Helion;
# tests/test_triton_launch.py generates and runs the Triton code (the default path) and
# compares it with Helion's.
if not _HAS_CUDA:
    os.environ.setdefault("EQDSL_KERNELS", "helion")

# Hypothesis' "input generation is slow" health check measures the machine, not the code:
# on a 2-core CI box busy with interpreted kernels a one-second draw stall fails a test
# whose inputs are tiny (seen once in test_irreps). Deadlines are off for the same reason.
from hypothesis import HealthCheck, settings  # noqa: E402

# Examples are drawn from a fixed seed (derandomize), so CI runs the same specs, in the
# same time, every run; EQDSL_HYPOTHESIS_RANDOM=1 draws new ones (how a random spec with no
# weighted path was found, 2026-11-22).
settings.register_profile(
    "eqdsl",
    suppress_health_check=[HealthCheck.too_slow],
    deadline=None,
    derandomize=os.environ.get("EQDSL_HYPOTHESIS_RANDOM") != "1",
)
settings.load_profile("eqdsl")
