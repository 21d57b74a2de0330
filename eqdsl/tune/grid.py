"""The ops ``eqdsl tune`` times, their parameter grids and each op's candidates.

A spec's tuning table is ``TensorProductSpec.tuning``: sorted ``(key, value)`` pairs, a
sub-table's keys as ``"<op>.<key>"`` (``eqdsl.backends.TUNING_KEYS``, ``eqdsl.backends.TUNING_OPS``). A candidate
is the keys one op's sub-table sets (``()``: the op as the spec has it); for the Pallas ops
(``pallas``, ``pallas_conv``), top-level ``pallas_*`` keys: ``pallas_conv`` those that shape only
the JAX conv's kernels (``PALLAS_CONV_KEYS``), ``pallas`` the others, which every Pallas kernel
of the spec shares.
"""

from __future__ import annotations

import itertools

from ..backends import TUNING_KEYS
from ..backends.helion.tuning import DTYPE_KEYS as HELION_DTYPE_KEYS
from ..backends.pallas.tuning import DTYPE_KEYS

__all__ = [
    "TuneError", "Pairs", "Candidate", "DEFAULT_GRID", "PALLAS_GRID", "PALLAS_UNROLL", "PALLAS_CONV_GRID",
    "PALLAS_CONV_KEYS", "TP_OPS", "FUSED_OPS", "FUSED_CONV_OPS", "CONV_OPS", "PALLAS_OPS", "PALLAS_CONV_OPS", "ALL_OPS", "parse_grid", "override", "op_grid", "for_dtype", "candidates",
]

# 2- and 4-row tiles with 64 or 128 channels: why they suit mul_ir blocks is in
# the Helion backend's Tuning (block_b)
DEFAULT_GRID = {"num_warps": (4, 8), "block_b": (2, 4, 8, 16), "block_c": (32, 64, 128)}
TP_OPS = ("fwd", "bwd_x1", "bwd_x2", "bwd_w")
FUSED_OPS = ("bwd",)  # the fused backward, where the product has one (analysis.fused_bwd_reason)
FUSED_CONV_OPS = ("conv_bwd",)  # and its atomic convolution's
CONV_OPS = ("conv_fwd", "conv_bwd_x", "conv_bwd_y", "conv_bwd_w")
# the JAX conv's kernels (conv = true), timed as the jitted conv forward + backward on a graph
PALLAS_CONV_OPS = ("pallas_conv",)
# pallas: every Pallas kernel of the spec, timed as the jitted tensor_product forward + backward
PALLAS_OPS = ("pallas",) + PALLAS_CONV_OPS
ALL_OPS = TP_OPS + FUSED_OPS + CONV_OPS + FUSED_CONV_OPS + PALLAS_OPS
# rows per program, and warps per program: mace_large ran fastest at 4 rows in float32 and at 2 in
# float64, whose fused backward spills at 4 (H100, 2026-11-27); an 8-to-128 grid missed both
PALLAS_GRID = {"pallas_block_batch": (1, 2, 4, 8, 16, 32, 64), "pallas_num_warps": (2, 4, 8)}
# added to the default pallas grid where the kernels loop over a channel
# (eqdsl.backends.pallas.plan.has_channel_loops; uvw products): 8 steps compiled for over 100 s
# for diffdock_l2 (H200 host, 2026-11-28), so not tried by default
PALLAS_UNROLL = (1, 2, 4)
# top-level keys that shape the JAX conv's kernels only: the pallas_conv op tunes them (with their
# _<dtype> forms), the pallas op the other pallas_* keys
PALLAS_CONV_KEYS = frozenset({"pallas_segment_edges", "pallas_conv_max_terms", "pallas_conv_fused_max_terms",
                              "pallas_conv_fuse_bwd"})
# edges per step of the conv's segment kernels, jointly with the CG terms per conv kernel, because the
# best of one moves with the other: nequip_toluene's float64 conv ran best at 1 edge per step with its
# kernels unsplit (H100, 2026-11-27) and at 4 once split within 48 terms (H200, 2026-11-28: bulk Si fwd
# 4,797 -> 2,264 us); its float32 one within 140 terms, mace_large's within 72. 1200: no split for most
PALLAS_CONV_GRID = {"pallas_segment_edges": (1, 2, 4, 8), "pallas_conv_max_terms": (48, 72, 140, 1200)}

Pairs = tuple[tuple[str, int], ...]  # a spec's tuning table (TensorProductSpec.tuning)
Candidate = tuple[tuple[str, int], ...]  # the keys one op's sub-table sets; () = the op as the spec has it


class TuneError(RuntimeError):
    """Why ``eqdsl tune`` cannot run (one line)."""


def parse_grid(items: list[str]) -> dict[str, tuple[int, ...]]:
    """Parse and validate ``--grid`` arguments.

    Args:
        items: ``KEY=V1,V2,...`` strings, e.g. ``["num_warps=4,8", "block_b=16"]``.

    Returns:
        ``{"num_warps": (4, 8), "block_b": (16,)}``.

    Raises:
        TuneError: a key not in ``eqdsl.backends.TUNING_KEYS``, a value that is not an integer or that
            the key does not accept (e.g. ``block_b`` not a power of two).
    """
    grid: dict[str, tuple[int, ...]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or key not in TUNING_KEYS:
            raise TuneError(f"--grid {item!r}: expected KEY=V1,V2,... with KEY one of {', '.join(TUNING_KEYS)}")
        test, accepts = TUNING_KEYS[key]
        try:
            vals = tuple(int(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise TuneError(f"--grid {item!r}: values must be integers") from None
        bad = [v for v in vals if not test(v)]
        if not vals or bad:
            raise TuneError(f"--grid {item!r}: {key} must be {accepts}")
        grid[key] = vals
    return grid


def _base_key(key: str) -> str:
    """``pallas_segment_edges_float64`` -> ``pallas_segment_edges``; other keys as they are."""
    dtype = DTYPE_KEYS.get(key)
    return key[: -len(dtype) - 1] if dtype else key


def _pallas_op_of(key: str) -> str | None:
    """The Pallas op a grid key tunes (``pallas_conv`` or ``pallas``), or ``None`` for a Helion key."""
    if not key.startswith("pallas_"):
        return None
    return PALLAS_CONV_OPS[0] if _base_key(key) in PALLAS_CONV_KEYS else PALLAS_OPS[0]


def override(table: Pairs, op: str, cand: Candidate) -> Pairs:
    """``table`` with ``cand``'s keys set in ``op``'s sub-table (replacing what it had there);
    for the Pallas ops, the top-level ``pallas_*`` keys. Sorted pairs, as ``TensorProductSpec.tuning``."""
    new = {k if op in PALLAS_OPS else f"{op}.{k}": v for k, v in cand}
    return tuple(sorted({**dict(table), **new}.items()))


def op_grid(grid: dict[str, tuple[int, ...]] | None, op: str, loops: bool = False) -> dict[str, tuple[int, ...]]:
    """The part of ``grid`` that tunes ``op`` (``PALLAS_CONV_KEYS`` for ``pallas_conv``, the other
    ``pallas_*`` keys for ``pallas``, the rest for the Helion ops), or the op's default grid when
    ``grid`` is ``None`` or names none of them (``pallas``: ``PALLAS_GRID``, with ``pallas_unroll``
    over ``PALLAS_UNROLL`` when ``loops``, the product's kernels looping over a channel;
    ``pallas_conv``: ``PALLAS_CONV_GRID``)."""
    mine = {k: v for k, v in (grid or {}).items() if _pallas_op_of(k) == (op if op in PALLAS_OPS else None)}
    if mine:
        return mine
    if op in PALLAS_CONV_OPS:
        return dict(PALLAS_CONV_GRID)
    if op in PALLAS_OPS:
        return {**PALLAS_GRID, **({"pallas_unroll": PALLAS_UNROLL} if loops else {})}
    return dict(DEFAULT_GRID)


def for_dtype(grid: dict[str, tuple[int, ...]], op: str, dtype: str, dtypes: tuple[str, ...],
              table: Pairs = ()) -> dict:
    """``grid`` with its keys that have a per-dtype form made ``dtype``'s own when the spec
    generates more than one dtype (a tune times one dtype, so the other dtype's kernels keep
    their blocks: float64's best rows per program are not float32's) or its ``table`` already
    sets that dtype's key (which would override every candidate of the shared one).

    The Pallas ops: ``pallas_block_batch`` -> ``pallas_block_batch_<dtype>`` (and
    ``pallas_num_warps``, ``pallas_segment_edges``, ``pallas_conv_max_terms``,
    ``pallas_conv_fused_max_terms``). A Helion op: ``block_b``, ``num_warps`` and ``num_stages`` ->
    ``<key>_<dtype>`` in the op's sub-table; its other keys (``block_c``, ...) change the
    op for every dtype. One-dtype specs without the dtype's key: ``grid`` as it is."""
    if op in PALLAS_OPS:
        own = {k: f"{k}_{dtype}" for k in grid if f"{k}_{dtype}" in DTYPE_KEYS}
        set_in_table = {k for k, _ in table}
    else:
        own = {k: f"{k}_{dtype}" for k in grid if f"{k}_{dtype}" in HELION_DTYPE_KEYS}
        set_in_table = {k.partition(".")[2] for k, _ in table if k.partition(".")[0] == op}
    return {(own[k] if k in own and (len(dtypes) > 1 or own[k] in set_in_table) else k): v for k, v in grid.items()}


def _kernels_key(table: Pairs, op: str, ir=None):
    """What decides ``op``'s kernels under ``table`` (two candidates with equal values are one).
    ``pallas_conv`` with the product's ``ir``: the generated Pallas source itself, since a CG-term
    budget larger than the product's kernels need splits nothing (0.5 s per candidate for
    nequip_toluene, against a GPU compile of minutes)."""
    if op in PALLAS_CONV_OPS and ir is not None:
        from ..backends.pallas.assemble import render_files

        return tuple(sorted(render_files(ir, "", tuning=table).items()))
    if op in PALLAS_OPS:
        return tuple((k, v) for k, v in table if k.startswith("pallas_"))
    from ..backends.helion.tuning import DTYPES, dtype_tuning, tuning_for

    return tuple(tuning_for(dtype_tuning(table, d), op) for d in DTYPES)


def candidates(grid: dict[str, tuple[int, ...]], table: Pairs, op: str, ir=None) -> list[Candidate]:
    """``()`` (the op as ``table`` tunes it), then every combination of ``grid`` for ``op``'s
    sub-table (the Pallas ops: top-level ``pallas_*`` keys) that gives the op other kernels
    than every earlier candidate (``ir``, the lowered product: for ``pallas_conv``, compared as
    generated source)."""
    keys = sorted(grid)
    out: list[Candidate] = [()]
    seen = {_kernels_key(table, op, ir)}
    for values in itertools.product(*(grid[k] for k in keys)):
        cand = tuple(zip(keys, values))
        t = _kernels_key(override(table, op, cand), op, ir)
        if t not in seen:
            seen.add(t)
            out.append(cand)
    return out
