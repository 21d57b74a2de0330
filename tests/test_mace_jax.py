"""A MACE model's two hot ops in JAX: the packages ``eqdsl.integrations.mace`` generates for a
mace-torch 0.3.16 ``ScaleShiftMACE`` (its interactions' ``conv_tp``, its products' symmetric
contractions) run through their JAX frontends (Pallas kernels, interpreted on the CPU) on the
tensors the torch model feeds those modules, and agree with the model's own e3nn / mace modules
in float64: outputs, first derivatives with respect to every operand (``jax.vjp`` against torch
autograd of the original module), and, for the symmetric contraction, the second derivative a
force loss takes (the gradient of ``<d out/d x . g, v>`` with respect to ``x`` and the weights).

There is no JAX MACE on the package index, so the model around the ops is the torch one: this is
what a port of MACE to JAX (mace-jax) would call, checked on a real model's operands and
parameters. The model is the tiny one of ``test_mace_products.py`` (CI time is interpreted-kernel
compile time).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mace", reason="mace-torch: pip install --no-deps mace-torch==0.3.16 (docs/models.md)")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from mace_tiny import tiny_batch, tiny_mace  # noqa: E402
from eqdsl.integrations.mace import MACEConvTP, MACESymmetricContraction  # noqa: E402
from eqdsl.symmetric import weights_from_mace  # noqa: E402

REL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def float64():
    old_torch, old_jax = torch.get_default_dtype(), jax.config.jax_enable_x64
    torch.set_default_dtype(torch.float64)
    jax.config.update("jax_enable_x64", True)
    yield
    torch.set_default_dtype(old_torch)
    jax.config.update("jax_enable_x64", old_jax)


@pytest.fixture(scope="module")
def model(float64):
    return tiny_mace()


@pytest.fixture(scope="module")
def operands(model):
    """What one forward feeds each hot op: per interaction ``(node_feats after linear_up,
    edge_attrs, tp_weights, edge_index)``, per product ``(node_feats, node_attrs)``."""
    batch = tiny_batch()
    convs, products, handles = [], [], []
    for block in model.interactions:
        seen = {}
        handles.append(block.linear_up.register_forward_hook(lambda _m, _a, out, s=seen: s.update(h=out.detach())))
        handles.append(block.conv_tp.register_forward_pre_hook(
            lambda _m, args, s=seen: s.update(x1=args[0].detach(), sh=args[1].detach(), w=args[2].detach())))
        convs.append(seen)
    for block in model.products:
        handles.append(block.symmetric_contractions.register_forward_pre_hook(
            lambda _m, args: products.append(tuple(a.detach() for a in args))))
    try:
        with torch.no_grad():
            model(batch, compute_force=False)
    finally:
        for h in handles:
            h.remove()
    edge_index = batch["edge_index"]
    for s in convs:  # the block gathered its conv input from linear_up's output by edge_index[0]
        assert torch.equal(s["x1"], s["h"][edge_index[0]])
    return [(s["h"], s["sh"], s["w"], edge_index) for s in convs], products


def _rel(got, want) -> float:
    want = np.asarray(want.detach() if torch.is_tensor(want) else want)
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def _j(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(t.detach().numpy())


@pytest.mark.parametrize("i", [0, 1])
def test_conv_in_jax_equals_the_interaction(model, operands, tmp_path_factory, i):
    """The fused conv (``jax_ops.conv``) of interaction ``i``'s package against the block's e3nn
    ``conv_tp`` on the gathered rows plus mace's ``scatter_sum``; its VJP against autograd."""
    block = model.interactions[i]
    h, sh, w, edge_index = operands[0][i]
    pkg = MACEConvTP.from_e3nn(block.conv_tp, dtypes=["float64"], irrep_normalization="component",
                               path_normalization="element", cache_dir=tmp_path_factory.mktemp("c")).package
    src, dst, n = edge_index[0], edge_index[1], h.shape[0]
    leaves = [t.clone().requires_grad_() for t in (h, sh, w)]
    want = torch.zeros(n, block.conv_tp.irreps_out.dim).index_add(0, dst, block.conv_tp(leaves[0][src], *leaves[1:]))
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(i))
    want_grads = torch.autograd.grad(want, leaves, g)

    def f(h_, sh_, w_):
        return pkg.jax_ops.conv(h_, sh_, w_, _j(src).astype(jnp.int32), _j(dst).astype(jnp.int32), n)

    got, vjp = jax.vjp(f, _j(h), _j(sh), _j(w))
    assert np.abs(np.asarray(want.detach())).max() > 1e-3
    assert _rel(got, want) <= REL
    for name, a, b in zip(("node_feats", "edge_attrs", "tp_weights"), vjp(_j(g)), want_grads):
        assert _rel(a, b) <= REL, name


@pytest.fixture(scope="module")
def symmetric(model, operands, tmp_path_factory):
    """Per product block: (the mace module, its eqdsl module, the JAX op on mace's operands)."""
    out = []
    for i, block in enumerate(model.products):
        sc = block.symmetric_contractions
        new = MACESymmetricContraction(sc, dtypes=("float64",), cache_dir=tmp_path_factory.mktemp("s"))
        pkg, (mul, dim_in) = new.package, operands[1][i][0].shape[1:]
        out_dims, layout = new.out_dims, new._layout

        def op(x, w, elem, *, _pkg=pkg, _mul=mul, _dim=dim_in, _out=out_dims):
            """mace's (N, mul, dim_in) node features -> mace's mul_ir rows, as MACESymmetricContraction
            does in torch: the op runs on ir_mul rows."""
            rows = jnp.swapaxes(x, 1, 2).reshape(x.shape[0], _dim * _mul)
            y = _pkg.jax_ops.symmetric_contraction(rows, w, elem)
            pieces, col = [], 0
            for d in _out:
                pieces.append(jnp.swapaxes(y[:, col:col + d * _mul].reshape(-1, d, _mul), 1, 2).reshape(-1, _mul * d))
                col += d * _mul
            return jnp.concatenate(pieces, axis=1)

        out.append((sc, layout, op))
    return out


def _weight_blocks(sc):
    return [(c.weights_max, list(c.weights)) for c in sc.contractions]


@pytest.mark.parametrize("i", [0, 1])
def test_symmetric_contraction_in_jax_equals_the_product(symmetric, operands, i):
    """``jax_ops.symmetric_contraction`` with the weights ``weights_from_mace`` reads off mace's
    parameters, against mace's ``SymmetricContraction``: output; VJP in the node features and
    weights; the force loss's second derivative."""
    sc, layout, op = symmetric[i]
    x, attrs = operands[1][i]
    elem = _j(attrs.argmax(dim=1)).astype(jnp.int32)
    params = [p for blk in _weight_blocks(sc) for p in [blk[0], *blk[1]]]
    w = _j(weights_from_mace(layout, _weight_blocks(sc)))
    xt = x.clone().requires_grad_()
    want = sc(xt, attrs)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(10 + i))
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(20 + i))

    got, vjp = jax.vjp(lambda a, b: op(a, b, elem), _j(x), w)
    assert np.abs(np.asarray(want.detach())).max() > 1e-3
    assert _rel(got, want) <= REL
    gx, gw = vjp(_j(g))
    tx, *tparams = torch.autograd.grad(want, [xt, *params], g, create_graph=True)
    assert _rel(gx, tx) <= REL
    assert _rel(gw, weights_from_mace(layout, _regroup(sc, tparams))) <= REL

    # force loss: d/d(x, W) of <dE/dx, v> with E = <out, g>
    def inner(a, b):
        return jnp.vdot(jax.vjp(lambda a_, b_: op(a_, b_, elem), a, b)[1](_j(g))[0], _j(v))

    hx, hw = jax.grad(inner, argnums=(0, 1))(_j(x), w)
    sx, *sparams = torch.autograd.grad((tx * v).sum(), [xt, *params])
    assert _rel(hx, sx) <= REL
    assert _rel(hw, weights_from_mace(layout, _regroup(sc, sparams))) <= REL


def _regroup(sc, flat):
    """Per-parameter tensors in ``_weight_blocks`` order back into its nested blocks."""
    out, it = [], iter(flat)
    for blk in _weight_blocks(sc):
        out.append((next(it), [next(it) for _ in blk[1]]))
    return out
