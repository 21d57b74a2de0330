"""eqdsl.codegen.pallas_factor: the factored sums equal the written ones, with fewer
operations on wide tiles.

Statements are evaluated in numpy: narrow names are ``(rows, 1)`` arrays, wide ones
``(rows, P)``, wrapped so that every operation whose result is wide is counted.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from eqdsl.codegen import pallas_backend as pb
from eqdsl.codegen.pallas_factor import factor_kernel

ROWS, P = 3, 8
NARROW = [f"x2_{j}" for j in range(5)]
WIDE = [f"x1_{i}" for i in range(4)] + [f"g_{k}" for k in range(4)] + ["w"]


class _Tile:
    """A numpy array that counts the wide operations made from it (``ops[0]``)."""

    def __init__(self, a, ops):
        self.a, self.ops = a, ops

    def _wrap(self, a):
        if a.shape[-1] > 1:
            self.ops[0] += 1
        return _Tile(a, self.ops)

    def _val(self, o):
        return o.a if isinstance(o, _Tile) else o

    def __mul__(self, o):
        return self._wrap(self.a * self._val(o))

    __rmul__ = __mul__

    def __add__(self, o):
        return self._wrap(self.a + self._val(o))

    __radd__ = __add__

    def __sub__(self, o):
        return self._wrap(self.a - self._val(o))

    def __rsub__(self, o):
        return self._wrap(self._val(o) - self.a)

    def __neg__(self):
        return _Tile(-self.a, self.ops)  # folded into the consumer on the GPU


def _fma(a, b, c):
    return a * b + c


def _source(stmts):
    lines = []
    for s in stmts:
        if s["kind"] == "sum":
            body = " ".join(s["terms"])
            lines.append(f"{s['target']} = {s['prefix']}({body})" if s["prefix"] else f"{s['target']} = {body}")
        else:
            lines.append(s["text"])
    return "\n".join(lines)


def _run(stmts, values, fma):
    ops = [0]
    env = {k: _Tile(v, ops) for k, v in values.items()}
    if fma:
        stmts = pb._with_fma(stmts)
    exec(_source(stmts).replace("rt.fma", "_fma"), {"_fma": _fma}, env)
    return env["acc"].a, ops[0]


def _random_sum(rng: random.Random):
    """A sum like the kernels': terms ``± c * factors`` over two or three operands."""
    terms = []
    for _ in range(rng.randint(1, 14)):
        factors = [rng.choice(WIDE[:4]), rng.choice(NARROW)]
        if rng.random() < 0.5:
            factors.append(rng.choice(WIDE[4:8]))
        rng.shuffle(factors)
        c = rng.choice([1.0, -1.0, 0.5, -0.25, 0.7071067811865476, -0.408248290463863])
        terms.append((c, factors))
    text = []
    for c, factors in terms:
        body = " * ".join(([] if abs(c) == 1.0 else [repr(abs(c))]) + factors)
        text.append(("- " if c < 0 else ("+ " if text else "")) + body)
    prefix = rng.choice(["", "acc + ", "acc + w * "])
    return pb._sum("acc", prefix, text)


@pytest.mark.parametrize("fma", [False, True])
def test_factored_sums_are_equal_and_cheaper(fma):
    rng, nrng = random.Random(7), np.random.default_rng(7)
    saved = 0
    for _ in range(200):
        stmt = _random_sum(rng)
        values = {n: nrng.standard_normal((ROWS, 1)) for n in NARROW}
        values |= {n: nrng.standard_normal((ROWS, P)) for n in WIDE + ["acc"]}
        kernel = {"groups": [{"body": [stmt]}], "narrow": NARROW}
        got = factor_kernel(kernel)["groups"][0]["body"]
        want, ops_before = _run([stmt], values, fma)
        have, ops_after = _run(got, values, fma)
        np.testing.assert_allclose(have, want, rtol=1e-12, atol=1e-12)
        assert ops_after <= ops_before, _source(got)
        saved += ops_before - ops_after
    assert saved > 0


def test_forward_sum_becomes_one_multiply_add_per_x1_component():
    # acc = acc + w * (c1 x1_0 x2_1 + c2 x1_0 x2_4 + c3 x1_1 x2_0): two wide multiply-adds
    # on x1 (x2 narrow), where the written form has two wide operations per term
    stmt = pb._sum("acc", "acc + w * ", ["0.5 * x1_0 * x2_1", "- 0.25 * x1_0 * x2_4", "+ 0.5 * x1_1 * x2_0"])
    body = factor_kernel({"groups": [{"body": [stmt]}], "narrow": NARROW})["groups"][0]["body"]
    assert [s["target"] for s in body] == ["nf1", "acc"]
    assert body[0]["terms"] == ["0.5 * x2_1", "- 0.25 * x2_4"]
    assert body[1]["terms"] == ["nf1 * x1_0", "+ 0.5 * x2_0 * x1_1"]


def test_shared_wide_factor_is_taken_out():
    stmt = pb._sum("r", "", ["0.5 * x1_0 * x2_1 * g_0", "+ 0.5 * x1_1 * x2_2 * g_0", "+ x1_1 * x2_3 * g_1"])
    body = factor_kernel({"groups": [{"body": [stmt]}], "narrow": NARROW})["groups"][0]["body"]
    # g_0 and x1_1 are both in two terms: the first seen, g_0, is taken out
    assert [(s["target"], s["terms"]) for s in body] == [
        ("wf1", ["0.5 * x2_1 * x1_0", "+ 0.5 * x2_2 * x1_1"]),
        ("r", ["wf1 * g_0", "+ x2_3 * x1_1 * g_1"]),
    ]
    values = {n: np.random.default_rng(1).standard_normal((ROWS, 1)) for n in NARROW}
    values |= {n: np.random.default_rng(2).standard_normal((ROWS, P)) for n in WIDE}
    values["acc"] = np.zeros((ROWS, P))
    ren = lambda b: [dict(s, target="acc" if s["target"] == "r" else s["target"]) for s in b]  # noqa: E731
    want, before = _run(ren([stmt]), values, True)
    have, after = _run(ren(body), values, True)
    np.testing.assert_allclose(have, want, rtol=1e-12)
    assert after < before


def test_sums_with_other_terms_are_left_alone():
    stmt = pb._sum("c_0", "", ["jnp.sum(px2_0_128, axis=1, keepdims=True)", "+ x2_0"])
    kernel = {"groups": [{"body": [stmt, pb._line("x = 1")]}], "narrow": NARROW}
    assert factor_kernel(kernel)["groups"][0]["body"] == [stmt, pb._line("x = 1")]
