"""Write ``e3nn044_wigner_3j.npz``: e3nn 0.4.4's ``o3.wigner_3j(l1, l2, l3)`` for every
allowed triple with ``l1, l2, l3 <= 5`` (float64), the reference data of
``tests/test_cg.py``'s e3nn-0.4 convention test.

e3nn 0.4.4 (what mace-torch 0.3.16 pins, ``e3nn==0.4.4``) cannot be installed next to the
e3nn 0.6 of the project's environment, so this runs once, in a throwaway one::

    python -m venv /tmp/e3nn044 && . /tmp/e3nn044/bin/activate
    pip install torch==2.13.0 numpy packaging
    pip install --no-deps e3nn==0.4.4 opt-einsum-fx && pip install scipy sympy opt-einsum
    python tests/data/make_e3nn044_wigner.py

``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set below because e3nn 0.4.4 reads its tables
(``e3nn/o3/constants.pt``, which holds a ``slice``) with a bare ``torch.load``, which torch
>= 2.6 refuses under its default ``weights_only=True``.

Keys of the archive: ``"l1,l2,l3"`` -> array ``(2 l1 + 1, 2 l2 + 1, 2 l3 + 1)``, plus
``"e3nn_version"`` and ``"lmax"``.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import e3nn  # noqa: E402
from e3nn import o3  # noqa: E402

LMAX = 5
OUT = Path(__file__).resolve().parent / "e3nn044_wigner_3j.npz"


def main() -> None:
    if e3nn.__version__ != "0.4.4":
        raise SystemExit(f"needs e3nn 0.4.4, found {e3nn.__version__}")
    arrays = {}
    for l1 in range(LMAX + 1):
        for l2 in range(LMAX + 1):
            for l3 in range(abs(l1 - l2), min(l1 + l2, LMAX) + 1):
                arrays[f"{l1},{l2},{l3}"] = o3.wigner_3j(l1, l2, l3, dtype=torch.float64).numpy()
    np.savez_compressed(OUT, e3nn_version=np.array(e3nn.__version__), lmax=np.array(LMAX), **arrays)
    print(f"{OUT.name}: {len(arrays)} triples, l <= {LMAX}, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
