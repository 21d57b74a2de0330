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
"""

from __future__ import annotations

import itertools

from ...kernel_ir import Assign, Sum, factor_sum, fma_chain, is_plain
from .stmts import Loop

__all__ = ["factor_kernel", "fma_kernel"]


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
