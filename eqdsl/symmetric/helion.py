"""Helion kernels of a symmetric contraction: every derivative of its polynomial, as loops over term tables.

The contraction (``eqdsl.symmetric.ir``) is, per node ``b`` and channel ``c``, a polynomial of
degree ``N = max(correlation) <= 4`` in the ``dim_in`` components ``x[b, :, c]``, linear in the
weights ``W`` and, once contracted with an output cotangent ``G``, a scalar form
``F(x, W, G)``. Its ``k``-th directional derivative in ``x``, ``F_k(x, W, G, v_1..v_k)``, is
linear in ``W``, ``G`` and each ``v_j``. Three kernel families compute its partial derivatives,
for every ``k`` where they are not identically zero::

    fwd_d{k}   (x, v_1..v_k, weights, elem)    -> dF_k/dG   (N, dim_out)                k = 0..N
    bwd_w_d{k} (x, v_1..v_k, g)                -> dF_k/dW   per node: (N, weight_numel)   k = 0..N
    bwd_x_d{k} (x, v_1..v_k, weights, g, elem) -> dF_k/dx   (N, dim_x)                  k = 0..N-1

(``k = 0`` is written without the suffix.) The derivative of each is another of them
(``eqdsl.runtime.torch.symmetric``): gradients of every order are closed over these kernels.

Every kernel is a loop over data, the term tables of ``eqdsl.symmetric.tables`` (``slots``,
``ptr``, ``cols``, ``coeff``; the runtime builds them from the package's ``terms.py``), so its
source is a few lines whatever the irreps: one program per ``(result slot, block_b nodes,
block_c channels)``; per group ``q`` of the slot's terms (``q`` factors of ``x``), a loop over
the group's distinct monomials (their ``h_1 .. h_n`` and ``x`` factors), and per monomial a
loop over its terms summing their heads ``coeff * W * G`` (the factors the op has) before
the monomial multiplies the sum once; every factor a ``(tile_b, tile_c)`` read of its operand
at the column the table gives. ``bwd_w``
writes each node's own row of ``dW`` (the weights it would have, were each node its own
element); the runtime sums those rows per element in node chunks.

The kernels serve any tables of this form; the torch runtime gives them those of the folded IR
(``eqdsl.symmetric.fold``), whose "weights" are each element's weights already contracted with
the coefficients: one head per monomial. Measured on an H100 (2026-11-27, MACE-MP's
contraction, 3,072 nodes, float32), folding took the forward from 0.94 to 0.70 ms, ``bwd_x``
from 2.81 to 1.21, ``bwd_w`` from 2.21 to 1.93, ``bwd_x_d1`` from 4.93 to 2.12 and ``bwd_w_d1``
from 5.44 to 2.54 ms. (A kernel that summed one
element's nodes on chip, one program per (weight row, element), took 20 ms for MACE-MP's
float64 ``bwd_w`` on an H100: too few programs, each looping over ~300 nodes.)

The straight-line kernels this replaces (every product a named temporary) were 1,200-5,400
lines for MACE-MP's contraction; Helion took 77 s to bind one of them and the Pallas backward
did not compile in 9 minutes (H100, 2026-11-26).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.helion.printer import Assign, Comment, Loop, Stmt, print_stmts
from .ir import SymmetricContractionIR
from .tables import KINDS, max_order, num_x_factors, op_name, table_columns

__all__ = ["KINDS", "SymmetricKernel", "TableRead", "op_name", "max_order", "build_kernels", "kernel_params",
           "op_params", "default_blocks"]


_TABLES = ("slots", "mono_ptr", "mono_cols", "mono_terms", "cols", "coeff")


def op_params(kind: str, k: int) -> tuple[str, ...]:
    """The op's tensor arguments (``eqdsl.runtime.torch.symmetric``), without its result."""
    vs = tuple(f"v{j}" for j in range(1, k + 1))
    return {"fwd": ("x", *vs, "weights", "elem"), "bwd_w": ("x", *vs, "g", "elem"),
            "bwd_x": ("x", *vs, "weights", "g", "elem")}[kind]


def kernel_params(kind: str, k: int) -> tuple[str, ...]:
    """The kernel's tensor arguments: the op's operands, the tables, then its output."""
    vs = tuple(f"v{j}" for j in range(1, k + 1))
    return {
        "fwd": ("x", *vs, "weights", "elem", *_TABLES, "out"),
        "bwd_w": ("x", *vs, "g", *_TABLES, "gw_rows"),
        "bwd_x": ("x", *vs, "weights", "g", "elem", *_TABLES, "gx"),
    }[kind]


@dataclass(frozen=True)
class TableRead:
    """A factor: the ``(rows, tile_c)`` tile of ``tensor`` at the columns a table row gives:
    ``table[i, column] + tile_c.index * table[i, column + 1]`` (``strided``), or
    ``table[i, column] + tile_c.index`` (a weight row, stride 1), ``table[i]`` being a term's
    head (``cols[t]``) or a monomial's factors (``mono_cols[m]``). ``rows``: ``tile_b`` or the
    gathered ``e_idx`` (weights)."""

    tensor: str
    rows: str
    column: int
    strided: bool = True
    table: str = "cols"
    index: str = "t"

    def __str__(self) -> str:
        at = f"{self.table}[{self.index}, "
        step = f"tile_c.index * {at}{self.column + 1}]" if self.strided else "tile_c.index"
        return f"{self.tensor}[{self.rows}, {at}{self.column}] + {step}]"


@dataclass(frozen=True)
class SymmetricKernel:
    """One generated kernel: ``name`` (``sc_<op>``), its op family ``kind`` and order ``k``, its
    tensor ``params``, docstring, pinned Helion config, number of term groups and body
    (printed by ``lines``)."""

    name: str
    kind: str
    k: int
    params: tuple[str, ...]
    doc: str
    config: str
    groups: int
    body: tuple[Stmt, ...]

    @property
    def lines(self) -> list[str]:
        return print_stmts(self.body)

    def __str__(self) -> str:
        return f"SymmetricKernel({self.name}: {self.kind} k={self.k}, {self.groups} groups)"


def _factors(kind: str, k: int, q: int, q_max: int, rows: str) -> tuple[list[TableRead], list[TableRead]]:
    """``(head, monomial)``: a group-``q`` term's head factors (``W``, ``G``: read per term from
    ``cols``) and its monomial's (``h_j``, ``x``: read once per monomial from ``mono_cols``),
    in the tables' column order (``table_columns``)."""
    names = table_columns(kind, k, q_max)
    head_width = sum(1 for n in names if n in ("w", "g", "g_stride"))
    head, mono = [], []
    for i, name in enumerate(names):
        if name == "w":
            head.append(TableRead("weights", "e_idx", i, strided=False))
        elif name == "g":
            head.append(TableRead("g", rows, i))
        elif name.startswith("h") and not name.endswith("_stride"):
            mono.append(TableRead(f"v{name[1:]}", rows, i - head_width, table="mono_cols", index="m"))
        elif name.startswith("x") and not name.endswith("_stride") and int(name[1:]) <= q:
            mono.append(TableRead("x", rows, i - head_width, table="mono_cols", index="m"))
    return head, mono


def _group_loops(kind: str, k: int, q_max: int, rows: str, acc: str, dtype_of: str) -> list[Stmt]:
    groups = q_max + 1
    body: list[Stmt] = []
    for q in range(groups):
        head, mono = _factors(kind, k, q, q_max, rows)
        term = " * ".join(["coeff[t]"] + [str(f) for f in head])
        body.append(Comment(f"monomials with {q} factor{'s' if q != 1 else ''} of x: their terms' heads "
                            "summed, then one product"))
        body.append(Loop(f"m in hl.grid(mono_ptr[r * {groups} + {q}], mono_ptr[r * {groups} + {q + 1}])", (
            Assign("s", f"hl.zeros([{rows}, tile_c], dtype={dtype_of}.dtype)"),
            Loop("t in hl.grid(mono_terms[m], mono_terms[m + 1])", (Assign("s", f"s + {term}"),)),
            Assign(acc, f"{acc} + " + " * ".join(["s"] + [str(f) for f in mono])),
        )))
    return body


_WHAT = {"fwd": "dF_{k}/dG: the contraction's output", "bwd_w": "dF_{k}/dW, one row per node",
         "bwd_x": "dF_{k}/dx"}


def build_kernel(ir: SymmetricContractionIR, kind: str, k: int, *, block_b: int, block_c: int,
                 num_warps: int, num_stages: int = 1) -> SymmetricKernel:
    """The kernel of op ``op_name(kind, k)`` (``kind`` in ``KINDS``, ``0 <= k <= max_order``).

    Raises:
        ValueError: no such op.
    """
    if kind not in KINDS or not 0 <= k <= max_order(ir, kind):
        raise ValueError(f"no kernel {kind!r} of order {k} for {ir.name} (max {max_order(ir, kind)})")
    q_max = num_x_factors(ir, kind, k)
    result = kernel_params(kind, k)[-1]
    # bwd_w writes each node's own row of dW (gw_rows): the runtime sums them per element
    head = () if kind == "bwd_w" else (Assign("e_idx", "elem[tile_b]"),)
    loop = Loop(f"tile_r, tile_b, tile_c in hl.tile([slots.size(0), x.size(0), {ir.mul}], "
                "block_size=[1, None, None])", (
                    Assign("r", "tile_r.begin"),
                    *head,
                    Assign("acc", f"hl.zeros([tile_b, tile_c], dtype={result}.dtype)"),
                    *_group_loops(kind, k, q_max, "tile_b", "acc", result),
                    Assign(f"{result}[tile_b, slots[r, 0] + tile_c.index * slots[r, 1]]", "acc"),
                ))
    config = f"block_sizes=[{block_b}, {block_c}], num_warps={num_warps}, num_stages={num_stages}"
    what = _WHAT[kind].format(k=k)
    doc = (f"{op_name(kind, k)}: {what}; one program per (slot, tile); {q_max + 1} term groups "
           f"(0..{q_max} factors of x) looped over the tables.")
    return SymmetricKernel(name=f"sc_{op_name(kind, k)}", kind=kind, k=k, params=kernel_params(kind, k), doc=doc,
                           config=config, groups=q_max + 1, body=(loop,))


def default_blocks(ir: SymmetricContractionIR) -> tuple[int, int, int]:
    """``(block_b, block_c, num_warps)``: 256 lanes a program, up to 128 channels. Measured on an H100 (2026-11-27, MACE-MP's
    contraction, 3,072 nodes, float32, ``ir_mul`` rows): 2 x 128 at 4 warps took 1.76 / 8.97 /
    24.3 ms (fwd / fwd+bwd / force-training pass) against 2.68 / 12.4 / 32.1 ms for 4 x 32;
    larger node tiles were slower (32 x 32: 11.2 ms forward)."""
    block_c = 1
    while block_c < min(ir.mul, 128):
        block_c *= 2
    return max(1, 256 // block_c), block_c, 4


def build_kernels(ir: SymmetricContractionIR, *, block_b: int | None = None, block_c: int | None = None,
                  num_warps: int | None = None, num_stages: int = 1) -> list[SymmetricKernel]:
    """Every kernel of ``ir``: ``fwd``, ``bwd_w`` for ``k = 0..N``, ``bwd_x`` for ``k = 0..N-1``.

    Block sizes default to ``default_blocks(ir)``; each must be a power of two.

    Raises:
        ValueError: a block size that is not a power of two.
    """
    db, dc, dw = default_blocks(ir)
    block_b, block_c, num_warps = block_b or db, block_c or dc, num_warps or dw
    for name, v in (("block_b", block_b), ("block_c", block_c), ("num_warps", num_warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    return [build_kernel(ir, kind, k, block_b=block_b, block_c=block_c, num_warps=num_warps, num_stages=num_stages)
            for kind in KINDS for k in range(max_order(ir, kind) + 1)]
