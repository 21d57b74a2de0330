"""Term tables of a symmetric contraction's kernels: every derivative as sparse data the kernels loop over.

The contraction (``eqdsl.symmetric.ir``) contracted with an output cotangent ``G`` is, per node
``b`` and channel ``c``, the form

    F(x, W, G) = sum_t coeff_t * G[o_t, m_t] * W[elem, off(o_t, nu_t) + k_t * mul + c] * prod_{i in mono_t} x_i

and its ``n``-th directional derivative in ``x`` along ``h_1..h_n``,
``F_n = D^n_x F[h_1, ..., h_n]``, differentiates each monomial: a sum over the ordered choices of
``n`` distinct positions of the monomial, ``h_j`` read at the ``j``-th chosen position's
component and ``x`` at the others. Every kernel computes one partial derivative of one ``F_n``
(``eqdsl.runtime.torch.symmetric`` documents why these close autodiff at every order)::

    fwd_n   = dF_n/dG   result slots: the output components (o, m)     factors: W, h_1..h_n, x..
    bwd_w_n = dF_n/dW   result slots: the weight rows (o, nu, k)       factors: G, h_1..h_n, x..
    bwd_x_n = dF_n/dx   result slots: the input components j           factors: W, G, h_1..h_n, x..

(``bwd_x_n``: one more chosen position, the differentiated one, whose component is the slot.)
Each result slot's terms are grouped by their number ``q`` of ``x`` factors, ``0..Q`` (``Q =
N - n``, ``bwd_x``: ``N - n - 1``, ``N`` the largest order with a term): a kernel has one loop
per group with ``q`` loads of ``x`` each, and loops over the group's terms at run time, reading
the factors' columns from the table. Kernel source is then a few lines whatever the irreps
(the straight-line kernels it replaces were 1,200-5,400 lines for MACE-MP's case and took
minutes to compile), and the tables are data: built here, from the IR's symmetrized terms,
deterministically, by both frameworks' runtimes.

Terms that differentiate to the same factors (equal components in a monomial) are merged:
their coefficients add. Columns address a node row of the operand in its layout: channel ``c``
of component ``i`` sits at ``base_i + c * stride_i`` (``columns``); weight rows at ``col + c``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..irreps import Irreps
from .ir import SymmetricContractionIR

__all__ = ["KINDS", "op_name", "OpTables", "columns", "groups", "table_columns", "op_tables", "num_x_factors", "max_order",
           "apply_tables_reference", "PackageTables"]

KINDS = ("fwd", "bwd_w", "bwd_x")


def op_name(kind: str, k: int) -> str:
    """``fwd``, ``fwd_d1``, ``bwd_x_d2``, ...: the op (and kernel suffix) of derivative family
    ``kind`` with ``k`` directions."""
    return kind if k == 0 else f"{kind}_d{k}"


def columns(dims: tuple[int, ...], mul: int, layout: str) -> tuple[tuple[int, int], ...]:
    """Per component ``i`` of the blocks ``dims``: ``(base, stride)``, channel ``c`` of component
    ``i`` sitting at column ``base + c * stride`` of a row (``eqdsl.symmetric.ir``'s layouts:
    ``mul_ir`` ``(mul * s_j + (i - s_j), 2l+1)``, ``ir_mul`` ``(i * mul, 1)``).

    Raises:
        ValueError: an unknown layout.
    """
    if layout not in ("mul_ir", "ir_mul"):
        raise ValueError(f"layout must be 'mul_ir' or 'ir_mul', got {layout!r}")
    out, start = [], 0
    for d in dims:
        for m in range(d):
            out.append((mul * start + m, d) if layout == "mul_ir" else ((start + m) * mul, 1))
        start += d
    return tuple(out)


def _degree(ir: SymmetricContractionIR) -> int:
    return max((t.nu for t in ir.terms), default=0)


def max_order(ir: SymmetricContractionIR, kind: str) -> int:
    """The largest ``n`` whose ``kind`` derivative is not identically zero: ``N`` for ``fwd`` and
    ``bwd_w``, ``N - 1`` for ``bwd_x`` (``N`` the largest order with a term; -1: none)."""
    n = _degree(ir)
    return n - 1 if kind == "bwd_x" else n


def num_x_factors(ir: SymmetricContractionIR, kind: str, n: int) -> int:
    """``Q``: the most ``x`` factors a term of ``kind``'s ``n``-th derivative has."""
    return max(0, _degree(ir) - n - (1 if kind == "bwd_x" else 0))


def groups(ir: SymmetricContractionIR, kind: str, n: int) -> int:
    """Term groups per result slot (``Q + 1``: ``q = 0..Q`` factors of ``x``)."""
    return num_x_factors(ir, kind, n) + 1


def table_columns(kind: str, n: int, q_max: int) -> tuple[str, ...]:
    """Names of the integer columns of a table: ``w`` (weight column, ``fwd``/``bwd_x``), ``g`` and
    ``g_stride`` (``bwd_w``/``bwd_x``), ``h<j>`` and ``h<j>_stride`` per direction, ``x<q>`` and
    ``x<q>_stride`` per ``x`` factor (zero beyond a term's own ``q``)."""
    cols: list[str] = []
    if kind in ("fwd", "bwd_x"):
        cols.append("w")
    if kind in ("bwd_w", "bwd_x"):
        cols += ["g", "g_stride"]
    for j in range(1, n + 1):
        cols += [f"h{j}", f"h{j}_stride"]
    for q in range(1, q_max + 1):
        cols += [f"x{q}", f"x{q}_stride"]
    return tuple(cols)


@dataclass(frozen=True)
class OpTables:
    """The tables of one kernel (op ``kind`` of order ``n``).

    Attributes:
        kind, n: the op (``fwd`` | ``bwd_w`` | ``bwd_x``) and its number of directions.
        slots: ``(base, stride)`` per result slot: its column in a result row (``fwd``: output
            components, ``bwd_x``: input components, ``c`` at ``base + c * stride``; ``bwd_w``:
            the weight row ``(o, nu, k)``'s column, stride 1).
        groups: ``Q + 1``.
        ptr: ``len(slots) * groups + 1`` offsets: slot ``r``'s group ``q`` is terms
            ``ptr[r * groups + q] : ptr[r * groups + q + 1]``.
        columns: names of ``cols``' columns (``table_columns``).
        cols: per term, the integer columns.
        coeff: per term, its coefficient (float64; the kernels read it in their dtype).
        mono_ptr, mono_cols, mono_terms: the same terms by distinct monomial (their ``h`` and
            ``x`` factors; terms are sorted so that a monomial's terms are adjacent): group
            ``g``'s monomials are ``mono_ptr[g] : mono_ptr[g + 1]``, monomial ``m``'s factor
            columns ``mono_cols[m]`` (``columns[head_width:]``) and its terms ``mono_terms[m] :
            mono_terms[m + 1]``, whose *heads* (``cols[t][:head_width]``: ``w``, ``g``) and
            coefficients sum before the monomial multiplies them once (MACE-MP's forward: 1,909
            terms, 410 monomials).
        head_width: the number of head columns.
    """

    kind: str
    n: int
    slots: tuple[tuple[int, int], ...]
    groups: int
    ptr: tuple[int, ...]
    columns: tuple[str, ...]
    cols: tuple[tuple[int, ...], ...]
    coeff: tuple[float, ...]
    mono_ptr: tuple[int, ...] = ()
    mono_cols: tuple[tuple[int, ...], ...] = ()
    mono_terms: tuple[int, ...] = ()
    head_width: int = 0

    def __str__(self) -> str:
        return (f"OpTables({self.kind} n={self.n}: {len(self.slots)} slots x {self.groups} groups, "
                f"{len(self.coeff)} terms, {len(self.mono_cols)} monomials, {len(self.columns)} columns)")


def _dims(irreps: str) -> tuple[int, ...]:
    return tuple(mi.ir.dim for mi in Irreps(irreps))


def op_tables(ir: SymmetricContractionIR, kind: str, n: int, layout: str | None = None) -> OpTables:
    """The tables of op ``kind`` of order ``n`` (``0 <= n <= max_order(ir, kind)``), addressing
    rows in ``layout`` (default: the IR's; the torch runtime runs ``mul_ir`` contractions on
    ``ir_mul`` rows, whose channels are contiguous).

    Raises:
        ValueError: an unknown kind or an order outside that range.
    """
    if kind not in KINDS or not 0 <= n <= max_order(ir, kind):
        raise ValueError(f"no {kind!r} derivative of order {n} for {ir.name} (max {max_order(ir, kind)})")
    layout = layout or ir.layout
    in_cols = columns(_dims(ir.irreps_in), ir.mul, layout)
    out_dims = _dims(ir.irreps_out)
    out_cols = columns(out_dims, ir.mul, layout)
    out_first = [sum(out_dims[:o]) for o in range(len(out_dims))]
    free = 1 if kind == "bwd_x" else 0
    q_max = num_x_factors(ir, kind, n)
    names = table_columns(kind, n, q_max)

    if kind == "fwd":
        slots = out_cols
    elif kind == "bwd_x":
        slots = in_cols
    else:
        slot_of_w: dict[int, int] = {}
        wslots = []
        for o, ks in enumerate(ir.num_params):
            for nu, kk in enumerate(ks, start=1):
                for k in range(kk):
                    col = ir.weight_offsets[o][nu - 1] + k * ir.mul
                    slot_of_w[col] = len(wslots)
                    wslots.append((col, 1))
        slots = tuple(wslots)

    merged: dict[tuple, float] = {}
    for t in ir.terms:
        if t.nu < n + free:
            continue
        wcol = ir.weight_offsets[t.out][t.nu - 1] + t.k * ir.mul
        gcomp = out_first[t.out] + t.m
        positions = range(t.nu)
        for choice in itertools.permutations(positions, n + free):
            dirs = tuple(t.monomial[p] for p in choice[:n])
            xs = tuple(sorted(t.monomial[p] for p in positions if p not in choice))
            if kind == "fwd":
                slot, head = gcomp, (wcol,)
            elif kind == "bwd_x":
                slot, head = t.monomial[choice[n]], (wcol, *out_cols[gcomp])
            else:
                slot, head = slot_of_w[wcol], out_cols[gcomp]
            key = (slot, len(xs), head, dirs, xs)
            merged[key] = merged.get(key, 0.0) + t.coeff

    ptr, cols, coeff = [0], [], []
    mono_ptr, mono_cols, mono_terms = [0], [], [0]
    by_group: dict[tuple[int, int], list] = {}
    # within a group, terms sorted by their x-and-h factors (the "monomial"), then the head (W, G)
    for (slot, q, head, dirs, xs), c in sorted(merged.items(), key=lambda kv: (kv[0][:2], kv[0][3:], kv[0][2])):
        if c == 0.0:
            continue
        tail = []
        for i in dirs:
            tail += in_cols[i]
        for i in xs:
            tail += in_cols[i]
        tail += [0, 0] * (q_max - q)
        by_group.setdefault((slot, q), []).append((tuple(head), tuple(tail), c))
    for slot in range(len(slots)):
        for q in range(q_max + 1):
            last = None
            for head, tail, c in by_group.get((slot, q), ()):
                if tail != last:
                    if last is not None:
                        mono_terms.append(len(coeff))
                    mono_cols.append(tail)
                    last = tail
                cols.append(head + tail)
                coeff.append(c)
            if last is not None:
                mono_terms.append(len(coeff))
            ptr.append(len(coeff))
            mono_ptr.append(len(mono_cols))
    return OpTables(kind=kind, n=n, slots=tuple(slots), groups=q_max + 1, ptr=tuple(ptr), columns=names,
                    cols=tuple(cols), coeff=tuple(coeff), mono_ptr=tuple(mono_ptr), mono_cols=tuple(mono_cols),
                    mono_terms=tuple(mono_terms), head_width=len(names) - 2 * (n + q_max))


def apply_tables_reference(tables: OpTables, mul: int, x, hs, weights=None, g=None, elem=None, *,
                           num_elements: int | None = None, result_width: int | None = None):
    """What a kernel computes from ``tables``, in numpy (the kernels' ``*_reference``).

    Args:
        tables: ``op_tables(ir, kind, n)``.
        mul: channels.
        x, hs: ``(N, dim_in * mul)`` rows and the ``n`` directions, same shape.
        weights: ``(num_elements, weight_numel)`` (``fwd``, ``bwd_x``).
        g: ``(N, dim_out * mul)`` (``bwd_w``, ``bwd_x``).
        elem: ``(N,)`` element indices.
        num_elements: rows of ``bwd_w``'s result.
        result_width: columns of ``fwd``'s / ``bwd_x``'s / ``bwd_w``'s result row.

    Returns:
        ``(N, result_width)`` (``fwd``, ``bwd_x``) or ``(num_elements, result_width)`` (``bwd_w``).
    """
    import numpy as np

    x = np.asarray(x)
    c = np.arange(mul)
    name = {nm: i for i, nm in enumerate(tables.columns)}
    rows = num_elements if tables.kind == "bwd_w" else x.shape[0]
    out = np.zeros((rows, result_width), dtype=x.dtype)
    elem = None if elem is None else np.asarray(elem)

    def col(row, key):
        return row[name[key]] + c * row[name[key + "_stride"]]

    for r, (base, stride) in enumerate(tables.slots):
        acc = np.zeros((x.shape[0], mul), dtype=x.dtype)
        for q in range(tables.groups):
            lo, hi = tables.ptr[r * tables.groups + q], tables.ptr[r * tables.groups + q + 1]
            for row, cf in zip(tables.cols[lo:hi], tables.coeff[lo:hi]):
                p = np.full((x.shape[0], mul), cf, dtype=x.dtype)
                if "w" in name:
                    p = p * np.asarray(weights)[elem][:, row[name["w"]] + c]
                if "g" in name:
                    p = p * np.asarray(g)[:, col(row, "g")]
                for j, h in enumerate(hs, start=1):
                    p = p * np.asarray(h)[:, col(row, f"h{j}")]
                for i in range(1, q + 1):
                    p = p * x[:, col(row, f"x{i}")]
                acc += p
        if tables.kind == "bwd_w":
            np.add.at(out, (elem[:, None], base + c[None, :]), acc)
        else:
            out[:, base + c * stride] = acc
    return out


class PackageTables:
    """The tables of a generated package's ops, built on first use from its ``__init__`` and
    ``terms.py`` (``eqdsl.symmetric.terms.ir_from_package``) and kept, plain or of the folded IR
    (``eqdsl.symmetric.fold``).

    Args:
        package: the package's import name (``__package__`` of its generated modules).
    """

    def __init__(self, package: str):
        self.package = package
        self._ir: SymmetricContractionIR | None = None
        self._fold = None
        self._tables: dict[tuple, OpTables] = {}

    @property
    def ir(self) -> SymmetricContractionIR:
        if self._ir is None:
            import importlib

            from .terms import ir_from_package

            self._ir = ir_from_package(importlib.import_module(self.package),
                                       importlib.import_module(self.package + ".terms"))
        return self._ir

    @property
    def fold(self):
        """``eqdsl.symmetric.fold.fold_ir(ir)``, built once."""
        if self._fold is None:
            from .fold import fold_ir

            self._fold = fold_ir(self.ir)
        return self._fold

    def get(self, kind: str, n: int, layout: str | None = None, folded: bool = False) -> OpTables:
        """``op_tables(ir, kind, n, layout)`` (``folded``: of ``fold.ir``), built once."""
        key = (kind, n, layout, folded)
        if key not in self._tables:
            self._tables[key] = op_tables(self.fold.ir if folded else self.ir, kind, n, layout)
        return self._tables[key]
