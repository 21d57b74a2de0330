"""Passes over a Pallas kernel's statements: factoring its sums, and fma chains.

Both rewrite the ``Assign``\\ s of a ``kernel_ir.Sum`` (loops included) whose factors are
all ``Var``\\ s (``kernel_ir.is_plain``); a sum with another factor (a lane reduction)
is left as it is. Exact algebra: only the rounding order changes.

``factor_kernel`` (spec key ``pallas_factor``): a kernel's operands are of two widths,
*wide* ``(rows, P)`` tiles, one value per channel (``x1``, ``g``, a weight row), and
*narrow* ``(rows, 1)`` columns, one value per row (an ``x2`` block of one channel, e.g.
the spherical harmonics of a ``uvu`` conv; a column read inside a channel loop). An
operation on a wide tile costs ``P / 32 / num_warps`` times one on a narrow column per
thread; on the H100 the JAX kernels are issue-bound (ncu: 3.7 cycles per issued
instruction in mace_large's fused conv backward, 2026-11-25), so every wide operation
saved is time saved. Each sum is factored by ``kernel_ir.factor_sum``; the kernel
builders know which names are narrow (the context's ``narrow``), and a sum whose terms
are all narrow makes its target narrow too. New names are ``nf<k>`` (narrow) and
``wf<k>`` (wide), numbered per kernel.

``fma_kernel`` (spec key ``pallas_fma``): every sum as a chain of ``rt.fma``
(``kernel_ir.fma_chain``; inline PTX ``fma.rn`` on the GPU, as XLA's Triton pipeline
contracts none). Runs after ``factor_kernel``.

``unroll_kernel`` (spec key ``pallas_unroll``): each innermost channel loop
(``lax.fori_loop``, which Pallas's Triton lowering keeps a loop: it refuses ``unroll``)
with ``U`` steps per iteration, the operand reads of all ``U`` first, then their
arithmetic and stores in step order. A step's reads depend on its channel index only,
and the kernels never read a ref they write, so this changes no value; it puts ``U``
loads in flight where a step had one (the ``uvw`` kernels loop over a channel, one
weight row per step, and wait on each: ncu, e3tools_conv's forward, H200, 2026-11-28:
18 cycles per issued instruction at 30% occupancy). Runs last.
"""

from __future__ import annotations

import itertools

import dataclasses

from ...kernel_ir import Assign, Sum, Var, factor_sum, fma_chain, is_plain
from .stmts import Comment, Loop, Offset, Read, Unflatten

__all__ = ["factor_kernel", "fma_kernel", "unroll_kernel"]


def _sums(stmts, rewrite) -> list:
    """``stmts`` with each plain ``Assign`` of a ``Sum`` replaced by ``rewrite(stmt)`` (a list
    of statements), loop bodies included."""
    out = []
    for st in stmts:
        if isinstance(st, Assign) and isinstance(st.value, Sum) and is_plain(st.value):
            out.extend(rewrite(st))
        elif isinstance(st, Loop):
            out.append(Loop(st.fn, st.var, st.count, st.carry, tuple(_sums(st.body, rewrite))))
        else:
            out.append(st)
    return out


def factor_kernel(kernel: dict) -> dict:
    """``kernel`` (a kernel context, ``kernels.KernelBuilder.build``) with every sum of its
    body factored (module docstring)."""
    narrow = set(kernel["narrow"])
    count = itertools.count(1)

    def fresh(kind: str) -> str:
        return f"{kind}{next(count)}"

    def rewrite(st: Assign) -> list:
        s = st.value
        f = factor_sum(s, narrow, fresh)
        narrow.update(f.narrow)
        if all(v is None or v.name in narrow for v in (s.init, s.scale)) and \
                all(x.name in narrow for t in f.sum.terms for x in t.factors):
            narrow.add(st.target.name)
        return [*f.defs, Assign(st.target, f.sum)]

    return {**kernel, "groups": [{**g, "body": _sums(g["body"], rewrite)} for g in kernel["groups"]]}


def fma_kernel(kernel: dict) -> dict:
    """``kernel`` with every sum of its body as an ``rt.fma`` chain (module docstring)."""

    def rewrite(st: Assign) -> list:
        if not st.value.terms:
            return [st]
        return list(fma_chain(st.target, st.value, fn="rt.fma"))

    return {**kernel, "groups": [{**g, "body": _sums(g["body"], rewrite)} for g in kernel["groups"]]}


def _renamed(x, names: dict[str, str]):
    """``x`` (a statement or expression, as data) with every name of ``names`` replaced:
    ``Var``\\ s, the names a statement assigns or reads at (``Read.name``, an ``Offset``'s
    loop variable, ``Unflatten``'s), compared whole (a ref or a comment is never a key)."""
    if isinstance(x, str):
        return names.get(x, x)
    if isinstance(x, tuple):
        return tuple(_renamed(y, names) for y in x)
    if isinstance(x, list):
        return [_renamed(y, names) for y in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, (type, Comment)):
        return dataclasses.replace(x, **{f.name: _renamed(getattr(x, f.name), names) for f in dataclasses.fields(x)})
    return x


def _single_assignment(body: tuple, carry: tuple) -> list:
    """``body`` with each name it assigns again (a second path's weight row ``w``, its
    ``s_k``) given a new name from there on, so that every temporary is assigned once
    and a step's reads can move ahead of its other statements; the carry keeps its names."""
    current: dict[str, str] = {}
    seen: set[str] = set()
    out = []
    for st in body:
        if isinstance(st, (Assign, Read)):
            name = st.target.name if isinstance(st, Assign) else st.name
            new = name
            if name not in carry and name in seen:
                k = 2
                while f"{name}__v{k}" in seen:
                    k += 1
                new = f"{name}__v{k}"
            if isinstance(st, Assign):
                st = Assign(Var(new), _renamed(st.value, current))
            else:
                st = dataclasses.replace(st, name=new, start=_renamed(st.start, current))
            seen.update((name, new))
            current[name] = new
        else:
            st = _renamed(st, current)
        out.append(st)
    return out


def _steps(loop: Loop, index, first: int, count: int, n: int) -> list:
    """Steps ``first .. first + n - 1`` of ``loop``'s body (channel ``first + j`` or
    ``j + index * count``): every step's channel index, then every step's reads, then every
    step's other statements, step ``j``'s names suffixed ``__j`` (the carry's are not: the
    steps update it in order; generated names hold no ``__`` otherwise)."""
    body = _single_assignment(loop.body, loop.carry)
    local = [st.target.name if isinstance(st, Assign) else st.name for st in body if isinstance(st, (Assign, Read))]
    local = [name for name in dict.fromkeys(local) if name not in loop.carry]
    idx, reads, rest = [], [], []
    for j in range(n):
        names = {name: f"{name}__{j}" for name in local + [loop.var]}
        idx.append(Assign(Var(names[loop.var]), Offset(first + j) if index is None else Offset(j, index, count)))
        for st in _renamed(body, names):
            (reads if isinstance(st, Read) else rest).append(st)
    return idx + reads + rest


def _unroll(stmts, u: int) -> list:
    """``stmts`` with each innermost ``Loop`` of at least ``u`` steps as ``count // u``
    iterations of ``u`` steps, then the ``count % u`` left over, straight-line."""
    out = []
    for st in stmts:
        if not isinstance(st, Loop):
            out.append(st)
        elif any(isinstance(b, Loop) for b in st.body):
            out.append(Loop(st.fn, st.var, st.count, st.carry, tuple(_unroll(st.body, u))))
        elif st.count < u or any(isinstance(b, Unflatten) for b in st.body):
            out.append(st)  # shorter than one unrolled iteration, or a flattened (u, v) loop: as it is
        else:
            whole, tail = divmod(st.count, u)
            t = f"{st.var}t"
            out.append(Loop(st.fn, t, whole, st.carry, tuple(_steps(st, t, 0, u, u))))
            if tail:  # the last count % u steps, straight-line after the loop
                out.extend(_steps(st, None, whole * u, u, tail))
    return out


def unroll_kernel(kernel: dict, u: int) -> dict:
    """``kernel`` with each innermost channel loop of at least ``u`` steps unrolled ``u``
    times, its reads first (module docstring); ``u = 1``: unchanged."""
    if u <= 1:
        return kernel
    return {**kernel, "groups": [{**g, "body": _unroll(g["body"], u)} for g in kernel["groups"]]}
