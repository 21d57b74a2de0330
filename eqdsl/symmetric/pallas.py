"""Pallas kernels of a symmetric contraction (issue 27): ``SymmetricContractionIR`` ->
``pallas_kernels.py`` + ``jax_ops.py``.

The function (``eqdsl.symmetric.ir``) is the derivative in ``G`` of

    F(x, W, G) = sum_b sum_{o, m, c} G[b, o, m, c] * out[b, o, m, c](x, W),

a polynomial of degree ``N = max(correlation)`` in ``x``, linear in ``W`` and in ``G``.
Every derivative the autodiff needs is a partial derivative of one of the forms

    F_n(x, h_1..h_n, W, G) = D^n_x F(x, W, G)[h_1, ..., h_n]      (n = 0, 1, 2, ...)

(the ``n``-th directional derivative in ``x``, multilinear and symmetric in the ``h``),
and each gets a generated kernel (``levels``: the largest ``n`` generated)::

    fwd_n(x, h.., W)      = dF_n/dG    (rows, sum(out_dims) * mul)
    bwd_x_n(x, h.., W, G) = dF_n/dx    (rows, dim_in * mul)
    bwd_w_n(x, h.., G)    = dF_n/dW    per node, (rows, weight_numel); the runtime sums the
                                       rows of each element (segment_sum over elem)

``fwd_0`` is the contraction; ``fwd_1`` its jvp in ``x``, ``bwd_x_1`` the Hessian-vector
product of ``F``, ``bwd_w_1`` the derivative of ``bwd_w_0`` in ``x``. A kernel that is
identically zero (``n`` above the degree) is not generated (the runtime returns zeros).

Kernel body (one program per block of ``block_nodes`` rows and ``BLOCK_CHANNELS``
channels; every value a ``(rows, BLOCK_CHANNELS)`` tile, channels being independent):

1. read the ``dim_in`` component columns ``x_i`` (and ``h_{d,i}``) of the block's channels;
   the weight rows ``W[elem[b]]`` are read through a row gather (``rt.Gather``);
2. the distinct monomials of the terms, each the product of its prefix (one index
   shorter, shared by every monomial that extends it) and one ``x_i``: a DAG in which
   each node carries its *jet*, the values ``v[S] = D^{|S|} p [h_S]`` for every subset
   ``S`` of the directions (``v_p[S] = v_q[S] x_j + sum_{d in S} v_q[S - d] h_{d,j}`` for
   ``p = q x_j``; zero where ``|S|`` exceeds the degree);
3. ``fwd``: ``out[o, m] = sum_{nu, k} W_{o,nu,k} * s[o, m, nu, k]`` with
   ``s = sum_terms coeff * v_mono[all]``; ``bwd_w``: ``sum_m G[o, m] * s[o, m, nu, k]``;
   ``bwd_x``: reverse mode through the DAG from the seeds ``A_mono = sum_terms coeff *
   G[o, m] W_{o,nu,k}`` (``adj_q[S] += adj_p[S] x_j + sum_{d not in S} adj_p[S + d] h_{d,j}``,
   ``dx_j += sum_S adj_p[S] v_q[S]``).

Statements are ``eqdsl.backends.pallas.stmts`` / ``eqdsl.kernel_ir`` data printed by
``eqdsl.backends.pallas.printer``; the templates only loop and substitute.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends.pallas.printer import print_body
from ..backends.pallas.stmts import Comment, Offset, Read, Write, Zeros, assign
from ..backends.render import render
from ..irreps import Irreps
from ..kernel_ir import Sum, Term, Var
from .ir import SymmetricContractionIR

__all__ = ["SymmetricKernel", "columns", "build_kernels", "channel_blocking", "render_files",
           "generate_symmetric_jax", "OPS", "DEFAULT_BLOCK_CHANNELS", "DEFAULT_BLOCK_NODES"]

OPS = ("fwd", "bwd_x", "bwd_w")
# Channels per program (a power of two dividing mul, else one block of next_pow2(mul)
# lanes) and rows per program: defaults, not tuned on a GPU yet.
DEFAULT_BLOCK_CHANNELS = 32
DEFAULT_BLOCK_NODES = 16


@dataclass(frozen=True)
class SymmetricKernel:
    """One generated kernel.

    Attributes:
        name: ``f"{op}_{n}"``.
        op: ``"fwd"`` | ``"bwd_x"`` | ``"bwd_w"``.
        n: number of directions ``h``.
        refs: input ref names, in call order: ``x_ref``, ``h1_ref``..``hn_ref``, then
            ``w_ref`` (fwd, bwd_x) and ``g_ref`` (bwd_x, bwd_w).
        out: the output ref's name.
        desc: the docstring.
        lines: the body's source lines (indented by four spaces).
    """

    name: str
    op: str
    n: int
    refs: tuple[str, ...]
    out: str
    desc: str
    lines: tuple[str, ...]


def _dims(irreps: str) -> tuple[int, ...]:
    return tuple(mi.ir.dim for mi in Irreps(irreps))


def columns(dims: tuple[int, ...], mul: int, layout: str) -> tuple[tuple[int, int], ...]:
    """Per component ``i`` of the blocks ``dims``: ``(base, stride)``, channel ``c`` of
    component ``i`` sitting at column ``base + c * stride`` of a row (``eqdsl.symmetric.ir``'s
    layouts: ``mul_ir`` ``(mul * s_j + (i - s_j), 2l+1)``, ``ir_mul`` ``(i * mul, 1)``).

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


def channel_blocking(mul: int, block_channels: int) -> tuple[int, int, int]:
    """``(lanes, count, blocks)``: tile width (a power of two), channels used per tile and
    channel blocks per row. ``block_channels`` (a power of two) when it divides ``mul``,
    else one block of ``next_pow2(mul)`` lanes (``count = mul``; padded lanes are zero).

    Raises:
        ValueError: ``block_channels`` not a positive power of two.
    """
    if block_channels < 1 or block_channels & (block_channels - 1):
        raise ValueError(f"block_channels must be a power of two, got {block_channels}")
    if mul % block_channels == 0:
        return block_channels, block_channels, mul // block_channels
    pad = 1 << max(mul - 1, 0).bit_length()
    return pad, mul, 1


def _subsets(n: int):
    return range(1 << n)


def _bits(s: int, n: int):
    return [d for d in range(n) if s >> d & 1]


class _Builder:
    """Builds one kernel's statements: names every value, tracks symbolic zeros (None)."""

    def __init__(self, ir: SymmetricContractionIR, n: int, lanes: int, count: int):
        self.ir, self.n, self.lanes, self.count = ir, n, lanes, count
        self.stmts: list = []
        self.in_cols = columns(_dims(ir.irreps_in), ir.mul, ir.layout)
        self.out_cols = columns(ir.out_dims, ir.mul, ir.layout)
        monos = sorted({t.monomial for t in ir.terms})
        nodes = {m[:j] for m in monos for j in range(1, len(m) + 1)}
        self.nodes = sorted(nodes, key=lambda p: (len(p), p))  # topological: prefixes first
        self.full = (1 << n) - 1

    # -------------------------------------------------------------- reads
    def read(self, name: str, ref: str, base: int, stride: int, comment: str = ""):
        self.stmts.append(Read(name, ref, Offset(base, "c0", stride * self.lanes), self.count, self.lanes, stride,
                               comment))

    def read_inputs(self, with_w: bool, with_g: bool, x_needed: set[int]):
        ir = self.ir
        for i in sorted(x_needed):
            base, stride = self.in_cols[i]
            self.read(f"x{i}", "x_ref", base, stride)
        for d in range(self.n):
            for i in sorted(self.h_needed):
                base, stride = self.in_cols[i]
                self.read(f"h{d + 1}_{i}", f"h{d + 1}_ref", base, stride)
        if with_w:
            for o in range(len(ir.out_dims)):
                for nu in range(1, ir.correlation[o] + 1):
                    for k in range(ir.num_params[o][nu - 1]):
                        if (o, nu, k) in self.w_needed:
                            self.read(f"w{o}_{nu}_{k}", "w_ref", ir.weight_offsets[o][nu - 1] + k * ir.mul, 1,
                                      "rows W[elem[b]]")
        if with_g:
            start = 0
            for o, d in enumerate(ir.out_dims):
                for m in range(d):
                    if (o, m) in self.g_needed:
                        base, stride = self.out_cols[start + m]
                        self.read(f"g{o}_{m}", "g_ref", base, stride)
                start += d

    # -------------------------------------------------------------- jets
    def jet_name(self, p: tuple[int, ...], s: int) -> str:
        if len(p) == 1:
            bits = _bits(s, self.n)
            return f"x{p[0]}" if s == 0 else f"h{bits[0] + 1}_{p[0]}"
        return "v" + "_".join(map(str, p)) + (f"_s{s}" if self.n else "")

    def jet(self, p, s):
        """Name of ``v_p[s]``, or None where it is zero (``|s|`` above ``p``'s degree)."""
        if bin(s).count("1") > len(p):
            return None
        return self.jet_name(p, s)

    def forward_jets(self, needed: set) -> None:
        """Assign every needed jet component of the DAG's nodes of degree >= 2."""
        for p in self.nodes:
            if len(p) < 2:
                continue
            q, j = p[:-1], p[-1]
            for s in _subsets(self.n):
                if (p, s) not in needed or self.jet(p, s) is None:
                    continue
                terms = []
                vq = self.jet(q, s)
                if vq is not None:
                    terms.append(Term(1.0, (Var(vq), Var(f"x{j}"))))
                for d in _bits(s, self.n):
                    vq = self.jet(q, s & ~(1 << d))
                    if vq is not None:
                        terms.append(Term(1.0, (Var(vq), Var(f"h{d + 1}_{j}"))))
                self.stmts.append(assign(self.jet_name(p, s), Sum(tuple(terms))))

    def needed_jets(self, tops: set) -> set:
        """The jet components ``(node, s)`` that ``tops`` (components of the monomials) need."""
        need, stack = set(), list(tops)
        while stack:
            p, s = stack.pop()
            if (p, s) in need or self.jet(p, s) is None:
                continue
            need.add((p, s))
            if len(p) >= 2:
                stack.append((p[:-1], s))
                stack += [(p[:-1], s & ~(1 << d)) for d in _bits(s, self.n)]
        return need

    def note_inputs(self, need: set) -> None:
        self.x_needed = {p[-1] for p, _ in need if len(p) >= 2} | {p[0] for p, s in need if len(p) == 1 and s == 0}
        self.h_needed = {p[-1] for p, s in need if len(p) >= 2 and s} | {p[0] for p, s in need if len(p) == 1 and s}


def _groups(ir: SymmetricContractionIR):
    """Terms grouped by ``(o, m, nu, k)``, in the IR's order."""
    out: dict = {}
    for t in ir.terms:
        out.setdefault((t.out, t.m, t.nu, t.k), []).append(t)
    return out


def _prologue(lanes: int, refs: tuple[str, ...], out: str) -> list[str]:
    return [f"    rows = {refs[0]}.shape[0]", f"    dtype = {out}.dtype",
            f"    c0 = pl.program_id(1)  # this program's channel block ({lanes} lanes)"]


def _contract_s(b: _Builder, groups) -> dict:
    """``s[o, m, nu, k] = sum_terms coeff * v_mono[all]``: assigned, names by key (zero groups left out)."""
    names = {}
    for (o, m, nu, k), ts in groups.items():
        terms = tuple(Term(t.coeff, (Var(b.jet(t.monomial, b.full)),)) for t in ts
                      if b.jet(t.monomial, b.full) is not None)
        if terms:
            names[(o, m, nu, k)] = f"s{o}_{m}_{nu}_{k}"
            b.stmts.append(assign(names[(o, m, nu, k)], Sum(terms)))
    return names


def _build_fwd(ir, n, lanes, count) -> SymmetricKernel | None:
    b = _Builder(ir, n, lanes, count)
    groups = _groups(ir)
    tops = {(t.monomial, b.full) for t in ir.terms}
    need = b.needed_jets(tops)
    if not need:
        return None
    b.note_inputs(need)
    live = {key for key, ts in groups.items() if any(b.jet(t.monomial, b.full) for t in ts)}
    b.w_needed = {(o, nu, k) for o, _, nu, k in live}
    b.read_inputs(True, False, b.x_needed)
    b.stmts.append(Comment("the monomials' jets, each from its prefix"))
    b.forward_jets(need)
    b.stmts.append(Comment("s[o, m, nu, k] = sum_terms coeff * monomial; out[o, m] = sum_{nu, k} W * s"))
    s = _contract_s(b, groups)
    start = 0
    for o, d in enumerate(ir.out_dims):
        for m in range(d):
            keys = [key for key in s if key[0] == o and key[1] == m]
            value = Sum(tuple(Term(1.0, (Var(f"w{o}_{nu}_{k}"), Var(s[(o, m, nu, k)]))) for _, _, nu, k in keys)) \
                if keys else Zeros(lanes)
            base, stride = b.out_cols[start + m]
            b.stmts.append(Write("out_ref", Offset(base, "c0", stride * lanes), value, count, lanes, stride))
        start += d
    refs = ("x_ref",) + tuple(f"h{d + 1}_ref" for d in range(n)) + ("w_ref",)
    what = "out = W . P(x)" if n == 0 else f"D^{n}_x out[h1..h{n}]"
    return SymmetricKernel(f"fwd_{n}", "fwd", n, refs, "out_ref", f"dF_{n}/dG: {what}, (rows, dim_out * mul).",
                           tuple(_prologue(lanes, refs, "out_ref") + print_body(b.stmts, "    ")))


def _build_bwd_w(ir, n, lanes, count) -> SymmetricKernel | None:
    b = _Builder(ir, n, lanes, count)
    groups = _groups(ir)
    need = b.needed_jets({(t.monomial, b.full) for t in ir.terms})
    if not need:
        return None
    b.note_inputs(need)
    live = [key for key, ts in groups.items() if any(b.jet(t.monomial, b.full) for t in ts)]
    b.w_needed = set()
    b.g_needed = {(o, m) for o, m, _, _ in live}
    b.read_inputs(False, True, b.x_needed)
    b.stmts.append(Comment("the monomials' jets, each from its prefix"))
    b.forward_jets(need)
    b.stmts.append(Comment("s[o, m, nu, k] = sum_terms coeff * monomial; dW[o, nu, k] = sum_m G[o, m] * s"))
    s = _contract_s(b, groups)
    for o in range(len(ir.out_dims)):
        for nu in range(1, ir.correlation[o] + 1):
            for k in range(ir.num_params[o][nu - 1]):
                keys = [key for key in s if key[0] == o and key[2] == nu and key[3] == k]
                value = Sum(tuple(Term(1.0, (Var(f"g{o}_{m}"), Var(s[(o, m, nu, k)]))) for _, m, _, _ in keys)) \
                    if keys else Zeros(lanes)
                base = ir.weight_offsets[o][nu - 1] + k * ir.mul
                b.stmts.append(Write("gw_ref", Offset(base, "c0", lanes), value, count, lanes, 1))
    refs = ("x_ref",) + tuple(f"h{d + 1}_ref" for d in range(n)) + ("g_ref",)
    return SymmetricKernel(f"bwd_w_{n}", "bwd_w", n, refs, "gw_ref",
                           f"dF_{n}/dW per node (rows, weight_numel): sum_m G[o, m] * D^{n} P[o, m, nu, k].",
                           tuple(_prologue(lanes, refs, "gw_ref") + print_body(b.stmts, "    ")))


def _build_bwd_x(ir, n, lanes, count) -> SymmetricKernel | None:
    b = _Builder(ir, n, lanes, count)
    groups = _groups(ir)
    full = b.full
    # seeds A_mono (only monomials whose v[all] is nonzero: degree >= n)
    seeds: dict = {}
    for (o, m, nu, k), ts in groups.items():
        for t in ts:
            if b.jet(t.monomial, full) is not None:
                seeds.setdefault(t.monomial, []).append(t)
    # the gradient of v_mono[all] is nonzero only where the monomial has degree >= n + 1
    # (a monomial of degree n has a constant D^n); dx_j gets terms adj_p[s] * v_q[s]
    adj: dict = {}  # (node, s) -> list of Terms
    dx: dict = {}  # j -> list of Terms
    gw_keys = sorted({(t.out, t.m, t.nu, t.k) for ts in seeds.values() for t in ts})
    b.stmts.append(Comment("G[o, m] * W[o, nu, k], shared by the monomials' seeds"))
    for o, m, nu, k in gw_keys:
        b.stmts.append(assign(f"gw{o}_{m}_{nu}_{k}", Term(1.0, (Var(f"g{o}_{m}"), Var(f"w{o}_{nu}_{k}")))))
    seed_stmts = []
    for mono, ts in seeds.items():
        name = "a" + "_".join(map(str, mono)) + "_seed"
        seed_stmts.append(assign(name, Sum(tuple(Term(t.coeff, (Var(f"gw{t.out}_{t.m}_{t.nu}_{t.k}"),)) for t in ts))))
        adj.setdefault((mono, full), []).append(Term(1.0, (Var(name),)))
    b.stmts += seed_stmts
    # reverse sweep: nodes by decreasing degree; every child of a node is done before it
    sweep, jets_needed = [], set()
    for p in sorted(b.nodes, key=lambda p: (-len(p), p)):
        for s in _subsets(b.n):
            if (p, s) not in adj:
                continue
            a = f"a{'_'.join(map(str, p))}" + (f"_s{s}" if b.n else "")
            sweep.append(assign(a, Sum(tuple(adj[(p, s)]))))
            if len(p) == 1:
                if s == 0:
                    dx.setdefault(p[0], []).append(Term(1.0, (Var(a),)))
                continue  # adjoints of h are not wanted
            q, j = p[:-1], p[-1]
            # v_p[t] = v_q[t] x_j + sum_{d in t} v_q[t - d] h_{d,j}: p's s-component feeds
            # v_q[s] (times x_j) and v_q[s - d] (times h_{d,j}); dx_j gets adj_p[s] v_q[s]
            if b.jet(q, s) is not None:
                adj.setdefault((q, s), []).append(Term(1.0, (Var(a), Var(f"x{j}"))))
                vq = b.jet(q, s)
                dx.setdefault(j, []).append(Term(1.0, (Var(a), Var(vq))))
                jets_needed.add((q, s))
            for d in _bits(s, b.n):
                t = s & ~(1 << d)
                if b.jet(q, t) is not None and (len(q) > 1 or t == 0):  # no adjoint of h
                    adj.setdefault((q, t), []).append(Term(1.0, (Var(a), Var(f"h{d + 1}_{j}"))))
    if not dx:
        return None
    need = b.needed_jets(jets_needed)
    b.note_inputs(need | {((j,), 0) for j in dx})
    # x_j multiplies adjoints, h_{d,j} too: read every component a statement names
    used = {str(f) for st in sweep for t in st.value.terms for f in t.factors}
    b.x_needed |= {int(u[1:]) for u in used if u.startswith("x")}
    b.h_needed |= {int(u.split("_")[1]) for u in used if u.startswith("h")}
    b.w_needed = {(o, nu, k) for o, m, nu, k in gw_keys}
    b.g_needed = {(o, m) for o, m, nu, k in gw_keys}
    body = b.stmts
    b.stmts = []
    b.read_inputs(True, True, b.x_needed)
    b.stmts.append(Comment("the monomials' jets, each from its prefix"))
    b.forward_jets(need)
    b.stmts += body
    b.stmts.append(Comment("reverse sweep over the monomial DAG, longest monomials first"))
    b.stmts += sweep
    for i, (base, stride) in enumerate(b.in_cols):
        value = Sum(tuple(dx[i])) if i in dx else Zeros(lanes)
        b.stmts.append(Write("gx_ref", Offset(base, "c0", stride * lanes), value, count, lanes, stride))
    refs = ("x_ref",) + tuple(f"h{d + 1}_ref" for d in range(n)) + ("w_ref", "g_ref")
    what = "G-contracted gradient of the polynomials" if n == 0 else \
        f"gradient of D^{n}_x F[h1..h{n}]" + (" (the Hessian-vector product)" if n == 1 else "")
    return SymmetricKernel(f"bwd_x_{n}", "bwd_x", n, refs, "gx_ref", f"dF_{n}/dx: {what}, (rows, dim_in * mul).",
                           tuple(_prologue(lanes, refs, "gx_ref") + print_body(b.stmts, "    ")))


def build_kernels(ir: SymmetricContractionIR, *, levels: int, block_channels: int) -> list[SymmetricKernel]:
    """Every nonzero kernel ``fwd_n``, ``bwd_x_n``, ``bwd_w_n`` for ``n = 0..levels``.

    Raises:
        ValueError: ``levels`` < 1 (the second derivatives are always needed), a bad
            ``block_channels``, or an IR without terms.
    """
    if levels < 1:
        raise ValueError(f"levels must be >= 1 (second derivatives), got {levels}")
    if not ir.terms:
        raise ValueError(f"symmetric contraction {ir.name!r} has no terms: its output would always be 0")
    lanes, count, _ = channel_blocking(ir.mul, block_channels)
    out = []
    for n in range(levels + 1):
        for build in (_build_fwd, _build_bwd_x, _build_bwd_w):
            k = build(ir, n, lanes, count)
            if k is not None:
                out.append(k)
    return out


def render_files(ir: SymmetricContractionIR, header: str = "", *, levels: int | None = None,
                 block_channels: int = DEFAULT_BLOCK_CHANNELS,
                 block_nodes: int = DEFAULT_BLOCK_NODES) -> dict[str, str]:
    """``{"pallas_kernels.py": ..., "jax_ops.py": ...}`` of ``ir``.

    Args:
        ir: the contraction.
        header: text put first in each file (the generator's header comment).
        levels: largest number of directions ``n`` generated (default ``min(N, 2)``, ``N``
            the largest correlation: reverse-mode derivatives of order up to ``levels + 1``;
            ``N`` gives every order, the higher ones being zero).
        block_channels: channels per program (a power of two; ``channel_blocking``).
        block_nodes: default rows per program (a power of two).

    Raises:
        ValueError: bad ``levels``, ``block_channels`` or ``block_nodes``.
    """
    if block_nodes < 1 or block_nodes & (block_nodes - 1):
        raise ValueError(f"block_nodes must be a power of two, got {block_nodes}")
    max_corr = max(ir.correlation)
    levels = min(max_corr, 2) if levels is None else levels
    lanes, count, blocks = channel_blocking(ir.mul, block_channels)
    kernels = build_kernels(ir, levels=levels, block_channels=block_channels)
    ctx = dict(header=header, name=ir.name, ir=ir, kernels=kernels, lanes=lanes, count=count, channel_blocks=blocks,
               block_nodes=block_nodes, levels=levels, degree=max(len(t.monomial) for t in ir.terms), dim_in=ir.dim_in,
               dim_out=sum(ir.out_dims), in_dims=_dims(ir.irreps_in), n_terms=len(ir.terms),
               n_monomials=len({t.monomial for t in ir.terms}))
    return {"pallas_kernels.py": render("pallas_symmetric_kernels.py.j2", **ctx),
            "jax_ops.py": render("jax_symmetric.py.j2", **ctx)}


def generate_symmetric_jax(ir: SymmetricContractionIR, out_dir, *, header: str = "", **options) -> list[Path]:
    """Write ``jax_ops.py`` and ``pallas_kernels.py`` of ``ir`` into the package folder
    ``out_dir`` (created; an ``__init__.py`` is written only where none exists, so that a
    package the torch generator writes keeps its own). ``options``: ``render_files``'.

    Returns:
        The paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = render_files(ir, header, **options)
    if not (out / "__init__.py").exists():
        files["__init__.py"] = (f'{header}"""Symmetric contraction ``{ir.name}`` (generated by eqdsl)."""\n')
    written = []
    for rel, text in files.items():
        (out / rel).write_text(text)
        written.append(out / rel)
    return written

