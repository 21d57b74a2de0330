"""eqdsl.backends.pallas.passes: the factored sums equal the written ones, with fewer
operations on wide tiles.

Statements are printed by the Pallas printer and run in numpy: narrow names are
``(rows, 1)`` arrays, wide ones ``(rows, P)``, wrapped so that every operation whose
result is wide is counted.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from eqdsl.backends.pallas.passes import factor_kernel, fma_kernel
from eqdsl.backends.pallas.printer import print_body
from eqdsl.backends.pallas.stmts import Comment, LaneSum, assign, sum_of
from eqdsl.kernel_ir import Assign, Sum, Term, Var, term

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


def _kernel(stmts):
    return {"groups": [{"body": list(stmts)}], "narrow": NARROW}


def _run(stmts, values, fma, target="acc"):
    ops = [0]
    env = {k: _Tile(v, ops) for k, v in values.items()}
    if fma:
        stmts = fma_kernel(_kernel(stmts))["groups"][0]["body"]
    exec("\n".join(print_body(stmts, "")), {"rt": SimpleNamespace(fma=_fma)}, env)
    return env[target].a, ops[0]


def _random_sum(rng: random.Random):
    """A sum like the kernels': terms ``± c * factors`` over two or three operands."""
    terms = []
    for _ in range(rng.randint(1, 14)):
        factors = [rng.choice(WIDE[:4]), rng.choice(NARROW)]
        if rng.random() < 0.5:
            factors.append(rng.choice(WIDE[4:8]))
        rng.shuffle(factors)
        c = rng.choice([1.0, -1.0, 0.5, -0.25, 0.7071067811865476, -0.408248290463863])
        terms.append(term(c, *factors))
    init, scale = rng.choice([(None, None), ("acc", None), ("acc", "w")])
    return assign("acc", sum_of(terms, init, scale))


@pytest.mark.parametrize("fma", [False, True])
def test_factored_sums_are_equal_and_cheaper(fma):
    rng, nrng = random.Random(7), np.random.default_rng(7)
    saved = 0
    for _ in range(200):
        stmt = _random_sum(rng)
        values = {n: nrng.standard_normal((ROWS, 1)) for n in NARROW}
        values |= {n: nrng.standard_normal((ROWS, P)) for n in WIDE + ["acc"]}
        got = factor_kernel(_kernel([stmt]))["groups"][0]["body"]
        want, ops_before = _run([stmt], values, fma)
        have, ops_after = _run(got, values, fma)
        np.testing.assert_allclose(have, want, rtol=1e-12, atol=1e-12)
        assert ops_after <= ops_before, "\n".join(print_body(got, ""))
        saved += ops_before - ops_after
    assert saved > 0


def _values(seed):
    values = {n: np.random.default_rng(seed).standard_normal((ROWS, 1)) for n in NARROW}
    values |= {n: np.random.default_rng(seed + 1).standard_normal((ROWS, P)) for n in WIDE}
    values["acc"] = np.random.default_rng(seed + 2).standard_normal((ROWS, P))
    return values


def test_forward_sum_becomes_one_multiply_add_per_x1_component():
    # acc = acc + w * (c1 x1_0 x2_1 + c2 x1_0 x2_4 + c3 x1_1 x2_0): two wide multiply-adds
    # on x1 (x2 narrow), where the written form has two wide operations per term
    stmt = assign("acc", sum_of([term(0.5, "x1_0", "x2_1"), term(-0.25, "x1_0", "x2_4"), term(0.5, "x1_1", "x2_0")],
                                "acc", "w"))
    body = factor_kernel(_kernel([stmt]))["groups"][0]["body"]
    # the narrow parts of the two x1_0 terms are summed first, a column
    assert body == [
        Assign(Var("nf1"), Sum((term(0.5, "x2_1"), term(-0.25, "x2_4")))),
        Assign(Var("acc"), Sum((term(1.0, "nf1", "x1_0"), term(0.5, "x2_0", "x1_1")), Var("acc"), Var("w"))),
    ]
    values = _values(0)
    want, before = _run([stmt], values, False)
    have, after = _run(body, values, False)
    np.testing.assert_allclose(have, want, rtol=1e-12)
    assert after < before


def test_shared_wide_factor_is_taken_out():
    stmt = assign("acc", sum_of([term(0.5, "x1_0", "x2_1", "g_0"), term(0.5, "x1_1", "x2_2", "g_0"),
                                 term(1.0, "x1_1", "x2_3", "g_1")]))
    body = factor_kernel(_kernel([stmt]))["groups"][0]["body"]
    # g_0 and x1_1 are both in two terms: the first seen, g_0, is taken out
    assert body == [
        Assign(Var("wf1"), Sum((term(0.5, "x2_1", "x1_0"), term(0.5, "x2_2", "x1_1")))),
        Assign(Var("acc"), Sum((term(1.0, "wf1", "g_0"), term(1.0, "x2_3", "x1_1", "g_1")))),
    ]
    values = _values(1)
    want, before = _run([stmt], values, True)
    have, after = _run(body, values, True)
    np.testing.assert_allclose(have, want, rtol=1e-12)
    assert after < before


def test_sums_with_other_terms_are_left_alone():
    """A sum with a lane reduction among its factors is neither factored nor chained."""
    stmt = assign("c_0", Sum((Term(1.0, (LaneSum(Var("px2_0_128")),)), term(1.0, "x2_0"))))
    body = [stmt, Comment("x")]
    assert factor_kernel(_kernel(body))["groups"][0]["body"] == body
    assert fma_kernel(_kernel(body))["groups"][0]["body"] == body


def test_printer_writes_every_statement_as_python():
    """Each statement kind prints as Python that parses to what it says (a loop's body in its
    ``def``, a sum's terms with their signs as binary operators)."""
    import ast

    from eqdsl.backends.pallas.stmts import Flat, LoadTile, Loop, Masked, Offset, Read, StoreTile, Unflatten, Write, \
        Zeros

    body = (
        Unflatten("t", "u", "v", 3),
        Read("w", "w_ref", Offset(5, Flat("u", 3, "v"), 4), 3, 4, 2),
        assign("acc", sum_of([term(-0.5, "x1_0", "x2_1"), term(1.0, "x1_1")], "acc", "w")),
    )
    stmts = [
        Comment("path 0"),
        LoadTile(("x1_0_0", "x1_0_1", "x1_0_2"), "x1_ref", 0, 8, 3, 8, "x1 block 0"),
        Read("x2_0_0", "x2_ref", 0, 1, 1),
        assign("acc", Zeros(8)),
        Loop("_path_0", "t", 6, ("acc",), body),
        assign("acc", Masked("lane_8", "<", 6, Var("acc"))),
        Write("out_ref", 0, Var("acc"), 6, 8),
        StoreTile("out_ref", 8, (Var("acc"), Zeros(8), Zeros(8)), 8, 3, 8),
    ]
    text = "\n".join(print_body(stmts, ""))
    tree = ast.parse(text)
    loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert loop.name == "_path_0" and [a.arg for a in loop.args.args] == ["t", "carry"]
    acc = [n for n in ast.walk(loop) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "acc"]
    # acc + w * (-0.5 * x1_0 * x2_1 + x1_1): the second term's operator is a binary +
    (update,) = acc
    assert isinstance(update.value.right.right.op, ast.Add)
    with pytest.raises(TypeError):
        print_body([object()], "")
