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
    bwd_w_n(x, h.., G)    = dF_n/dW    per row tile, (rows, weight_numel) stores; the runtime
                                       runs it over element-sorted rows and sums on chip
                                       (``eqdsl.runtime.jax.symmetric``)

``fwd_0`` is the contraction; ``fwd_1`` its jvp in ``x``, ``bwd_x_1`` the Hessian-vector
product of ``F``, ``bwd_w_1`` the derivative of ``bwd_w_0`` in ``x``. A kernel that is
identically zero (``n`` above the degree) is not generated (the runtime returns zeros).

Kernel body (one program per block of ``block_nodes`` rows and ``BLOCK_CHANNELS``
channels; every value a ``(rows, BLOCK_CHANNELS)`` tile, channels being independent):

1. read the component columns ``x_i`` (and ``h_{d,i}``) of the block's channels, the
   weight columns of the rows' elements ``W[elem[b]]`` through a row gather
   (``rt.Gather``: the table is never expanded per row in memory), and ``G``'s columns;
2. stream over the distinct monomials of the terms in lexicographic order. Each
   monomial's *jet* ``v[S] = D^{|S|} mono [h_S]`` (every subset ``S`` of the directions;
   zero where ``|S|`` exceeds the degree) comes from its prefix's (one index shorter,
   shared by the monomials that extend it, adjacent in this order):
   ``v_p[S] = v_q[S] x_j + sum_{d in S} v_q[S - d] h_{d,j}`` for ``p = q x_j``;
3. add each monomial's contributions to output accumulators at once:
   ``fwd``: ``out[o, m] += v[all] * sum_{terms (o, m)} coeff * W_{o,nu,k}``;
   ``bwd_w``: ``dW[o, nu, k] += v[all] * sum_{terms (o, nu, k)} coeff * G[o, m]``;
   ``bwd_x``: ``dx_j += A * mult_j * v_{mono - j}[all]`` with ``A = sum_terms coeff *
   G[o, m] W_{o,nu,k}`` (the derivative of ``D^n mono`` in ``x_j`` is ``D^n`` of the
   monomial with one ``x_j`` removed, times ``j``'s multiplicity in it).

Registers: what lives at a time is the inputs read (``dim_in`` x columns, the weight
columns, ``G``'s), the accumulators (``dim_out``, ``weight_numel / mul`` or ``dim_in``
tiles) and a few partial products, not the monomials (MACE-MP's case: 16 + 86 + 4
inputs, 410 monomials).

Statements are ``eqdsl.backends.pallas.stmts`` / ``eqdsl.kernel_ir`` data printed by
``eqdsl.backends.pallas.printer``; the templates only loop and substitute.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..backends.pallas.printer import print_body
from ..backends.pallas.stmts import Comment, Offset, Read, Write, Zeros, assign
from ..backends.render import render
from ..codegen.package import MARKER, write_package
from ..irreps import Irreps
from ..kernel_ir import Assign, Sum, Term, Var
from .ir import SymmetricContractionIR

__all__ = ["SymmetricKernel", "columns", "build_kernels", "channel_blocking", "render_files", "jax_files",
           "generate_symmetric_jax", "OPS", "DEFAULT_BLOCK_CHANNELS", "DEFAULT_BLOCK_NODES"]

OPS = ("fwd", "bwd_x", "bwd_w")
# Channels per program (a power of two dividing mul, else one block of next_pow2(mul)
# lanes) and rows per program: defaults, not tuned on a GPU yet. 16 x 8 = 128 elements per
# tile, one per thread of a 4-warp program, so that the ~100 tiles live at a time in
# MACE-MP's kernels (inputs and accumulators) can stay in registers.
DEFAULT_BLOCK_CHANNELS = 16
DEFAULT_BLOCK_NODES = 8


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
    """Builds one kernel's statements in streaming order: the monomials one after the other
    (lexicographic, so that a prefix's uses are adjacent and its value dies soon), each jet
    component computed once where first needed, every contribution added to an output
    accumulator at once. The values live at a time are the inputs read, the output
    accumulators and a few partial products: what a GPU program can keep in registers."""

    def __init__(self, ir: SymmetricContractionIR, n: int, lanes: int, count: int):
        self.ir, self.n, self.lanes, self.count = ir, n, lanes, count
        self.body: list = []
        self.used: set[str] = set()  # input tiles the body names (x, h, w, g)
        self.jets: dict = {}  # (monomial, s) -> name
        self.acc: set[str] = set()  # accumulators assigned so far
        self.in_cols = columns(_dims(ir.irreps_in), ir.mul, ir.layout)
        self.out_cols = columns(ir.out_dims, ir.mul, ir.layout)
        self.full = (1 << n) - 1
        by_mono: dict = {}
        for t in ir.terms:
            by_mono.setdefault(t.monomial, []).append(t)
        self.monomials = sorted(by_mono.items())

    def var(self, name: str) -> Var:
        if name[0] in "xhwg":
            self.used.add(name)
        return Var(name)

    def jet(self, p: tuple[int, ...], s: int) -> Var | None:
        """``v_p[s] = D^{|s|} p [h_s]``, assigned where first needed; None where zero
        (``|s|`` above ``p``'s degree)."""
        if bin(s).count("1") > len(p):
            return None
        if len(p) == 1:
            return self.var(f"x{p[0]}" if s == 0 else f"h{_bits(s, self.n)[0] + 1}_{p[0]}")
        if (p, s) not in self.jets:
            q, j = p[:-1], p[-1]
            # v_p[s] = v_q[s] x_j + sum_{d in s} v_q[s - d] h_{d,j}
            terms = []
            vq = self.jet(q, s)
            if vq is not None:
                terms.append(Term(1.0, (vq, self.var(f"x{j}"))))
            for d in _bits(s, self.n):
                vq = self.jet(q, s & ~(1 << d))
                if vq is not None:
                    terms.append(Term(1.0, (vq, self.var(f"h{d + 1}_{j}"))))
            name = "v" + "_".join(map(str, p)) + (f"_s{s}" if self.n else "")
            self.body.append(assign(name, Sum(tuple(terms))))
            self.jets[(p, s)] = name
        return Var(self.jets[(p, s)])

    def add(self, acc: str, terms: tuple, scale: Var | None) -> None:
        """``acc = acc + scale * (terms)`` (``acc`` assigned without ``acc +`` the first time)."""
        init = Var(acc) if acc in self.acc else None
        self.acc.add(acc)
        self.body.append(Assign(Var(acc), Sum(terms, init, scale)))

    def value(self, acc: str):
        """An accumulator's final value, zeros where nothing was added."""
        return Var(acc) if acc in self.acc else Zeros(self.lanes)

    def read(self, name: str, ref: str, base: int, stride: int, comment: str = "") -> Read:
        return Read(name, ref, Offset(base, "c0", stride * self.lanes), self.count, self.lanes, stride, comment)

    def reads(self) -> list:
        """Reads of the inputs the body names, in operand order."""
        ir, out = self.ir, []
        for d in range(self.n + 1):
            for i, (base, stride) in enumerate(self.in_cols):
                name = f"x{i}" if d == 0 else f"h{d}_{i}"
                if name in self.used:
                    out.append(self.read(name, "x_ref" if d == 0 else f"h{d}_ref", base, stride))
        for o in range(len(ir.out_dims)):
            for nu in range(1, ir.correlation[o] + 1):
                for k in range(ir.num_params[o][nu - 1]):
                    if f"w{o}_{nu}_{k}" in self.used:
                        out.append(self.read(f"w{o}_{nu}_{k}", "w_ref", ir.weight_offsets[o][nu - 1] + k * ir.mul, 1,
                                             "rows W[elem[b]]"))
        start = 0
        for o, d in enumerate(ir.out_dims):
            for m in range(d):
                if f"g{o}_{m}" in self.used:
                    base, stride = self.out_cols[start + m]
                    out.append(self.read(f"g{o}_{m}", "g_ref", base, stride))
            start += d
        return out

    def kernel(self, op: str, refs: tuple[str, ...], out: str, desc: str, writes: list) -> SymmetricKernel:
        stmts = self.reads() + [Comment("the monomials in order, each from its prefix")] + self.body + writes
        lines = print_body(stmts, "    ")
        return SymmetricKernel(f"{op}_{self.n}", op, self.n, refs, out, desc,
                               tuple(_prologue(self.lanes, refs, out, lines) + lines))


def _grouped(ts, key):
    out: dict = {}
    for t in ts:
        out.setdefault(key(t), []).append(t)
    return out.items()


def _prologue(lanes: int, refs: tuple[str, ...], out: str, body: list[str]) -> list[str]:
    """The kernel's locals: ``rows`` and ``dtype`` where the body writes zeros (``Zeros``), and
    ``c0``, the channel block: grid axis 1, unless the caller passes it (a body run inside a
    loop of the kernel, where interpret mode has no ``program_id``)."""
    text = "\n".join(body)
    zeros = "jnp.zeros((rows, " in text
    return ([f"    rows = {refs[0]}.shape[0]", f"    dtype = {out}.dtype"] if zeros else []) + \
        [f"    c0 = pl.program_id(1) if c0 is None else c0  # the channel block ({lanes} lanes)"]


def _h_refs(n: int) -> tuple[str, ...]:
    return tuple(f"h{d + 1}_ref" for d in range(n))


def _build_fwd(ir, n, lanes, count) -> SymmetricKernel | None:
    """``out[o, m] = sum_mono v_mono[all] * sum_{terms (o, m)} coeff * W_{o,nu,k}``."""
    b = _Builder(ir, n, lanes, count)
    for mono, ts in b.monomials:
        v = b.jet(mono, b.full)
        if v is None:
            continue
        for (o, m), group in _grouped(ts, lambda t: (t.out, t.m)):
            b.add(f"acc{o}_{m}", tuple(Term(t.coeff, (b.var(f"w{o}_{t.nu}_{t.k}"),)) for t in group), v)
    if not b.acc:
        return None
    writes, start = [], 0
    for o, d in enumerate(ir.out_dims):
        for m in range(d):
            base, stride = b.out_cols[start + m]
            writes.append(Write("out_ref", Offset(base, "c0", stride * lanes), b.value(f"acc{o}_{m}"), count, lanes,
                                stride))
        start += d
    refs = ("x_ref",) + _h_refs(n) + ("w_ref",)
    what = "out = W . P(x)" if n == 0 else f"D^{n}_x out[h1..h{n}]"
    return b.kernel("fwd", refs, "out_ref", f"dF_{n}/dG: {what}, (rows, dim_out * mul).", writes)


def _build_bwd_w(ir, n, lanes, count) -> SymmetricKernel | None:
    """``dW[o, nu, k] = sum_mono v_mono[all] * sum_{terms (o, nu, k)} coeff * G[o, m]``, per row
    (the runtime sums the stored tiles over rows of one element)."""
    b = _Builder(ir, n, lanes, count)
    for mono, ts in b.monomials:
        v = b.jet(mono, b.full)
        if v is None:
            continue
        for (o, nu, k), group in _grouped(ts, lambda t: (t.out, t.nu, t.k)):
            b.add(f"gw{o}_{nu}_{k}", tuple(Term(t.coeff, (b.var(f"g{o}_{t.m}"),)) for t in group), v)
    if not b.acc:
        return None
    writes = []
    for o in range(len(ir.out_dims)):
        for nu in range(1, ir.correlation[o] + 1):
            for k in range(ir.num_params[o][nu - 1]):
                base = ir.weight_offsets[o][nu - 1] + k * ir.mul
                writes.append(Write("gw_ref", Offset(base, "c0", lanes), b.value(f"gw{o}_{nu}_{k}"), count, lanes, 1))
    refs = ("x_ref",) + _h_refs(n) + ("g_ref",)
    return b.kernel("bwd_w", refs, "gw_ref",
                    f"dF_{n}/dW per row (rows, weight_numel): sum_m G[o, m] * D^{n} P[o, m, nu, k].", writes)


def _build_bwd_x(ir, n, lanes, count) -> SymmetricKernel | None:
    """``dx_j = sum_mono A_mono * mult_j * v_{mono - j}[all]`` with ``A_mono = sum_terms coeff *
    G[o, m] W_{o,nu,k}``: the derivative of ``D^n mono [h]`` in ``x_j`` is ``D^n`` of the
    monomial with one ``x_j`` removed, times the multiplicity of ``j`` in it."""
    b = _Builder(ir, n, lanes, count)
    for idx, (mono, ts) in enumerate(b.monomials):
        if len(mono) < n + 1:  # D^n of a monomial of degree <= n is constant in x
            continue
        a = f"a{idx}"
        b.body.append(assign(a, Sum(tuple(Term(t.coeff, (b.var(f"g{t.out}_{t.m}"), b.var(f"w{t.out}_{t.nu}_{t.k}")))
                                          for t in ts))))
        for j in sorted(set(mono)):
            r = mono.index(j)
            sub = mono[:r] + mono[r + 1:]
            mult = float(mono.count(j))
            if not sub:  # n == 0, degree 1: d x_j / d x_j = 1
                b.add(f"dx{j}", (Term(mult, ()),), Var(a))
                continue
            vs = b.jet(sub, b.full)
            if vs is not None:
                b.add(f"dx{j}", (Term(mult, (vs,)),), Var(a))
    if not b.acc:
        return None
    writes = [Write("gx_ref", Offset(base, "c0", stride * lanes), b.value(f"dx{i}"), count, lanes, stride)
              for i, (base, stride) in enumerate(b.in_cols)]
    refs = ("x_ref",) + _h_refs(n) + ("w_ref", "g_ref")
    what = "G-contracted gradient of the polynomials" if n == 0 else \
        f"gradient of D^{n}_x F[h1..h{n}]" + (" (the Hessian-vector product)" if n == 1 else "")
    return b.kernel("bwd_x", refs, "gx_ref", f"dF_{n}/dx: {what}, (rows, dim_in * mul).", writes)


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
        levels: largest number of directions ``n`` generated: reverse-mode derivatives of
            order up to ``levels + 1`` in ``x``. Default ``N``, the largest monomial degree
            (``max(correlation)``): every order works, the higher derivatives being zero (as
            the torch ops). A smaller value makes a smaller file (MACE-MP's case: 0.84 MB at
            ``levels = 1``, 1.7 MB at 3); a derivative beyond it raises ``NotImplementedError``.
        block_channels: channels per program (a power of two; ``channel_blocking``).
        block_nodes: default rows per program (a power of two).

    Raises:
        ValueError: bad ``levels``, ``block_channels`` or ``block_nodes``.
    """
    if block_nodes < 1 or block_nodes & (block_nodes - 1):
        raise ValueError(f"block_nodes must be a power of two, got {block_nodes}")
    degree = max(len(t.monomial) for t in ir.terms) if ir.terms else 0
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
    package, paths as ``eqdsl.symmetric.codegen.symmetric_files`` gives the torch half (merge
    the two dicts and write them with ``eqdsl.codegen.generate.write_package``).
    ``options``: ``render_files``'."""
    header = _header(ir) if header is None else header
    return {f"{ir.name}/{rel}": text for rel, text in render_files(ir, header, **options).items()}


def generate_symmetric_jax(ir: SymmetricContractionIR, out_dir, *, header: str | None = None, **options) -> Path:
    """Write ``out_dir/<name>/`` (``out_dir`` importable): the metadata ``__init__.py``
    (``templates/symmetric_init.py.j2``, as the torch generator writes it), ``jax_ops.py``
    and ``pallas_kernels.py``, atomically (``write_package``: a directory eqdsl did not write
    is refused). It replaces the whole package, torch files included: to have both, write
    ``symmetric_files(ir) | jax_files(ir)`` in one ``write_package``.

    Returns:
        The package directory.

    Raises:
        eqdsl.codegen.generate.GenerateError: ``out_dir/<name>`` exists and was not written
            by eqdsl.
        ValueError: bad ``options`` (``render_files``).
    """
    header = _header(ir) if header is None else header
    files = jax_files(ir, header=header, **options)
    files[f"{ir.name}/__init__.py"] = render(
        "symmetric_init.py.j2", header=header, name=ir.name, irreps_in=repr(ir.irreps_in),
        irreps_out=repr(ir.irreps_out), mul=ir.mul, correlation=repr(ir.correlation), num_elements=ir.num_elements,
        num_params=repr(ir.num_params), weight_offsets=repr(ir.weight_offsets), weight_numel=ir.weight_numel,
        layout=repr(ir.layout), dtypes=repr(ir.dtypes), basis=repr(ir.basis), cg_convention=repr(ir.cg_convention))
    (written,) = write_package(out_dir, files)
    return written
