"""Kernel tunings measured for the standard problems, offered to any spec with the same kernels.

The example specs (``examples/specs/*.toml``, one per standard problem, ``docs/problems.md``)
carry ``[tensor_product.tuning]`` tables chosen on an H100 by ``eqdsl tune``. A spec built
from a model (``eqdsl.spec_from_e3nn``, the integrations) has none, although its kernels
are often exactly a standard problem's: MACE's second interaction of a MACE-MP-medium-sized
model is ``mace_large``. A tuning sets tile sizes, warps and which kernel variants run; it
never changes what is computed (only the order of floating-point additions), so it is safe
to reuse wherever the kernels have the same shape.

Same kernels means the same ``irreps_in1``, ``irreps_in2``, ``irreps_out`` (as written,
in order), instructions (``i_in1``, ``i_in2``, ``i_out``, mode, has_weight, in order),
``layout`` and ``shared_weights``. The normalizations, the Clebsch-Gordan convention and
path weights change coefficient values only, and ``dtypes``, ``name`` and the conv keys
do not enter the key either.

The tuned specs are read from the source tree's ``examples/specs`` (the README's editable
install); ``$EQDSL_TUNED_SPECS`` names another directory, empty turns the lookup off.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .backends.helion.tuning import DTYPE_KEYS as HELION
from .backends.pallas.tuning import DTYPE_KEYS as PALLAS
from .errors import SpecError
from .instructions import Instruction
from .irreps import Irreps
from .spec import load_spec

__all__ = ["kernel_key", "known_tuning", "tuning_table", "for_dtypes"]

_DEFAULT_DIR = Path(__file__).resolve().parents[1] / "examples" / "specs"


def kernel_key(irreps_in1: Irreps, irreps_in2: Irreps, irreps_out: Irreps, instructions, layout: str,
               shared_weights: bool) -> tuple:
    """What decides the shape of the generated kernels (see the module docstring)."""
    ins = tuple((i.i_in1, i.i_in2, i.i_out, i.mode, bool(i.has_weight)) for i in instructions)
    return (str(irreps_in1), str(irreps_in2), str(irreps_out), ins, layout, bool(shared_weights))


@functools.lru_cache(maxsize=4)
def _table(directory: str) -> dict[tuple, tuple[str, tuple[tuple[str, int], ...]]]:
    out: dict = {}
    for path in sorted(Path(directory).glob("*.toml")):
        try:
            specs = load_spec(path)
        except SpecError:
            continue  # a broken file offers nothing; eqdsl check reports it
        for s in specs:
            if s.tuning:
                key = kernel_key(s.irreps_in1, s.irreps_in2, s.irreps_out, s.instructions, s.layout, s.shared_weights)
                out.setdefault(key, (f"{path.name} ({s.name})", s.tuning))
    return out


def known_tuning(irreps_in1: Irreps, irreps_in2: Irreps, irreps_out: Irreps,
                 instructions: tuple[Instruction, ...], layout: str,
                 shared_weights: bool) -> tuple[str, tuple[tuple[str, int], ...]] | None:
    """``(source, tuning pairs)`` of a tuned spec with the same kernels, or None.

    ``tuning pairs`` are ``TensorProductSpec.tuning``: sorted ``(key, value)``, a per-op
    key written ``"<op>.<key>"``.
    """
    directory = os.environ.get("EQDSL_TUNED_SPECS", str(_DEFAULT_DIR))
    if not directory or not Path(directory).is_dir():
        return None
    key = kernel_key(irreps_in1, irreps_in2, irreps_out, instructions, layout, shared_weights)
    return _table(directory).get(key)


def tuning_table(pairs: tuple[tuple[str, int], ...]) -> dict:
    """``TensorProductSpec.tuning`` pairs as the spec's ``tuning`` table (sub-tables per op)."""
    table: dict = {}
    for key, value in pairs:
        op, _, k = key.rpartition(".")
        (table.setdefault(op, {}) if op else table)[k] = value
    return table


def for_dtypes(pairs: tuple[tuple[str, int], ...], dtypes) -> tuple[tuple[str, int], ...]:
    """``pairs`` without the per-dtype keys of dtypes outside ``dtypes`` (``block_b_float64``
    in an op's sub-table, ``pallas_block_batch_float64``): a tuning offered to a spec of fewer
    dtypes than the one it was measured for, which would refuse them."""
    def named(key: str):
        sub = key.rpartition(".")[2]
        return HELION[sub][1] if sub in HELION else PALLAS.get(sub)

    return tuple((k, v) for k, v in pairs if named(k) is None or named(k) in dtypes)
