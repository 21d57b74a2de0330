"""Pallas kernels of a symmetric contraction (issue 27): ``SymmetricContractionIR`` ->
``pallas_kernels.py`` + ``jax_ops.py``, loops over term tables.

The function (``eqdsl.symmetric.ir``) contracted with an output cotangent ``G`` is the form
``F(x, W, G)``, a polynomial of degree ``N = max(correlation)`` in ``x``, linear in ``W`` and
``G``; its ``n``-th directional derivative ``F_n = D^n_x F[h_1..h_n]`` has three partial
derivatives, one kernel each (``eqdsl.symmetric.tables`` defines them)::

    fwd_n(x, h.., W)      = dF_n/dG    n = 0..N       rows like out
    bwd_x_n(x, h.., W, G) = dF_n/dx    n = 0..N-1     rows like x
    bwd_w_n(x, h.., G)    = dF_n/dW    n = 0..N       per node; summed per element by the runtime

Every kernel is a loop over data, the tables of ``eqdsl.symmetric.tables.op_tables`` that the
runtime (``eqdsl.runtime.jax.symmetric``) builds from the package's ``terms.py``: its source
is a function of ``(kind, n, number of term groups, block sizes)`` only, tens of lines
whatever the irreps (the straight-line kernels this replaces were 1,200-5,400 lines for
MACE-MP's case: 1.7 MB of source, and the backward did not compile in 9 minutes on an H100).

A kernel here is the *body* of a program: given its result slot ``r``, its rows (a
``(rows, 1)`` index vector), their elements ``e`` and its channels ``c`` (a ``(1, lanes)``
index vector), it returns the ``(rows, lanes)`` tile of slot ``r``: per group ``q`` of the
slot's terms (``q`` factors of ``x``), a ``lax.fori_loop`` over the group's distinct
monomials (``tables.mono_ptr``), and per monomial a loop over its terms summing their
heads ``coeff * W[e, w] * G[rows, g]`` (the head factors the kind has) before the monomial's
factors ``h_1..h_n, x..`` (columns ``tables.mono[m]``) multiply the sum once. Every factor is a
gathered ``(rows, lanes)`` read ``ref[rows, col + c]`` of its operand at the column a table
row gives: the runtime runs the kernels on ``ir_mul`` rows (channels contiguous, column
stride 1), permuting a ``mul_ir`` contraction's operands in and its results out. The
runtime's program (``eqdsl.runtime.jax.symmetric``) picks the rows, the slot and the
channels from the grid, and writes the tile (``bwd_w``: summed over the rows of one
element first).

Codegen is data: a kernel is a ``SymmetricKernel`` of ``Group``\\ s of ``Factor``\\ s (each
prints itself); the template ``templates/pallas_symmetric_kernels.py.j2`` only loops.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..backends.render import render
from ..codegen.package import MARKER, write_package
from .codegen import common_files
from .ir import SymmetricContractionIR
from .tables import KINDS, columns, groups, max_order

__all__ = ["SymmetricKernel", "Group", "Factor", "columns", "build_kernels", "channel_blocking", "column_align",
           "head_names", "render_files", "jax_files", "generate_symmetric_jax", "OPS", "DEFAULT_BLOCK_CHANNELS",
           "DEFAULT_BLOCK_NODES"]

OPS = KINDS
# Channels per program (a power of two dividing mul, else one block of next_pow2(mul) lanes)
# and rows per program: 2 x 128 = 256 lanes, the tile the Helion kernels of the same tables
# measured best on an H100 (eqdsl.symmetric.helion.default_blocks); not tuned for Pallas yet.
DEFAULT_BLOCK_CHANNELS = 128
DEFAULT_BLOCK_NODES = 2


def channel_blocking(mul: int, block_channels: int) -> tuple[int, int, int]:
    """``(lanes, count, blocks)``: tile width (a power of two), channels used per tile and
    channel blocks per row. ``block_channels`` (a power of two) when it divides ``mul``,
    else one block of ``next_pow2(mul)`` lanes (``count = mul``; the padded lanes read a real
    channel again and are never written).

    Raises:
        ValueError: ``block_channels`` not a positive power of two.
    """
    if block_channels < 1 or block_channels & (block_channels - 1):
        raise ValueError(f"block_channels must be a power of two, got {block_channels}")
    if mul % block_channels == 0:
        return block_channels, block_channels, mul // block_channels
    pad = 1 << max(mul - 1, 0).bit_length()
    return pad, mul, 1


def column_align(mul: int, lanes: int) -> int:
    """The power of two every column start ``col + c0`` of a read is a multiple of, on
    ``ir_mul`` rows: table columns are multiples of ``mul`` (components ``i * mul``, weight
    rows ``offset + k * mul``), channel blocks of ``lanes``; capped at 16 (a 64-byte vector
    in float32). Given to Triton as a hint (``pl.multiple_of``) so that it vectorizes loads; 1
    (no hint) when ``lanes`` does not divide ``mul``."""
    if mul % lanes:
        return 1
    return min(mul & -mul, lanes, 16)


def head_names(kind: str) -> tuple[str, ...]:
    """The head factors of ``kind``'s terms, in the tables' column order: ``w`` (``fwd``,
    ``bwd_x``), then ``g`` (``bwd_w``, ``bwd_x``)."""
    return {"fwd": ("w",), "bwd_w": ("g",), "bwd_x": ("w", "g")}[kind]


@dataclass(frozen=True)
class Factor:
    """A factor of a term: ``ref[rows, col + c]`` with ``col = tables.<table>[<index>,
    <column>]`` (hinted a multiple of ``align`` when above 1); ``rows``: ``rows`` or the
    rows' elements ``e`` (weights)."""

    ref: str
    rows: str
    table: str
    index: str
    column: int
    align: int = 1

    def __str__(self) -> str:
        col = f"tables.{self.table}[{self.index}, {self.column}]"
        if self.align > 1:
            col = f"pl.multiple_of({col}, {self.align})"
        return f"{self.ref}[{self.rows}, {col} + c]"


@dataclass(frozen=True)
class Group:
    """Term group ``q`` (``q`` factors of ``x``): per term the ``head`` factors (with the
    coefficient ``tables.coeff[t]``), per monomial the ``mono`` factors (``h_1..h_n``, then
    ``q`` reads of ``x``)."""

    q: int
    head: tuple[Factor, ...]
    mono: tuple[Factor, ...]

    @property
    def term(self) -> str:
        return " * ".join(["tables.coeff[t]"] + [str(f) for f in self.head])


@dataclass(frozen=True)
class SymmetricKernel:
    """One generated kernel body.

    Attributes:
        name: ``f"{op}_{n}"``.
        op: ``"fwd"`` | ``"bwd_x"`` | ``"bwd_w"``.
        n: number of directions ``h``.
        refs: the operand refs, in call order: ``x_ref``, ``h1_ref``..``hn_ref``, then
            ``w_ref`` (fwd, bwd_x) and ``g_ref`` (bwd_x, bwd_w).
        groups: the number of term groups per slot (``Q + 1``: ``tables.mono_ptr`` has
            ``groups`` entries per slot).
        loops: the non-empty groups' loops.
        desc: the docstring.
    """

    name: str
    op: str
    n: int
    refs: tuple[str, ...]
    groups: int
    loops: tuple[Group, ...]
    desc: str


_WHAT = {"fwd": "dF_{n}/dG: {what}, (rows, DIM_OUT * MUL)",
         "bwd_x": "dF_{n}/dx: {what}, (rows, DIM_IN * MUL)",
         "bwd_w": "dF_{n}/dW, one weight row (slot r) per node: {what}"}


def _describe(op: str, n: int) -> str:
    hs = "h1" if n == 1 else f"h1..h{n}"
    if op == "fwd":
        what = "out = W . P(x)" if n == 0 else f"D^{n}_x out[{hs}]"
    elif op == "bwd_x":
        what = "the G-contracted gradient of the polynomials" if n == 0 else \
            f"the gradient of D^{n}_x F[{hs}]" + (" (the Hessian-vector product)" if n == 1 else "")
    else:
        what = "sum_m G[o, m] * P[o, m, nu, k]" if n == 0 else f"sum_m G[o, m] * D^{n}_x P[o, m, nu, k][{hs}]"
    return _WHAT[op].format(n=n, what=what)


def build_kernel(kind: str, n: int, num_groups: int, align: int) -> SymmetricKernel:
    """The kernel body of op ``kind`` with ``n`` directions and ``num_groups`` term groups
    (``eqdsl.symmetric.tables.groups``): a function of these and of the column hint
    ``align`` (``column_align``) only."""
    hs = tuple(f"h{j}_ref" for j in range(1, n + 1))
    heads = head_names(kind)
    refs = ("x_ref",) + hs + tuple(f"{h}_ref" for h in heads)
    head = tuple(Factor(f"{h}_ref", "e" if h == "w" else "rows", "heads", "t", i, align)
                 for i, h in enumerate(heads))
    free = 1 if kind == "bwd_x" else 0
    loops = []
    for q in range(num_groups):
        if n + q + free == 0:  # a term of degree 0: none (every term has nu >= 1)
            continue
        mono = tuple(Factor(ref, "rows", "mono", "m", j, align) for j, ref in enumerate(hs + ("x_ref",) * q))
        loops.append(Group(q, head, mono))
    return SymmetricKernel(f"{kind}_{n}", kind, n, refs, num_groups, tuple(loops), _describe(kind, n))


def build_kernels(ir: SymmetricContractionIR, *, levels: int, block_channels: int) -> list[SymmetricKernel]:
    """Every kernel ``fwd_n``, ``bwd_x_n``, ``bwd_w_n`` for ``n = 0..levels`` that is not
    identically zero (``n <= eqdsl.symmetric.tables.max_order``).

    Raises:
        ValueError: ``levels`` < 1 (the second derivatives are always needed), a bad
            ``block_channels``, or an IR without terms.
    """
    if levels < 1:
        raise ValueError(f"levels must be >= 1 (second derivatives), got {levels}")
    if not ir.terms:
        raise ValueError(f"symmetric contraction {ir.name!r} has no terms: its output would always be 0")
    lanes, _, _ = channel_blocking(ir.mul, block_channels)
    align = column_align(ir.mul, lanes)
    return [build_kernel(kind, n, groups(ir, kind, n), align)
            for n in range(levels + 1) for kind in ("fwd", "bwd_x", "bwd_w") if n <= max_order(ir, kind)]


def render_files(ir: SymmetricContractionIR, header: str = "", *, levels: int | None = None,
                 block_channels: int = DEFAULT_BLOCK_CHANNELS,
                 block_nodes: int = DEFAULT_BLOCK_NODES) -> dict[str, str]:
    """``{"pallas_kernels.py": ..., "jax_ops.py": ...}`` of ``ir``.

    Args:
        ir: the contraction.
        header: text put first in each file (the generator's header comment).
        levels: largest number of directions ``n`` generated: reverse-mode derivatives of
            order up to ``levels + 1`` in ``x``. Default ``N``, the polynomials' degree
            (``max(correlation)``): every order works, the higher derivatives being zero (as
            in the torch ops); a derivative beyond a smaller ``levels`` raises
            ``NotImplementedError``.
        block_channels: channels per program (a power of two; ``channel_blocking``).
        block_nodes: default rows per program (a power of two).

    Raises:
        ValueError: bad ``levels``, ``block_channels`` or ``block_nodes``.
    """
    if block_nodes < 1 or block_nodes & (block_nodes - 1):
        raise ValueError(f"block_nodes must be a power of two, got {block_nodes}")
    degree = max((len(t.monomial) for t in ir.terms), default=0)
    levels = degree if levels is None else levels
    lanes, count, blocks = channel_blocking(ir.mul, block_channels)
    kernels = build_kernels(ir, levels=levels, block_channels=block_channels)
    ctx = dict(header=header, name=ir.name, ir=ir, kernels=kernels, lanes=lanes, count=count, channel_blocks=blocks,
               block_nodes=block_nodes, levels=levels, degree=degree, dim_in=ir.dim_in,
               dim_out=sum(ir.out_dims), n_terms=len(ir.terms), n_monomials=len({t.monomial for t in ir.terms}))
    return {"pallas_kernels.py": render("pallas_symmetric_kernels.py.j2", **ctx),
            "jax_ops.py": render("jax_symmetric.py.j2", **ctx)}


def _header(ir: SymmetricContractionIR) -> str:
    digest = hashlib.sha256(ir.to_json().encode()).hexdigest()
    return (f"{MARKER} {__version__} from the symmetric contraction IR {ir.name} (sha256 {digest[:16]}). "
            f"Do not edit.\n# Regenerate with: eqdsl.symmetric.pallas.generate_symmetric_jax(<IR {ir.name}>, "
            f"<out_dir>)\n")


def jax_files(ir: SymmetricContractionIR, *, header: str | None = None, **options) -> dict[str, str]:
    """``{"<name>/jax_ops.py": ..., "<name>/pallas_kernels.py": ...}``: the JAX half of the
    package, paths as ``eqdsl.symmetric.codegen.symmetric_files`` gives the torch half. The
    package also needs ``eqdsl.symmetric.codegen.common_files`` (``__init__.py``, ``terms.py``:
    the runtime builds the kernels' tables from them). ``options``: ``render_files``'."""
    header = _header(ir) if header is None else header
    return {f"{ir.name}/{rel}": text for rel, text in render_files(ir, header, **options).items()}


def generate_symmetric_jax(ir: SymmetricContractionIR, out_dir, *, header: str | None = None, **options) -> Path:
    """Write ``out_dir/<name>/`` (``out_dir`` importable): the files both halves share
    (``eqdsl.symmetric.codegen.common_files``: ``__init__.py``, ``terms.py``), ``jax_ops.py``
    and ``pallas_kernels.py``, atomically (``write_package``: a directory eqdsl did not write
    is refused). It replaces the whole package, torch files included: to have both, write
    ``common_files(ir) | symmetric_files(ir) | jax_files(ir)`` in one ``write_package``.

    Returns:
        The package directory.

    Raises:
        eqdsl.codegen.generate.GenerateError: ``out_dir/<name>`` exists and was not written
            by eqdsl.
        ValueError: bad ``options`` (``render_files``).
    """
    header = _header(ir) if header is None else header
    files = common_files(ir, header=header) | jax_files(ir, header=header, **options)
    (written,) = write_package(out_dir, files)
    return written
