"""Statements and Pallas-specific expressions of a Pallas kernel body, as data.

A kernel body is a list of statements; the arithmetic inside them is
``eqdsl.kernel_ir`` (``Var``, ``Term``, ``Sum``, ``Fma``, ``Assign``), the rest is
here: reads and writes of operand columns (``Read``, ``Write``, ``LoadTile``,
``StoreTile``), column addresses (``Offset``), lane reductions and masks, and
``lax.fori_loop`` loops (``Loop``). ``printer.print_body`` writes them as Python source,
the only place that does; the passes (``passes``) rewrite the ``Sum``\\ s.

Every tile is ``(rows, P)`` (``P = next_pow2(mul)``, a *wide* tile) or ``(rows, 1)``
(a *narrow* column); ``rows`` and ``dtype`` are the kernel's locals of those names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...kernel_ir import Assign, Sum, Term, Var

__all__ = ["Offset", "Flat", "Scaled", "Zeros", "LaneSum", "RowSum", "Masked", "Add", "Read", "Write",
           "LoadTile", "StoreTile", "RadialRows", "RadialRead", "Comment", "Unflatten", "Loop", "Stmt", "lanesum",
           "sum_of", "assign", "product", "cg_terms"]


# ------------------------------------------------------------------ column addresses


@dataclass(frozen=True)
class Scaled:
    """``var * k``: a loop variable times a stride."""

    var: str
    k: int

    def __str__(self) -> str:
        return f"{self.var} * {self.k}"


@dataclass(frozen=True)
class Flat:
    """``(u * m2 + v)``: the row-major index of loop variables ``u``, ``v``."""

    u: str
    m2: int
    v: str

    def __str__(self) -> str:
        return f"({self.u} * {self.m2} + {self.v})"


@dataclass(frozen=True)
class Offset:
    """Column ``base + index * scale`` of a ref (``index``: a loop variable's name, a
    ``Scaled``, a ``Flat``, or None for ``base`` alone)."""

    base: int
    index: object = None
    scale: int = 1

    def __str__(self) -> str:
        if self.index is None:
            return str(self.base)
        return f"{self.base} + {self.index}" + (f" * {self.scale}" if self.scale != 1 else "")


# ------------------------------------------------------------------ expressions


@dataclass(frozen=True)
class Zeros:
    """``jnp.zeros((rows, width), dtype)``."""

    width: int

    def __str__(self) -> str:
        return f"jnp.zeros((rows, {self.width}), dtype)"


@dataclass(frozen=True)
class LaneSum:
    """Sum over the channel lanes of a wide value, a ``(rows, 1)`` column."""

    value: object

    def __str__(self) -> str:
        return f"jnp.sum({self.value}, axis=1, keepdims=True)"


def lanesum(value, pad: int):
    """``value`` summed over its ``pad`` lanes: ``value`` itself when ``pad`` is 1."""
    return value if pad == 1 else LaneSum(value)


@dataclass(frozen=True)
class RowSum:
    """Sum over the rows of a block, a ``(1, P)`` row (shared weights' gradient)."""

    value: object

    def __str__(self) -> str:
        return f"jnp.sum({self.value}, axis=0, keepdims=True)"


@dataclass(frozen=True)
class Masked:
    """``value`` where ``lane <op> bound`` (``op``: ``==`` or ``<``), else 0.

    ``lane`` is the kernel's ``lax.broadcasted_iota`` of the lanes (``lane_{pad}``)."""

    lane: str
    op: str
    bound: object
    value: object

    def __str__(self) -> str:
        return f"jnp.where({self.lane} {self.op} {self.bound}, {self.value}, 0.0)"


@dataclass(frozen=True)
class Add:
    """``a + b`` of two values (not a ``Sum`` of terms: the passes leave it alone)."""

    a: object
    b: object

    def __str__(self) -> str:
        return f"{self.a} + {self.b}"


# ------------------------------------------------------------------ statements


@dataclass(frozen=True)
class Read:
    """``name = `` lanes ``c < count`` of ``ref``'s columns ``start + c * stride``, a
    ``(rows, pad)`` tile zero past ``count``: a slice of the ref when that is what it is,
    else ``rt.load_vec``."""

    name: str
    ref: str
    start: object
    count: int
    pad: int
    stride: int = 1
    comment: str = ""


@dataclass(frozen=True)
class Write:
    """Lanes ``c < count`` of ``value`` to columns ``start + c * stride`` of ``ref``."""

    ref: str
    start: object
    value: object
    count: int
    pad: int
    stride: int = 1


@dataclass(frozen=True)
class LoadTile:
    """A ``mul_ir`` block read whole (``rt.load_tile``), split into its ``dim`` component tiles ``names``."""

    names: tuple[str, ...]
    ref: str
    start: int
    mul: int
    dim: int
    pad: int
    comment: str = ""


@dataclass(frozen=True)
class StoreTile:
    """Component tiles ``values`` of a ``mul_ir`` block written whole (``rt.store_tile``)."""

    ref: str
    start: int
    values: tuple
    mul: int
    dim: int
    pad: int


@dataclass(frozen=True)
class RadialRows:
    """``name = rt.radial_rows(ref, count=count, pad=pad)``: the kernel's rows of the radial
    features ``(rows, count)`` (``conv_radial``), read once per kernel; zero past ``count``
    lanes of ``pad`` (``eqdsl.runtime.jax.tiles.RadialRows``). ``cols``: the weight columns
    (padded lanes) the kernel forms from them, summed over its ``RadialRead``s; the runtime's
    shared-memory estimate (``tiles.radial_smem_bytes``), None when not counted. ``dot``:
    the spec's ``pallas_radial_dot`` (1: the dots in TF32x3 in float32 on the GPU)."""

    name: str
    ref: str
    count: int
    pad: int
    cols: int | None = None
    dot: int = 0


@dataclass(frozen=True)
class RadialRead:
    """``name = `` a weight vector formed on chip (``conv_radial``): lanes ``c < count`` of
    ``rows @ ref[:, start + c * stride]``, the radial features ``rows`` (a ``RadialRows``)
    times the columns of the radial weight ``ref`` ``(H, weight_numel)``; the ``(rows, pad)``
    tile that ``Read("w", "w_ref", start, count, pad, stride)`` reads from materialized
    weights (``eqdsl.runtime.jax.tiles.radial_vec``)."""

    name: str
    rows: str
    ref: str
    start: object
    count: int
    pad: int
    stride: int = 1


@dataclass(frozen=True)
class Comment:
    """``# text``."""

    text: str


@dataclass(frozen=True)
class Unflatten:
    """``u = t // m2; v = t - u * m2`` (``lax.div``: jnp's ``//`` does not lower to Triton for
    the int64 loop index that ``fori_loop`` has under ``jax_enable_x64``)."""

    t: str
    u: str
    v: str
    m2: int


@dataclass(frozen=True)
class Loop:
    """``lax.fori_loop(0, count, fn, carry)`` over ``var``; ``carry``: the names the body
    updates (none: ``None``); ``body``: statements."""

    fn: str
    var: str
    count: int
    carry: tuple[str, ...]
    body: tuple


Stmt = Union[Assign, Read, Write, LoadTile, StoreTile, RadialRows, RadialRead, Comment, Unflatten, Loop]


def sum_of(terms, init: str | None = None, scale: str | None = None) -> Sum:
    """``Sum`` of ``terms`` (``Term``\\ s) with ``init`` / ``scale`` given by name."""
    return Sum(tuple(terms), Var(init) if init else None, Var(scale) if scale else None)


def assign(target: str, value) -> Assign:
    """``target = value``, ``target`` by name."""
    return Assign(Var(target), value)


def product(*factors) -> Term:
    """``f1 * f2 ...`` (names made ``Var``)."""
    return Term(1.0, tuple(Var(f) if isinstance(f, str) else f for f in factors))


def cg_terms(nonzeros, factors) -> tuple[Term, ...]:
    """One ``Term`` per CG nonzero: its coefficient times ``factors(n)`` (names of the
    operands' component tiles it multiplies)."""
    return tuple(Term(float(n.coeff), tuple(Var(f) if isinstance(f, str) else f for f in factors(n)))
                 for n in nonzeros)
