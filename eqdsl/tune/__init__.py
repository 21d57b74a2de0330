"""``eqdsl tune SPEC``: choose a spec's kernel parameters by timing them on a GPU.

Each kernel op is tuned on its own: an op's kernels depend only on its tuning, so the
best ``fwd`` kernels and the best ``bwd_x2`` kernels need not share tile sizes (they
hold different operands in registers). For each op (``TP_OPS``, plus ``CONV_OPS`` when
asked and the spec has ``conv = true``) the candidates are the spec's current tuning of
that op, then every combination of a grid over ``eqdsl.backends.TUNING_KEYS`` (default
``DEFAULT_GRID``: ``num_warps`` 4, 8; ``block_b`` 2, 4, 8, 16; ``block_c`` 32, 64, 128) set in
the op's sub-table ``[tensor_product.tuning.<op>]``; combinations that give the op the
same kernels as an earlier one are dropped.

One job per (op, candidate), run in a pool of worker processes: generate the package
with that table, call the op once on CUDA (compiling: Helion's code generation, then
Triton; 20 s to 2 min per kernel on the H100 machine's host, single-threaded, hence the
pool), then time it while holding a machine-wide lock (``LOCK``), so that exactly one
job at a time runs on the GPU while the others compile. A timing is the median of
``TIMED_CALLS`` CUDA-event intervals around the op at ``batch`` rows (edges for the
conv ops, on a random graph with ``batch // 64`` nodes) after warm-up calls.

The Pallas (JAX) kernels are tuned as one more op, ``pallas`` (``PALLAS_OPS``; in the
default ops when jax sees a GPU): all of a spec's Pallas kernels share the top-level
keys ``pallas_block_batch`` and ``pallas_num_warps`` (and ``pallas_fuse_bwd``, when
asked for in ``grid``), so a candidate sets those (default grid ``PALLAS_GRID``, and
``pallas_unroll`` over ``PALLAS_UNROLL`` where the kernels loop over a channel), and its
time is that of the jitted forward and backward together (``jax.vjp`` of
``tensor_product``, what training runs): the median over groups of calls ended by
``block_until_ready``, wall clock. The JAX conv's per-edge kernels take the same
``pallas_block_batch``, so they follow the choice made on the plain product. A conv spec
adds the op ``pallas_conv`` (``PALLAS_CONV_OPS``): the keys that shape only the JAX conv's
kernels (``grid.PALLAS_CONV_KEYS``), by default edges per step of its segment kernels
(``pallas_segment_edges``) jointly with CG terms per conv kernel (``pallas_conv_max_terms``;
``PALLAS_CONV_GRID``: the best of one moves with the other), timed as the jitted ``conv``
forward and backward (``jax.vjp``) on a random graph of ``batch`` edges and ``batch // 64``
nodes. The grid's ``PALLAS_CONV_KEYS`` apply to ``pallas_conv`` only, its other ``pallas_*``
keys to ``pallas`` only, the rest to the Helion ops only; an op none of whose keys the grid
names gets its default grid. A tune times one dtype (``dtype``): for a spec of
both dtypes, the Pallas candidates set that dtype's own keys (``pallas_block_batch_<dtype>``,
``pallas_segment_edges_<dtype>``, ``pallas_conv_max_terms_<dtype>``, ``pallas_num_warps_<dtype>``;
``grid.for_dtype``), so the other dtype's kernels keep theirs.

With ``write``, the winners replace the values of the spec's tuning sections in place
(each Helion op's sub-table, the ``pallas_*`` keys of the top-level section; its other keys
stay; comments and layout are kept) and the package is regenerated, so the choice is
committed with the spec and the generated module; users never tune at import.

Raises ``TuneError`` (one line) without a CUDA GPU (for the Helion ops: torch's; for
``pallas``: jax's), for a multi-table spec, a bad grid or op list, or when no candidate
of an op ran; ``SpecError`` for a bad spec.

Modules, one job each:

- ``grid``: the tuned ops, their default grids, ``--grid`` parsing, the candidates of an op;
- ``spec_text``: reading the spec file, writing a tuning table back into its text (tomlkit);
- ``timing``: inside a worker process, generating a candidate's package and timing one op;
- ``worker``: running one job in a subprocess (``python -m eqdsl.tune --worker ...``);
- ``choose``: choosing an op's winner (the current tuning stays within noise);
- ``report``: the progress bar and the results table;
- ``search``: ``tune()``, the command: checks, the job pool, the winners, ``--write``.
"""

from __future__ import annotations

from .grid import (
    CONV_OPS, DEFAULT_GRID, FUSED_CONV_OPS, FUSED_OPS, PALLAS_CONV_GRID, PALLAS_CONV_OPS, PALLAS_GRID, PALLAS_OPS,
    PALLAS_UNROLL, TP_OPS, TuneError, candidates,
    for_dtype, op_grid, override, parse_grid,
)
from .report import format_results
from .search import tune
from .spec_text import tuning_sections, with_tuning
from .timing import LOCK, cuda_median_us, jax_median_us, measure

__all__ = [
    "TuneError", "DEFAULT_GRID", "PALLAS_GRID", "PALLAS_UNROLL", "PALLAS_CONV_GRID", "TP_OPS", "FUSED_OPS", "FUSED_CONV_OPS",
    "CONV_OPS", "PALLAS_OPS", "PALLAS_CONV_OPS",
    "parse_grid", "op_grid", "for_dtype", "candidates", "override", "tuning_sections", "with_tuning", "tune", "format_results",
    "measure", "cuda_median_us", "jax_median_us", "LOCK",
]
