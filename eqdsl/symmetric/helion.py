"""Helion kernels of a symmetric contraction: every derivative of its polynomial, as statements.

The contraction (``eqdsl.symmetric.ir``) is, per node ``b`` and channel ``c``, a polynomial of
degree ``N = max(correlation) <= 4`` in the ``dim_in`` components ``x[b, :, c]``, linear in the
weights ``W`` and, once contracted with an output cotangent ``G``, a scalar form::

    F(x, W, G) = sum_{b, c} sum_t G[b, o_t, m_t, c] * coeff_t * W[elem[b], off_t + c] * mono_t(x[b, :, c])

Its ``k``-th directional derivative in ``x``, ``F_k(x, W, G, v_1..v_k) = D^k_x F[v_1, ..., v_k]``,
is linear in ``W``, ``G`` and each ``v_j``, and symmetric in the ``v_j``. Three kernel families
compute its partial derivatives, for every ``k`` where they are not identically zero:

    fwd_d{k}   (x, v_1..v_k, weights, elem)    -> dF_k/dG   (N, dim_out)      k = 0..N
    bwd_w_d{k} (x, v_1..v_k, g, elem)          -> dF_k/dW   (E, weight_numel) k = 0..N
    bwd_x_d{k} (x, v_1..v_k, weights, g, elem) -> dF_k/dx   (N, dim_x)        k = 0..N-1

(``k = 0`` is written without the suffix: ``fwd`` is the contraction, ``bwd_x`` and ``bwd_w``
its gradients; ``fwd_d1`` is the forward's directional derivative (a jvp in ``x``),
``bwd_w_d1`` the derivative of ``bwd_w`` along ``v``, ``bwd_x_d1`` the Hessian-vector product.)
The derivative of each is another of them (``eqdsl.runtime.torch.symmetric``), and
``F_k = 0`` for ``k > N``: gradients of every order are closed over these kernels.

The ``k``-th derivative of a monomial ``x_{i_1} ... x_{i_nu}`` sums, over the ordered choices of
``k`` distinct positions ``p_1..p_k``, ``prod_j v_j[i_{p_j}]`` times the product of ``x`` over
the other positions (``bwd_x_d{k}``: one more chosen position, the component written). Equal
factor lists are merged at generation time (their counts multiply the coefficient), and every
proper prefix of a product is a named temporary computed once per tile (factors sorted, ``x``
first, so ``x_a * x_b`` is shared by every higher monomial that starts with it); the last
factor is multiplied in the term itself.

One program per ``(block_b nodes, block_c channels)`` tile: it loads the tile's element
indices, the ``dim_in`` component tiles of ``x`` (and of each ``v_j``), gathers the weight
tiles ``W[elem[tile_b], off + k*mul + tile_c]`` it needs (``fwd``, ``bwd_x``) or the output
cotangent's tiles (``bwd_w``, ``bwd_x``), and writes its tile of the result: ``bwd_w`` adds its
``(tile_b, tile_c)`` contributions into the element's row with ``hl.atomic_add`` (the output
zeroed first; summation order varies between runs).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

from ..backends.helion.printer import (
    Access, Assign, AtomicAdd, Comment, Loop, Read, Row, Stmt, Store, Tile, Zeros, print_stmts, sum_expr,
)
from ..irreps import Irreps
from ..kernel_ir import term
from .ir import SymmetricContractionIR

__all__ = ["KINDS", "SymmetricKernel", "op_name", "max_order", "build_kernels", "kernel_params"]

KINDS = ("fwd", "bwd_w", "bwd_x")


def op_name(kind: str, k: int) -> str:
    """``fwd``, ``fwd_d1``, ``bwd_x_d2``, ...: the op (and kernel suffix) of derivative family
    ``kind`` with ``k`` directions."""
    return kind if k == 0 else f"{kind}_d{k}"


def max_order(ir: SymmetricContractionIR, kind: str) -> int:
    """The largest ``k`` whose ``kind`` derivative is not identically zero: ``N`` for ``fwd`` and
    ``bwd_w``, ``N - 1`` for ``bwd_x`` (``N`` the largest order with a term)."""
    n = max((t.nu for t in ir.terms), default=0)
    return n - 1 if kind == "bwd_x" else n


def kernel_params(kind: str, k: int) -> tuple[str, ...]:
    """The kernel's tensor arguments, the op's operands then its output."""
    vs = tuple(f"v{j}" for j in range(1, k + 1))
    return {
        "fwd": ("x", *vs, "weights", "elem", "out"),
        "bwd_w": ("x", *vs, "g", "elem", "gw"),
        "bwd_x": ("x", *vs, "weights", "g", "elem", "gx"),
    }[kind]


@dataclass(frozen=True)
class SymmetricKernel:
    """One generated kernel: ``name`` (``sc_<op>``), its op family ``kind`` and order ``k``, its
    tensor ``params``, docstring, pinned Helion config and body (printed by ``lines``)."""

    name: str
    kind: str
    k: int
    params: tuple[str, ...]
    doc: str
    config: str
    body: tuple[Stmt, ...]
    n_products: int
    n_terms: int

    @property
    def lines(self) -> list[str]:
        return print_stmts(self.body)


def _blocks(irreps: str) -> list[tuple[int, int]]:
    """``(start component, dim)`` of each irrep block."""
    out, s = [], 0
    for mi in Irreps(irreps):
        out.append((s, mi.ir.dim))
        s += mi.ir.dim
    return out


def _component_access(tensor: str, blocks: list[tuple[int, int]], i: int, mul: int, layout: str,
                      row: Row) -> Access:
    """Component ``i``'s ``(tile_b, tile_c)`` tile of a ``(rows, dim * mul)`` operand."""
    for s, d in blocks:
        if s <= i < s + d:
            if layout == "mul_ir":  # block (mul, d) row-major: channel stride d
                return Access(tensor, row, mul * s + (i - s), ((Tile("tile_c"), d),))
            return Access(tensor, row, mul * s + (i - s) * mul, ((Tile("tile_c"), 1),))
    raise AssertionError(f"component {i} outside {blocks}")


class _Products:
    """Named products of loaded tiles, each assigned once (in ``stmts``) where first needed."""

    def __init__(self, stmts: list):
        self.stmts = stmts
        self.names: dict[tuple[str, ...], str] = {}

    def get(self, factors: tuple[str, ...]) -> str | None:
        if not factors:
            return None
        if len(factors) == 1:
            return factors[0]
        name = self.names.get(factors)
        if name is None:
            left = self.get(factors[:-1])
            name = "p_" + "_".join(factors)
            self.stmts.append(Assign(name, f"{left} * {factors[-1]}"))
            self.names[factors] = name
        return name

    def factors(self, factors: tuple[str, ...]) -> list[str]:
        """A term's factors: the named product of all but the last factor, then the last one.
        Only prefixes are named (they are shared by the longer monomials that extend them); a
        whole monomial is multiplied out in its term, one multiply more than naming it, so
        that no product stays live between distant terms (MACE-MP's Hessian-vector product,
        ``bwd_x_d1``, spilled 1.3 KB a thread with every product named)."""
        if len(factors) <= 1:
            return list(factors)
        return [self.get(factors[:-1]), factors[-1]]


def _factor_key(name: str) -> tuple:
    # x components first (shared prefixes), then each direction's components
    head, idx = name.split("_") if "_" in name else (name, "")
    if head.startswith("x"):
        return (0, int(head[1:]))
    return (int(head[1:]), int(idx))


def _x(i: int) -> str:
    return f"x{i}"


def _v(j: int, i: int) -> str:
    return f"v{j}_{i}"


def derivative_terms(mono: tuple[int, ...], k: int, free: bool) -> Counter:
    """The ``k``-th directional derivative of ``prod_{i in mono} x_i`` in directions ``v_1..v_k``
    as ``Counter({(target, factors): multiplicity})``; ``free``: also differentiate once more
    with respect to ``x_target`` (``target`` None otherwise). ``factors`` sorted by
    ``_factor_key``; empty for a constant."""
    positions = range(len(mono))
    out: Counter = Counter()
    for choice in itertools.permutations(positions, k + (1 if free else 0)):
        dirs, rest = choice[:k], [p for p in positions if p not in choice]
        target = mono[choice[k]] if free else None
        factors = [_x(mono[p]) for p in rest] + [_v(j + 1, mono[p]) for j, p in enumerate(dirs)]
        out[(target, tuple(sorted(factors, key=_factor_key)))] += 1
    return out


def _config(block_b: int, block_c: int, num_warps: int) -> str:
    return f"block_sizes=[{block_b}, {block_c}], num_warps={num_warps}, num_stages=1"


def build_kernel(ir: SymmetricContractionIR, kind: str, k: int, *, block_b: int, block_c: int,
                 num_warps: int) -> SymmetricKernel:
    """The kernel of op ``op_name(kind, k)`` (``kind`` in ``KINDS``, ``0 <= k <= max_order``)."""
    if kind not in KINDS or not 0 <= k <= max_order(ir, kind):
        raise ValueError(f"no kernel {kind!r} of order {k} for {ir.name} (max {max_order(ir, kind)})")
    mul, layout = ir.mul, ir.layout
    in_blocks, out_blocks = _blocks(ir.irreps_in), _blocks(ir.irreps_out)
    out_start = [s for s, _ in out_blocks]
    tb = Row("tile_b")
    free = kind == "bwd_x"
    # the terms this derivative keeps: degree nu >= k (+1 for the free derivative)
    groups: dict[tuple, Counter] = defaultdict(Counter)  # (o, m, nu, kk) -> {(target, factors): coeff}
    for t in ir.terms:
        if t.nu < k + free:
            continue
        for (target, factors), n in derivative_terms(t.monomial, k, free).items():
            groups[(t.out, t.m, t.nu, t.k)][(target, factors)] += n * t.coeff
    used = sorted({f for g in groups.values() for (_, fs) in g for f in fs}, key=_factor_key)

    loads: list[Stmt] = [Comment("this tile's element indices (weight rows)"), Assign("e_idx", "elem[tile_b]")]
    loads.append(Comment(f"components of x{''.join(f', v{j}' for j in range(1, k + 1))} used here"))
    for f in used:
        tensor, i = ("x", int(f[1:])) if f.startswith("x") else (f.split("_")[0], int(f.split("_")[1]))
        loads.append(Assign(f, Read(_component_access(tensor, in_blocks, i, mul, layout, tb))))

    def w_name(o, nu, kk):
        return f"w{o}_{nu}_{kk}"

    def g_name(o, m):
        return f"g{o}_{m}"

    def w_load(o, nu, kk):
        off = ir.weight_offsets[o][nu - 1] + kk * mul
        return Assign(w_name(o, nu, kk), Read(Access("weights", Row("e_idx", gathered=True), off, ((Tile("tile_c"), 1),))))

    def g_load(o, m):
        return Assign(g_name(o, m), Read(_component_access("g", out_blocks, out_start[o] + m, mul, layout, tb)))

    body: list[Stmt] = []
    prods = _Products(body)
    sums: dict[tuple, str] = {}  # equal polynomials (several k of one (o, m, nu) often are) summed once
    n_terms = 0

    def expr(entries) -> str:
        nonlocal n_terms
        key = tuple(entries)
        if key in sums:
            return sums[key]
        n_terms += len(entries)
        parts = [(c, prods.factors(fs)) for fs, c in entries]
        if len(parts) == 1:
            return str(term(parts[0][0], *parts[0][1]))
        name = sums[key] = f"q{len(sums)}"
        body.append(Assign(name, sum_expr(parts)))
        return name

    loaded: set[str] = set()

    def lazy(stmt: Assign) -> str:
        """Load a weight (or cotangent) tile right before its first use: loading all of them
        first kept them live through the whole kernel (MACE-MP's bwd_x spilled)."""
        if stmt.target not in loaded:
            loaded.add(stmt.target)
            body.append(stmt)
        return stmt.target

    # weight-major order: each gathered weight tile is used by consecutive statements, then dead
    by_weight_order = sorted(groups.items(), key=lambda item: (item[0][0], item[0][2], item[0][3], item[0][1]))
    if kind == "fwd":
        written = set()
        for (o, m, nu, kk), entries in by_weight_order:
            lazy(w_load(o, nu, kk))
            y = f"y{o}_{m}"
            e = expr(sorted((fs, c) for (_, fs), c in entries.items()))
            body.append(Assign(y, f"{y} + {w_name(o, nu, kk)} * {e}" if y in written else f"{w_name(o, nu, kk)} * {e}"))
            written.add(y)
        stores: list[Stmt] = []
        for o, (s, d) in enumerate(out_blocks):
            for m in range(d):
                y = f"y{o}_{m}"
                if y not in written:
                    y = "zero"
                stores.append(Store(_component_access("out", out_blocks, s + m, mul, layout, tb), y))
    elif kind == "bwd_w":
        loads.append(Comment("output cotangent components"))
        loads += [g_load(o, m) for (o, m) in sorted({(o, m) for (o, m, _, _) in groups})]
        by_weight: dict[tuple, list] = defaultdict(list)
        for (o, m, nu, kk), entries in sorted(groups.items()):
            by_weight[(o, nu, kk)].append((m, entries))
        stores = []
        for (o, nu, kk), per_m in sorted(by_weight.items()):
            name = f"dw{o}_{nu}_{kk}"
            for j, (m, entries) in enumerate(per_m):
                e = expr(sorted((fs, c) for (_, fs), c in entries.items()))
                body.append(Assign(name, f"{name} + {g_name(o, m)} * {e}" if j else f"{g_name(o, m)} * {e}"))
            off = ir.weight_offsets[o][nu - 1] + kk * mul
            # added as soon as complete: an accumulator is then dead (all of them live to the end spilled)
            body.append(AtomicAdd(Access("gw", Row("e_idx", gathered=True), off, ((Tile("tile_c"), 1),)), name))
    else:
        loads.append(Comment("output cotangent components (weight tiles are gathered where first used)"))
        loads += [g_load(o, m) for (o, m) in sorted({(o, m) for (o, m, _, _) in groups})]
        written = set()
        for (o, m, nu, kk), entries in by_weight_order:
            lazy(w_load(o, nu, kk))
            body.append(Assign("s", f"{g_name(o, m)} * {w_name(o, nu, kk)}"))
            per_target: dict[int, list] = defaultdict(list)
            for (target, fs), c in entries.items():
                per_target[target].append((fs, c))
            for i in sorted(per_target):
                acc = f"gx{i}"
                e = expr(sorted(per_target[i]))
                body.append(Assign(acc, f"{acc} + s * {e}" if acc in written else f"s * {e}"))
                written.add(acc)
        stores = []
        for i in range(ir.dim_in):
            acc = f"gx{i}" if f"gx{i}" in written else "zero"
            stores.append(Store(_component_access("gx", in_blocks, i, mul, layout, tb), acc))
    if any(isinstance(s, Store) and s.value == "zero" for s in stores):
        stores.insert(0, Assign("zero", Zeros("[tile_b, tile_c]", "x")))
    grid = f"tile_b, tile_c in hl.tile([x.size(0), {mul}])"
    loop = Loop(grid, tuple(loads + [Comment("the polynomial's terms (products of all but the last factor named once)")]
                            + body + [Comment("this tile's result")] + stores))
    what = {
        "fwd": "the contraction" if k == 0 else f"its {_nth(k)} directional derivative in x along v1..v{k}",
        "bwd_w": "dF/dW, summed per element (atomic)" + ("" if k == 0 else f", differentiated in x along v1..v{k}"),
        "bwd_x": "dF/dx (G-contracted gradient)" + ("" if k == 0 else f", differentiated in x along v1..v{k}"),
    }[kind]
    return SymmetricKernel(
        name=f"sc_{op_name(kind, k)}", kind=kind, k=k, params=kernel_params(kind, k),
        doc=f"{op_name(kind, k)}: {what}; {len(prods.names)} products, {n_terms} terms.",
        config=_config(block_b, block_c, num_warps), body=(loop,), n_products=len(prods.names), n_terms=n_terms)


def _nth(k: int) -> str:
    return {1: "first", 2: "second", 3: "third", 4: "fourth"}.get(k, f"{k}th")


def default_blocks(ir: SymmetricContractionIR) -> tuple[int, int, int]:
    """``(block_b, block_c, num_warps)``: 128 lanes a program (one element per thread at 4
    warps, every straight-line temporary one register a thread), up to 32 channels."""
    block_c = 1
    while block_c < min(ir.mul, 32):
        block_c *= 2
    return max(1, 128 // block_c), block_c, 4


def build_kernels(ir: SymmetricContractionIR, *, block_b: int | None = None, block_c: int | None = None,
                  num_warps: int | None = None) -> list[SymmetricKernel]:
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
    return [build_kernel(ir, kind, k, block_b=block_b, block_c=block_c, num_warps=num_warps)
            for kind in KINDS for k in range(max_order(ir, kind) + 1)]
