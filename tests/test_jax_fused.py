"""The fused Pallas backward of channelwise (``uvu``) and fully connected (``uvw``) products
(``eqdsl.backends.pallas.fused``; CPU: interpret mode).

``backward_fused(x1, x2, w, g)`` must equal the float64 oracle
(``tensor_product_vjp_reference``) as one kernel and split over several (a small
``MAX_TERMS_PER_KERNEL``: per-kernel ``gx2`` partial sums added by the launcher), in
both layouts and with paths out of ``x1`` block order (weight columns put back in
e3nn's order); a ``uvw`` one's channel loops also unrolled (``pallas_unroll``, every kernel
of the product against the oracle). ``jax.grad`` of the tensor product must run it (and not the three
backward kernels), and derivatives through it (forces, then their gradient with
respect to the weights) must match e3nn-jax and dense einsums differentiated by JAX.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from eqdsl.backends import check_tuning  # noqa: E402
from eqdsl.backends.pallas import assemble, plan  # noqa: E402
from eqdsl.backends.pallas.fused import fused_context, fused_reason  # noqa: E402
from eqdsl.backends.pallas.stmts import Write  # noqa: E402
from eqdsl.lower import lower  # noqa: E402
from eqdsl.reference import tensor_product_vjp_reference  # noqa: E402
from eqdsl.spec import parse_spec  # noqa: E402
from test_jax_grads import _cheap_interpret_compiles, jnp_tensor_product  # noqa: E402,F401
from test_jax_ops import build, inputs, rel_err, spec_text  # noqa: E402

# mixed multiplicities (4 and 2 channels); x2 of one channel per irrep, as MACE / NequIP
IN1, IN2, OUT = "4x0e+4x1o+2x2e", "0e+1o+2e", "0e+1o+2e"
# paths out of x1 block order (x1 blocks 1, 0, 1): the fused kernel writes them by x1 block
UNORDERED = dict(in1="3x0e+2x1o", in2="0e+1o", out="2x1o+3x1o+2x0e",
                 instructions=[(1, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 1, 2, "uvu", True)])
# fully connected (uvw): 3 and 2 output channels in tiles of 4 and 2 (masked lanes)
UVW_OUT = "3x0e+2x1o+3x2e"
SPLIT_BUDGET = 100  # terms per kernel: the 249 terms of IN1 x IN2 -> OUT over several kernels
BB = 4  # batch rows per program: BATCH has padded rows and several programs
BATCH = 13


def _text(name, layout="mul_ir", mode="uvu", **kw):
    """A float64 spec: ``IN1 x IN2 -> OUT`` (``uvu``) or ``-> UVW_OUT`` (``uvw``), or ``kw``'s
    irreps and instructions."""
    if kw and "instructions" not in kw:
        kw = {"mode": mode, **kw}
    kw = kw or dict(in1=IN1, in2=IN2, out=UVW_OUT if mode == "uvw" else OUT, mode=mode)
    return spec_text(name, **kw, shared=False, layout=layout, dtypes=("float64",))


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jaxfused")
    cache = {}

    def get(key):
        if key not in cache:
            if key == "unordered":
                cache[key] = build(_text("fu_unordered", **UNORDERED), root)
            else:
                split, layout, *extra = key
                factor, mode = "factor" in extra, "uvw" if "uvw" in extra else "uvu"
                name = f"fu_{int(split)}_{layout}{'_f' if factor else ''}_{mode}{'_u' if 'unroll' in extra else ''}"
                if "unroll" in extra:  # x1 channel loops of 3 (one step left over), 4 and 2
                    text = _text(name, layout, "uvw", in1="3x0e+4x1o+2x2e", in2=IN2, out=UVW_OUT)
                else:
                    text = _text(name, layout, mode)
                if factor:  # the q_j form and factored sums (pallas_factor)
                    text += "\n[tensor_product.tuning]\npallas_factor = 1\n"
                if "unroll" in extra:  # two channel steps per loop iteration (4: 2 x 2; 3: 2 + a step after)
                    text += "\n[tensor_product.tuning]\npallas_unroll = 2\n"
                with pytest.MonkeyPatch.context() as mp:
                    if split:  # read by plan.split when the package is generated
                        mp.setattr(plan, "MAX_TERMS_PER_KERNEL", SPLIT_BUDGET)
                    cache[key] = build(text, root)
        return cache[key]

    return get


def _ir(text):
    return lower(parse_spec(text, "s.toml")[0])


def _ctx(ir):
    return assemble.build_context(ir, "")["fused"]


def _gw_starts(ctx) -> list[int]:
    """The first weight column of every ``gw_ref`` store of the fused kernels, in kernel order."""
    return [st.start for k in ctx["kernels"] for grp in k["groups"] for st in grp["body"]
            if isinstance(st, Write) and st.ref == "gw_ref"]


def test_generator_makes_one_or_several_kernels(monkeypatch):
    ir = _ir(_text("s"))
    one = _ctx(ir)
    assert len(one["kernels"]) == 1 and one["gx1_segments"] is None
    assert one["kernels"][0]["width"] == ir.dim_in1 and one["kernels"][0]["gw_width"] == ir.weight_numel
    monkeypatch.setattr(plan, "MAX_TERMS_PER_KERNEL", SPLIT_BUDGET)
    split = _ctx(ir)
    assert len(split["kernels"]) > 1 and split["gx1_segments"] is None
    assert sum(k["width"] for k in split["kernels"]) == ir.dim_in1
    assert sum(k["gw_width"] for k in split["kernels"]) == ir.weight_numel
    # every kernel writes each of its paths' weight gradients at the path's own columns of the
    # shared row (e3nn's order), so the launcher joins or reorders nothing
    offsets = sorted(p.weight_offset for p in ir.paths if p.has_weight)
    assert sorted(_gw_starts(split)) == offsets and sorted(_gw_starts(one)) == offsets
    unordered = _ir(_text("u", **UNORDERED))
    ctx = _ctx(unordered)
    order = [pi for k in ctx["kernels"] for pi in k["paths"]]
    assert order != sorted(order)  # the kernel runs the paths in x1 block order, not e3nn's
    assert _gw_starts(ctx) == [unordered.paths[pi].weight_offset for pi in order]


@pytest.mark.parametrize("why,text", [
    ("shared weights", spec_text("s", IN1, IN2, OUT, mode="uvu", shared=True)),
    ("not a weighted uvu or uvw path", spec_text("s", "2x0e", "2x0e", "2x0e", mode="uvv")),
    ("not a weighted uvu or uvw path", spec_text("s", "2x0e", "0e", "2x0e+2x0e",
                                                  instructions=[(0, 0, 0, "uvw", True), (0, 0, 1, "uvu", False)])),
    ("both modes", spec_text("s", "2x0e", "0e", "2x0e+3x0e",
                             instructions=[(0, 0, 0, "uvu", True), (0, 0, 1, "uvw", True)])),
    ("not 1", spec_text("s", IN1, "2x0e+2x1o", OUT, mode="uvu")),
    ("not 1", spec_text("s", IN1, "2x0e+2x1o", OUT, mode="uvw")),
])
def test_ineligible_specs_get_no_fused_kernel(why, text):
    ir = _ir(text)
    assert why in fused_reason(ir) and fused_context(ir, {}, {}) is None
    files = assemble.render_files(ir, "")
    assert "backward_fused" not in files["pallas_kernels.py"] and "fused=" not in files["jax_ops.py"]


def test_pallas_fuse_bwd_0_keeps_the_three_kernels():
    ir = _ir(_text("s"))
    on = assemble.render_files(ir, "")
    off = assemble.render_files(ir, "", (("pallas_fuse_bwd", 0),))
    assert "backward_fused" in on["pallas_kernels.py"] and "fused=" in on["jax_ops.py"]
    assert "backward_fused" not in off["pallas_kernels.py"] and "fused=" not in off["jax_ops.py"]


def _operands(ir, batch, seed):
    x1, x2, w = inputs(ir, batch, seed=seed)
    g = np.random.default_rng(seed + 1).normal(size=(batch, ir.dim_out))
    return x1, x2, w, g


@pytest.mark.parametrize("key", [(False, "mul_ir"), (True, "mul_ir"), (True, "ir_mul"), "unordered",
                                 (True, "mul_ir", "factor"), (False, "mul_ir", "uvw"), (True, "ir_mul", "uvw")],
                         ids=["one_kernel", "split", "split_ir_mul", "unordered", "split_factored", "uvw_one_kernel",
                              "uvw_split_ir_mul"])
def test_fused_matches_the_oracle(pkgs, key):
    b = pkgs(key)
    n = len(b.ops._kernels.BWD_FUSED_KERNELS)
    assert n > 1 if key != "unordered" and key[0] else n == 1
    source = open(b.ops._kernels.__file__).read()
    if key == (True, "mul_ir", "factor"):
        assert "q_0 = " in source
    if "uvw" in key:  # one loop over the x1 channel per x1 block, its weight rows read in it; paths
        # reducing per output component (0e -> 0e) and per x1 component (0e x 1o -> 1o: G_i, T_i)
        assert "def _block_0(u, carry):" in source and {p.mode for p in b.ir.paths} == {"uvw"}
        assert "s_0 = jnp.sum(w * g_" in source and "t_0 = jnp.sum(w * G" in source
    x1, x2, w, g = _operands(b.ir, BATCH, seed=1)
    want = tensor_product_vjp_reference(b.ir, x1, x2, w, g)
    got = b.ops.tensor_product_vjp(*(jnp.asarray(a) for a in (x1, x2, w, g)), block_batch=BB)
    for name, a, c in zip(("grad_x1", "grad_x2", "grad_weights"), got, want):
        assert a.shape == c.shape, name
        assert rel_err(a, c) <= 1e-10, f"{name}: {rel_err(a, c):.3e}"


def test_unrolled_channel_loops_match_the_oracle(pkgs):
    """``pallas_unroll = 2``: every uvw kernel's channel loops take two steps per iteration
    (their reads first; a tail step after the loop for an odd multiplicity); the forward,
    the three backward kernels and the fused one still equal the float64 oracle."""
    b = pkgs((False, "mul_ir", "uvw", "unroll"))
    source = open(b.ops._kernels.__file__).read()
    assert "u__1 = 1 + ut * 2" in source and "u__0 = 2\n" in source  # the loop of 4 steps; the tail of 3
    _check_every_kernel(b, seed=4)


def _check_every_kernel(b, seed: int):
    """The forward, the fused backward and the three backward kernels of package ``b``
    against the float64 oracle, on ``BATCH`` rows in blocks of ``BB``."""
    from eqdsl.reference import tensor_product_reference

    x1, x2, w, g = _operands(b.ir, BATCH, seed=seed)
    k = b.ops._kernels
    args = [jnp.asarray(a) for a in (x1, x2, w, g)]
    assert rel_err(b.ops.tensor_product(*args[:3], block_batch=BB), tensor_product_reference(b.ir, x1, x2, w)) <= 1e-10
    want = tensor_product_vjp_reference(b.ir, x1, x2, w, g)
    got = b.ops.tensor_product_vjp(*args, block_batch=BB)
    pad = -(-BATCH // BB) * BB - BATCH  # the kernel functions take whole blocks of rows
    a1, a2, aw, ag = (jnp.pad(a, ((0, pad), (0, 0))) for a in args)
    three = (k.backward_x1(ag, a2, aw, block_batch=BB, interpret=True),
             k.backward_x2(a1, ag, aw, block_batch=BB, interpret=True),
             k.backward_w(a1, a2, ag, block_batch=BB, interpret=True))
    for name, a, c, t in zip(("grad_x1", "grad_x2", "grad_weights"), got, want, three):
        assert rel_err(a, c) <= 1e-10, name
        assert rel_err(t[:BATCH], c) <= 1e-10, name


def _pallas_names(jaxpr) -> list[str]:
    """Names of the pallas_calls of a (closed) jaxpr, nested jaxprs included."""
    names = []

    def walk(jp):
        for eqn in jp.eqns:
            if eqn.primitive.name == "pallas_call":
                names.append(str(eqn.params["name"]))
            for v in eqn.params.values():
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                        walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):
                        walk(sub)

    walk(jaxpr.jaxpr)
    return names


@pytest.mark.parametrize("key", [(True, "mul_ir"), (True, "ir_mul", "uvw")], ids=["uvu", "uvw"])
def test_grad_runs_the_fused_kernel(pkgs, key):
    """``jax.grad`` of the tensor product takes its three gradients from one fused
    launch per kernel (no backward_x1/x2/w kernel), and they match the oracle."""
    b = pkgs(key)
    x1, x2, w, c = (jnp.asarray(a) for a in _operands(b.ir, BATCH, seed=2))

    def loss(a, d, e):
        return jnp.sum(c * b.ops.tensor_product(a, d, e, block_batch=BB))

    grad = jax.grad(loss, argnums=(0, 1, 2))
    names = _pallas_names(jax.make_jaxpr(grad)(x1, x2, w))
    assert sum("bwd_fused" in n for n in names) == len(b.ops._kernels.BWD_FUSED_KERNELS), names
    assert not [n for n in names if "bwd_x1" in n or "bwd_x2" in n or "bwd_w" in n], names
    want = tensor_product_vjp_reference(b.ir, x1, x2, w, c)
    for a, o in zip(jax.jit(grad)(x1, x2, w), want):
        assert rel_err(a, o) <= 1e-10


def _e3nn_jax_tp(b):
    """The spec's product in e3nn-jax (legacy FunctionalTensorProduct, as test_jax_ops.test_matches_e3nn_jax)."""
    import e3nn_jax as e3j
    from e3nn_jax.legacy import FunctionalTensorProduct

    tp = FunctionalTensorProduct(b.meta.IRREPS_IN1, b.meta.IRREPS_IN2, b.meta.IRREPS_OUT,
                                 [tuple(i) for i in b.meta.INSTRUCTIONS], irrep_normalization="component",
                                 path_normalization="element", gradient_normalization="path")

    def one(a, d, w):
        ws = [w[p.weight_offset:p.weight_offset + p.weight_numel].reshape(p.path_shape) for p in b.ir.paths]
        return tp.left_right(ws, e3j.IrrepsArray(b.meta.IRREPS_IN1, a), e3j.IrrepsArray(b.meta.IRREPS_IN2, d)).array

    return jax.vmap(one)


@pytest.mark.parametrize("key", [(False, "mul_ir"), (True, "mul_ir"), (False, "mul_ir", "uvw")],
                         ids=["one_kernel", "split", "uvw"])
def test_force_training_second_order(pkgs, key):
    """grad over (W, x1) of <d, grad_x1 E>, E = <c, TP**2> (a force loss: the forward's VJP
    is the fused op, its VJP the sum of the three ops' rules) against e3nn-jax and dense
    einsums."""
    b = pkgs(key)
    x1, x2, w, c = (jnp.asarray(a) for a in _operands(b.ir, BATCH, seed=3))
    d = jnp.asarray(np.random.default_rng(5).normal(size=x1.shape))

    def chain(tp):
        def forces(a, e):
            return jax.grad(lambda a_: jnp.sum(c * tp(a_, x2, e) ** 2))(a)

        return jax.jit(jax.grad(lambda a, e: jnp.sum(d * forces(a, e)), argnums=(1, 0)))(x1, w)

    got = chain(lambda a, d_, e: b.ops.tensor_product(a, d_, e, block_batch=BB))
    e3j = chain(_e3nn_jax_tp(b))
    dense = chain(lambda a, d_, e: jnp_tensor_product(b.ir, a, d_, e))
    for a, e, f in zip(got, e3j, dense):
        assert rel_err(e, f) <= 1e-10  # the two references agree
        assert rel_err(a, e) <= 1e-10, f"{rel_err(a, e):.3e}"


def test_every_term_of_the_fused_ops_derivative(pkgs):
    """Gradients of all three first derivatives with respect to all four operands (each term
    of the fused op's VJP), through ``tensor_product_vjp``, against dense einsums."""
    b = pkgs((False, "mul_ir"))
    x1, x2, w, g = (jnp.asarray(a) for a in _operands(b.ir, 5, seed=6))
    rng = np.random.default_rng(7)
    ks = [jnp.asarray(rng.normal(size=a.shape)) for a in (x1, x2, w)]

    def second(vjp):
        def s(*a):
            return sum(jnp.vdot(k, t) for k, t in zip(ks, vjp(*a)))

        return jax.jit(jax.grad(s, argnums=(0, 1, 2, 3)))(x1, x2, w, g)

    def dense_vjp(a, d_, e, h):
        return jax.vjp(lambda *t: jnp_tensor_product(b.ir, *t), a, d_, e)[1](h)

    got = second(lambda a, d_, e, h: b.ops.tensor_product_vjp(a, d_, e, h, block_batch=BB))
    want = second(dense_vjp)
    for a, c in zip(got, want):
        assert rel_err(a, c) <= 1e-10


def test_unused_outputs_of_the_fused_op_cost_no_kernels(pkgs):
    """The VJP of ``dF/dx1`` alone (what a force loss differentiates) skips the terms of the
    symbolically zero cotangents of ``dF/dx2`` and ``dF/dW``: one kernel per remaining term."""
    b = pkgs((False, "mul_ir"))
    x1, x2, w, g = (jnp.asarray(a) for a in _operands(b.ir, 2 * BB, seed=8))
    k1 = jnp.asarray(np.random.default_rng(9).normal(size=x1.shape))
    op = b.ops.KERNEL_OPS.bwd

    def s(*a):
        return jnp.vdot(k1, op(*a, BB, True)[0])

    grad = jax.grad(s, argnums=(0, 1, 2, 3))
    names = _pallas_names(jax.make_jaxpr(grad)(x1, x2, w, g))
    kinds = sorted(n.split("_tp_")[1].rsplit("_kernel", 1)[0] for n in names)
    assert kinds == ["bwd_fused", "bwd_w", "bwd_x2", "fwd"], names
    got = jax.jit(grad)(x1, x2, w, g)
    dense = jax.grad(lambda a, c, e, h: jnp.vdot(k1, jax.vjp(lambda *t: jnp_tensor_product(b.ir, *t), a, c, e)[1](h)[0]),
                     argnums=(0, 1, 2, 3))(x1, x2, w, g)
    for a, c in zip(got, dense):
        assert rel_err(a, c) <= 1e-10


def test_pallas_factor_2_factors_the_backward_kernels_only():
    """pallas_factor = 2: each forward kernel as with 0 (one term per CG nonzero), each
    backward kernel and the fused backward as with 1 (factored, the q_j form)."""
    ir = _ir(_text("s"))
    ctx = {m: assemble.build_context(ir, "", (("pallas_factor", m),)) for m in (0, 1, 2)}

    def bodies(c, fwd):
        return [k["groups"] for k in c["kernels"] if k["kind"].startswith("fwd") == fwd]

    assert bodies(ctx[2], True) == bodies(ctx[0], True) != bodies(ctx[1], True)
    assert bodies(ctx[2], False) == bodies(ctx[1], False) != bodies(ctx[0], False)
    fused = {m: [k["groups"] for k in ctx[m]["fused"]["kernels"]] for m in (0, 1, 2)}
    assert fused[2] == fused[1] != fused[0]
    with pytest.raises(Exception, match="pallas_factor"):
        check_tuning(parse_spec(_text("s") + "[tensor_product.tuning]\npallas_factor = 3\n", "s.toml")[0])
