"""The tests' tolerance for comparing a generated op, or a model built on it, with a reference.

``REL_TOL[dtype]`` bounds a max-norm relative error, ``max|got - want| / max|want|`` over a
whole tensor (each test's ``rel_err`` / ``_rel``), where ``want`` is computed in float64 (the
numpy reference ``eqdsl.reference``, or e3nn in float64) or, for a model, by the same model
built from e3nn.

float32, ``1e-5``: the kernels sum up to a few hundred CG terms per output in another order
than the reference (with fma chains on the GPU), a few float32 ulps (1.2e-7) times the terms'
cancellation. A wrong coefficient, sign, path weight or index shows as an error of order
1e-2 to 1. Measured on the CPU (2026-11-26, tests/test_forces.py, the largest errors of its
small model): energy, forces and the gradient of a force loss (a second derivative through the
op) at most 4.5e-7 in both frameworks and both layouts.

float64, ``1e-10``: the same reordering costs a few float64 ulps (2.2e-16); measured at most
1.2e-15 for the same model. The margin absorbs e3nn's float64 Wigner 3j where e3nn is the
reference (it agrees with eqdsl's exact coefficients to 1e-12, tests/test_cg.py).

Never loosened to make a test pass: a test that needs more is a bug to find. Comparisons of two
float64 computations that must agree to rounding (``1e-12``), and of CG tables (``1e-12``,
``1e-13``), are written where they are used.
"""

from __future__ import annotations

__all__ = ["REL_TOL"]

REL_TOL = {"float32": 1e-5, "float64": 1e-10}
