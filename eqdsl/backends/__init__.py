"""Code generators, one package per backend: ``helion`` (Helion kernels behind torch custom
ops) and ``pallas`` (Pallas kernels behind JAX functions). Each turns a lowered
``TensorProductIR`` into package files (its ``render_files``), reading the backend-neutral
facts of ``eqdsl.analysis``; ``eqdsl.codegen.generate`` calls them.

A spec's ``[tensor_product.tuning]`` table reaches them as data (``TensorProductSpec.tuning``:
sorted ``(key, value)`` pairs, an op sub-table's keys as ``"<op>.<key>"``); each backend
owns and validates its keys (``helion.tuning.KEYS``, ``pallas.tuning.KEYS``), and
``check_tuning`` checks a spec's table against all of them before anything is generated.
"""

from __future__ import annotations

from ..errors import SpecError
from .helion import tuning as _helion
from .pallas import tuning as _pallas

__all__ = ["TUNING_KEYS", "TUNING_OPS", "check_tuning"]

# every backend's keys: key -> (test, what it accepts)
TUNING_KEYS = {**_helion.KEYS, **_pallas.KEYS}
# the ops a sub-table may tune apart (the Helion backend's; the Pallas keys apply to every op)
TUNING_OPS = _helion.OPS


def check_tuning(spec) -> None:
    """Validate ``spec.tuning`` (a ``TensorProductSpec``'s table) against the backends' keys.

    A top-level key must be some backend's key, or an op of ``TUNING_OPS`` naming a
    sub-table, whose keys must be Helion keys (the Pallas keys apply to every op); a
    per-dtype key must name one of the spec's dtypes, and a Helion one (``block_b_float64``)
    stands in an op's sub-table. Each value is checked by the backend
    that reads it.

    Raises:
        SpecError: one line naming the spec file, its table and the key
            (``tuning.<key>`` or ``tuning.<op>.<key>``), and what is expected.
    """
    def fail(key: str, reason: str):
        raise SpecError(*spec.origin, key, reason)

    expected = f"expected one of {', '.join(TUNING_KEYS)}, or a sub-table per op ({', '.join(TUNING_OPS)})"
    for key, value in spec.tuning:
        op, _, sub = key.rpartition(".")
        where = f"tuning.{key}"
        if op:
            if op not in TUNING_OPS:
                fail(f"tuning.{op}", f"unknown key; {expected}")
            if sub in _pallas.KEYS:
                fail(where, "the Pallas keys apply to every op: set them in [tensor_product.tuning]")
            if sub not in _helion.KEYS:
                fail(where, f"unknown key; {expected}")
            if sub in _helion.DTYPE_KEYS and _helion.DTYPE_KEYS[sub][1] not in spec.dtypes:
                fail(where, f"the spec does not generate {_helion.DTYPE_KEYS[sub][1]} (dtypes = {list(spec.dtypes)})")
        elif key in TUNING_OPS:
            fail(where, f"expected a table of {', '.join(TUNING_KEYS)}; got {value!r}")
        elif key not in TUNING_KEYS:
            fail(where, f"unknown key; {expected}")
        elif key in _helion.DTYPE_KEYS:
            fail(where, f"a per-dtype key belongs in an op's sub-table ([tensor_product.tuning.<op>], "
                        f"one of {', '.join(TUNING_OPS)})")
        elif key in _pallas.DTYPE_KEYS and _pallas.DTYPE_KEYS[key] not in spec.dtypes:
            fail(where, f"the spec does not generate {_pallas.DTYPE_KEYS[key]} (dtypes = {list(spec.dtypes)})")
        try:
            (_helion if sub in _helion.KEYS else _pallas).validate(sub, value)
        except ValueError as e:
            reason = str(e)
        else:
            continue
        fail(where, reason)  # outside the handler: one error, nothing chained
