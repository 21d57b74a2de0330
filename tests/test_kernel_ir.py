"""eqdsl.kernel_ir: factoring and fma chains compute the sum they transform.

Random sums of products of random variables are evaluated in numpy (float64) before
and after each transformation; ``fma`` is ``a * b + c`` here (the algebra, not the
rounding). Narrow values are ``(rows, 1)`` columns, wide ones ``(rows, P)`` tiles.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from eqdsl.kernel_ir import Assign, Fma, Sum, Term, Var, factor_sum, fma_chain, is_plain, term

ROWS, P = 3, 8
NARROW = [f"n{j}" for j in range(4)]
WIDE = [f"x{i}" for i in range(4)] + [f"g{k}" for k in range(3)] + ["w"]


def _eval(e, env):
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Term):
        out = e.coeff
        for f in e.factors:
            out = out * _eval(f, env)
        return out
    if isinstance(e, Sum):
        s = sum(_eval(t, env) for t in e.terms)
        if e.scale is not None:
            s = _eval(e.scale, env) * s
        return s if e.init is None else _eval(e.init, env) + s
    if isinstance(e, Fma):
        return _eval(e.a, env) * _eval(e.b, env) + _eval(e.c, env)
    raise TypeError(e)


def _run(stmts, env):
    env = dict(env)
    for st in stmts:
        env[st.target.name] = _eval(st.value, env)
    return env


def _random_sum(rng, init, scale):
    terms = []
    for _ in range(rng.randint(1, 9)):
        factors = rng.sample(NARROW, rng.randint(0, 2)) + rng.sample(WIDE[:7], rng.randint(1, 2))
        rng.shuffle(factors)
        coeff = rng.choice([1.0, -1.0, rng.uniform(-2, 2)])
        terms.append(term(coeff, *factors))
    return Sum(tuple(terms), Var(init) if init else None, Var(scale) if scale else None)


def _values(seed):
    r = np.random.default_rng(seed)
    env = {n: r.standard_normal((ROWS, 1)) for n in NARROW}
    env.update({n: r.standard_normal((ROWS, P)) for n in WIDE})
    env["acc"] = r.standard_normal((ROWS, P))
    return env


def _fresh():
    count = itertools.count(1)
    return lambda kind: f"{kind}{next(count)}"


@pytest.mark.parametrize("seed", range(40))
def test_factor_sum_equals_the_sum(seed):
    rng = random.Random(seed)
    s = _random_sum(rng, *rng.choice([(None, None), ("acc", None), ("acc", "w")]))
    env = _values(seed)
    want = _eval(s, env)
    f = factor_sum(s, set(NARROW), _fresh())
    got = _eval(f.sum, _run(f.defs, env))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the defs that factor_sum calls narrow are computed from narrow values only: columns
    for d in f.defs:
        if d.target.name in f.narrow:
            assert _run(f.defs, env)[d.target.name].shape == (ROWS, 1)


def _wide_ops(s: Sum, narrow) -> int:
    """Multiplies and adds with a wide result in ``s`` written as a plain sum."""
    ops = 0
    for i, t in enumerate(s.terms):
        k = sum(1 for f in t.factors if f.name not in narrow)
        n = len(t.factors) - k + (abs(t.coeff) != 1.0)
        if k:
            ops += k - 1 + (n > 0)  # narrow part computed narrow, then one wide multiply per wide factor
        ops += (i > 0) and k > 0
    return ops


def test_factor_sum_takes_out_shared_factors():
    """The fused backward's weight gradient: ``sum_i c_i x_i g`` -> ``(sum_i c_i x_i) g``, and
    terms with the same wide factors merge their narrow parts."""
    s = Sum((term(0.5, "x0", "g0"), term(-0.25, "x1", "g0"), term(2.0, "n0", "x2"), term(3.0, "n1", "x2")))
    f = factor_sum(s, set(NARROW), _fresh())
    narrow = set(NARROW) | f.narrow
    total = _wide_ops(f.sum, narrow) + sum(_wide_ops(d.value, narrow) for d in f.defs)
    assert total < _wide_ops(s, set(NARROW))
    env = _values(0)
    np.testing.assert_allclose(_eval(f.sum, _run(f.defs, env)), _eval(s, env), rtol=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_fma_chain_equals_the_sum(seed):
    rng = random.Random(seed)
    init, scale = rng.choice([(None, None), ("acc", None), ("acc", "w"), ("n3", None)])
    s = _random_sum(rng, init, scale)
    env = _values(seed)
    want = _eval(s, env)
    chain = fma_chain(Var("acc"), s, fn="rt.fma")
    assert all(isinstance(a, Assign) for a in chain)
    # every step after the first is one fma (or the final scale), never a plain sum
    assert not any(isinstance(a.value, Sum) for a in chain)
    np.testing.assert_allclose(_run(chain, env)["acc"], want, rtol=1e-12, atol=1e-12)


def test_transformations_refuse_other_factors():
    class Lane:  # a backend's expression, e.g. a lane reduction
        def __str__(self):
            return "jnp.sum(x0, axis=1, keepdims=True)"

    s = Sum((Term(1.0, (Lane(),)), term(1.0, "x1")))
    assert not is_plain(s)
    with pytest.raises(ValueError):
        factor_sum(s, set(), _fresh())
    with pytest.raises(ValueError):
        fma_chain(Var("acc"), s)


def test_printing():
    s = Sum((term(-0.5, "a", "b"), term(1.0, "c"), term(-1.0, "d")), Var("acc"), Var("w"))
    assert str(s) == "acc + w * (- 0.5 * a * b + c - d)"
    assert str(term(-1.0)) == "-1.0" and str(term(0.25, "x")) == "0.25 * x"
    assert str(Fma(term(-0.5, "a"), Var("b"), Var("acc"), "rt.fma")) == "rt.fma(-0.5 * a, b, acc)"
