"""The Helion kernels' statements and operand accesses as data, and their one printer.

The kernel builders (``kernels``, ``fused``) describe each statement of a kernel body
as a frozen dataclass below; ``print_stmt`` turns it into one line (or, for a ``Loop``,
an indented block) of Helion source, and nothing rewrites that text afterwards.

Every operand of a generated kernel is a whole ``(rows, dim)`` tensor (``x1``, ``g``,
``weights``, ...; shared weights: the ``(weight_numel,)`` vector), never a per-block
view: building views on the host cost more than the kernel (mace_large's forward spent
~580 us of host time per call against ~470-575 us of kernel, H100 host, 2026-11-22), so
the column arithmetic lives in the kernel, where it is integer adds on tile indices
that Triton folds. An ``Access`` knows

* its tensor;
* its row: a tile (``tile_b``), a scalar (``node``, ``tile_p.id``), or a 1-D index
  tensor gathered per edge (``s_idx = src[tile_b]``, ``eid = order[tile_b]``: the
  convolution's, ``Row.gathered``); or none (the shared weight vector);
* its column: a constant ``offset`` plus, per tiled axis, the axis's index (a tile's
  ``tile_c.index`` or ``hl.arange(n)``) times its stride in the operand's layout.

It prints as ``T[row, offset + a0[:, None] * s0 + a1[None, :]]``: each axis keeps its
own dimension (``None`` in the others), so the access has the shape a per-block view's
``V[row, i0, i1]`` would have. Helion still masks each tile's out-of-range lanes (it
tracks the tile behind ``tile.index``), and padded component lanes keep their
``extra_mask``. Helion indexes a gathered row and a one-axis column as an outer product
(each 1-D block-sized indexer its own dimension), but broadcasts the indexers together
against a column of two or more axes: there the gathered row takes the first of ``1 +
axes`` broadcast dimensions (``weights[eid[:, None, None], off + tile_s.index[None, :,
None] * R + tile_r.index[None, None, :]]``).

The formatting helpers (``sum_expr``, ``wrap``, ``ranges``, ...) build the local
arithmetic of the statements (sums of literal-coefficient products of loaded names)
and the comments and docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...kernel_ir import Sum, term

__all__ = [
    "Tile", "Arange", "TileId", "Row", "Access", "Read", "MaskedLoad", "Zeros", "Assign", "Store", "MaskedStore",
    "AtomicAdd", "Comment", "Loop", "Matmul", "Stmt", "print_stmt", "print_stmts", "print_access", "sum_expr", "wrap",
    "natural", "ranges", "plural",
]


@dataclass(frozen=True)
class Tile:
    """A tile's indices along one column axis (``tile_c`` -> ``tile_c.index``)."""

    name: str


@dataclass(frozen=True)
class Arange:
    """``hl.arange(n)`` along one column axis (a ``mul_ir`` block's padded components)."""

    n: int


@dataclass(frozen=True)
class TileId:
    """A tile's number along its axis (``tile_c.id``): a program's own partial-sum slot.
    A column with such an axis always prints its offset (``0 + tile_c.id * 16``: the
    slot's base column, then the slot)."""

    name: str


Axis = Tile | Arange | TileId


@dataclass(frozen=True)
class Row:
    """The row index of an access: ``expr`` (``tile_b``, ``node``, ``tile_p.id``, ``s_idx``);
    ``gathered``: a 1-D index tensor (broadcast against a column of several axes);
    ``outer``: a 1-D index tensor that is always the access's own first dimension, also
    against a one-axis column (``hl.arange(64)`` over the rows of ``conv_radial``'s
    ``radial_weight``: ``radial_weight[hl.arange(64)[:, None], tile_c.index[None, :]]``,
    a ``(64, tile_c)`` tile)."""

    expr: str
    gathered: bool = False
    outer: bool = False


@dataclass(frozen=True)
class Access:
    """Columns ``offset + sum(index(axis) * stride)`` of row ``row`` of ``tensor`` (``row``
    None: a vector, the shared weights). ``axes``: ``(axis, stride)`` in the order of the
    result's dimensions."""

    tensor: str
    row: Row | None
    offset: int
    axes: tuple[tuple[Axis, int], ...] = ()


@dataclass(frozen=True)
class Read:
    """``T[index]`` then ``suffix`` (e.g. ``[:, None]``)."""

    access: Access
    suffix: str = ""


@dataclass(frozen=True)
class MaskedLoad:
    """``hl.load(T, [index], extra_mask=mask)`` then ``suffix``."""

    access: Access
    mask: str
    suffix: str = ""


@dataclass(frozen=True)
class Zeros:
    """``hl.zeros(shape, dtype=T.dtype)``: an accumulator of tensor ``dtype_of``'s dtype."""

    shape: str
    dtype_of: str


@dataclass(frozen=True)
class Matmul:
    """The ``(rows, cols)`` product of the local ``(rows, K)`` tile ``lhs`` and the ``(K, cols)``
    tile ``rhs`` (a load): ``torch.matmul(lhs, rhs)`` when ``dot`` (Helion lowers it to
    ``tl.dot``, whose tiles need at least 16 rows, columns and ``K``; IEEE float32 with the
    kernel's ``dot_precision = "ieee"``), else ``(lhs[:, :, None] * rhs[None, :, :]).sum(1)``
    (multiply-adds on the CUDA cores, any tile size). ``conv_radial``'s per-edge weights
    formed on chip: ``radial_features`` tile times ``radial_weight`` columns."""

    lhs: str
    rhs: "Read | MaskedLoad"
    dot: bool


Value = str | Read | MaskedLoad | Zeros | Matmul  # str: arithmetic over the kernel's local names


@dataclass(frozen=True)
class Assign:
    """``target = value``."""

    target: str
    value: Value


@dataclass(frozen=True)
class Store:
    """``T[index] = value``."""

    access: Access
    value: str


@dataclass(frozen=True)
class MaskedStore:
    """``hl.store(T, [index], value, extra_mask=mask)``."""

    access: Access
    value: str
    mask: str


@dataclass(frozen=True)
class AtomicAdd:
    """``hl.atomic_add(T, [index], value)``: a scatter into rows other programs also write."""

    access: Access
    value: str


@dataclass(frozen=True)
class Comment:
    """``# text``."""

    text: str


@dataclass(frozen=True)
class Loop:
    """``for header:`` and its indented body."""

    header: str
    body: tuple[Stmt, ...]


Stmt = Assign | Store | MaskedStore | AtomicAdd | Comment | Loop


def _index(a: Access) -> str:
    """The index list of ``a`` (without brackets)."""
    gathered_row = a.row is not None and (a.row.outer or (a.row.gathered and len(a.axes) > 1))
    lead = 1 if gathered_row else 0  # the gathered row's own broadcast dimension
    ndim = lead + len(a.axes)

    def bcast(pos: int) -> str:
        return "" if ndim == 1 else "[" + ", ".join(":" if i == pos else "None" for i in range(ndim)) + "]"

    head = [] if a.row is None else [a.row.expr + (bcast(0) if lead else "")]
    slot = any(isinstance(axis, TileId) for axis, _ in a.axes)
    terms = [str(a.offset)] if a.offset or not a.axes or slot else []
    for i, (axis, stride) in enumerate(a.axes):
        if isinstance(axis, Arange):
            expr = f"hl.arange({axis.n})"
        else:
            expr = f"{axis.name}.{'index' if isinstance(axis, Tile) else 'id'}"
        terms.append(f"{expr}{bcast(lead + i)}" + (f" * {stride}" if stride != 1 else ""))
    return ", ".join(head + [" + ".join(terms)])


def print_access(a: Access) -> str:
    """``T[index]``."""
    return f"{a.tensor}[{_index(a)}]"


def _value(v: Value) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, Read):
        return print_access(v.access) + v.suffix
    if isinstance(v, MaskedLoad):
        return f"hl.load({v.access.tensor}, [{_index(v.access)}], extra_mask={v.mask}){v.suffix}"
    if isinstance(v, Matmul):
        if v.dot:
            return f"torch.matmul({v.lhs}, {_value(v.rhs)})"
        return f"({v.lhs}[:, :, None] * {_value(v.rhs)}[None, :, :]).sum(1)"
    return f"hl.zeros({v.shape}, dtype={v.dtype_of}.dtype)"


def print_stmt(s: Stmt) -> str:
    """The Helion source of ``s`` (a ``Loop``: several lines, its body indented by 4)."""
    if isinstance(s, Assign):
        return f"{s.target} = {_value(s.value)}"
    if isinstance(s, Store):
        return f"{print_access(s.access)} = {s.value}"
    if isinstance(s, MaskedStore):
        return f"hl.store({s.access.tensor}, [{_index(s.access)}], {s.value}, extra_mask={s.mask})"
    if isinstance(s, AtomicAdd):
        return f"hl.atomic_add({s.access.tensor}, [{_index(s.access)}], {s.value})"
    if isinstance(s, Comment):
        return f"# {s.text}"
    if isinstance(s, Loop):
        return f"for {s.header}:\n" + "\n".join("    " + line for st in s.body for line in print_stmt(st).split("\n"))
    raise TypeError(f"not a statement: {s!r}")


def print_stmts(stmts) -> list[str]:
    """``print_stmt`` of each (what the templates paste, one entry per statement)."""
    return [print_stmt(s) for s in stmts]


# ------------------------------------------------------------------ arithmetic and prose


def sum_expr(terms: list[tuple[float, list[str]]]) -> str:
    """``c0 * a * b + c1 * ...`` (``kernel_ir.Sum`` of literal-coefficient ``Term``\\ s, 1 left
    out) as one parenthesised expression, two terms a line if long."""
    s = Sum(tuple(term(c, *f) for c, f in terms))
    return wrap([str(s.terms[0])] + s.terms_text()[1:])  # a leading minus glued to its term: -0.5 * a


def wrap(parts: list[str]) -> str:
    """``parts`` (``a``, ``+ b``, ...) joined and parenthesised, two a line past 80 characters."""
    one = " ".join(parts)
    if len(one) <= 80:
        return f"({one})"
    lines = [" ".join(parts[i : i + 2]) for i in range(0, len(parts), 2)]
    return "(\n    " + "\n    ".join(lines) + "\n)"


def natural(name: str) -> tuple:
    """Sort key for generated names (``sb1_10_0`` after ``sb1_2_0``)."""
    parts: list[str] = []
    for c in name:  # runs of digits and of other characters, with empty ends as str.split would give
        if not parts or c.isdigit() != parts[-1][-1].isdigit():
            parts.append("")
        parts[-1] += c
    if parts and parts[0][0].isdigit():
        parts.insert(0, "")
    if parts and parts[-1][-1].isdigit():
        parts.append("")
    return tuple(int(t) if t.isdigit() else t for t in parts)


def ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def plural(n: int, word: str) -> str:
    """``"1 path"``, ``"3 paths"``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
