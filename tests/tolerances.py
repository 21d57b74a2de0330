"""The tests' tolerances for comparing a generated op with a reference, by dtype, with the
reason for each. Every one bounds a max-norm relative error, ``max|got - want| / max|want|``
over a whole tensor (each test's ``rel_err`` / ``_rel``), with ``want`` computed in float64
(the numpy reference ``eqdsl.reference``, or e3nn in float64).

Tolerances are never loosened to make a test pass: a test that needs more is a bug to find.
Comparisons of two float64 computations that must agree to rounding (``1e-12``) and of
Clebsch-Gordan tables (``1e-12``/``1e-13``) are written where they are used.
"""

from __future__ import annotations

__all__ = ["KERNEL", "MODEL", "MODEL_FLOAT64"]

# One generated op (forward, a backward kernel, the conv) against the float64 reference.
# float32: the kernels sum up to a few hundred CG terms per output in another order than the
# reference (and with fma chains on the GPU): a few float32 ulps (1.2e-7) times the terms'
# cancellation; 1e-5 leaves a margin without hiding a wrong coefficient, sign or path
# weight, which shows as an error of order 1e-2 to 1.
# float64: the same reordering costs a few float64 ulps (2.2e-16); 1e-10 also absorbs e3nn's
# float64 Wigner 3j where e3nn is the reference (it agrees with eqdsl's to 1e-12, test_cg.py).
KERNEL = {"float32": 1e-5, "float64": 1e-10}

# A small interatomic model's energy, forces (-dE/dx, a backward through the op) and the
# gradient of a force loss with respect to the radial parameters (a second derivative through
# it), compared with the same model built from e3nn in the same dtype (tests/test_forces.py).
# The errors of the op compound through the model's sums over edges and atoms and through
# two derivatives, hence ten times the single op's.
MODEL = {"float32": 1e-4, "float64": 1e-9}

# A model library's own model with eqdsl's convolution swapped in (nequip, nequix) against
# the original, both float64: energy, forces and parameter gradients.
MODEL_FLOAT64 = 1e-10

