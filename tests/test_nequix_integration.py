"""Nequix 0.4 with its edge convolutions run by eqdsl (``eqdsl.integrations.nequix``).

A tiny ``nequix.model.Nequix`` (two species, lmax 1, three layers: the middle one's
path-order output ``4x0e+4x1o+3x1o+3x0e`` is reordered by the sort, the case a spec in
path order would get wrong) with random float64 weights, and its ``accelerate``d copy,
on a rattled periodic rock-salt cell padded as Nequix's calculator pads graphs: the same
energy, forces, stress and gradient of a force/stress loss with respect to every
parameter leaf, to 1e-10 relative, through Nequix's own jitted ``__call__``.

``import nequix`` sets JAX's default matmul precision and the test turns on 64-bit
floats: both are put back afterwards (other test files may share the process).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from tolerances import REL_TOL

jax = pytest.importorskip("jax")
jnp = jax.numpy

TOL = REL_TOL["float64"]  # the models in float64 (tests/tolerances.py)
CUTOFF = 3.0


@pytest.fixture(scope="module", autouse=True)
def _cheap_interpret_compiles():
    """On the CPU, XLA compiling the interpret-mode kernels (and the two models' gradients)
    dominates the time: most XLA optimizations off while this module runs (as in
    test_jax_grads; the same ops, unfused, for both models). A GPU keeps them."""
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", jax.default_backend() == "cpu")
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture(scope="module")
def x64():
    old = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
    import nequix  # noqa: F401  (sets jax_default_matmul_precision = "highest" on import)

    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old[0])
        jax.config.update("jax_default_matmul_precision", old[1])


def _model(hidden_irreps: str = "4x0e+3x1o"):
    from nequix.model import Nequix

    return Nequix(jax.random.key(0), n_species=2, lmax=1, cutoff=CUTOFF, hidden_irreps=hidden_irreps, n_layers=3,
                  radial_basis_size=4, radial_mlp_size=4, radial_mlp_layers=1, avg_n_neighbors=5.0)


def _graph():
    import ase.build
    import jraph
    from nequix.data import dict_to_graphstuple, preprocess_graph

    atoms = ase.build.bulk("NaCl", "rocksalt", a=4.0)
    atoms.rattle(0.1, seed=1)
    g = preprocess_graph(atoms, {11: 0, 17: 1}, CUTOFF, False)
    for k in ("positions", "shifts", "cell"):
        g[k] = g[k].astype(np.float64)
    n_edge = int(g["n_edge"][0])
    # a padding graph, as nequix.calculator does (Nequix masks the last graph's nodes as padding)
    return jraph.pad_with_graphs(dict_to_graphstuple(g), n_node=len(atoms) + 2, n_edge=n_edge + 4, n_graph=2)


def _loss(model, graph):
    energy, forces, stress = model(graph)
    f_ref = jnp.linspace(-1.0, 1.0, forces.size).reshape(forces.shape)
    return jnp.mean((forces - f_ref) ** 2) + jnp.sum(energy**2) + jnp.sum(stress**2), (energy, forces, stress)


def _run(model, graph):
    import equinox as eqx

    (_, out), grads = eqx.filter_jit(eqx.filter_value_and_grad(_loss, has_aux=True))(model, graph)
    return out, jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_array))


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def test_energy_forces_stress_and_loss_gradient_match_nequix(x64):
    import equinox as eqx

    from eqdsl.integrations.nequix import EqdslNequixConvolution, accelerate

    model = _model()
    assert str(model.layers[1].tp_irreps) != str(model.layers[1].sort.irreps_sorted)  # the sort matters here
    fast = accelerate(model)
    assert all(isinstance(layer, EqdslNequixConvolution) and layer.kernel for layer in fast.layers)
    assert not any(layer.kernel for layer in model.layers)  # the original is left alone
    leaves0 = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))
    leaves1 = jax.tree_util.tree_leaves(eqx.filter(fast, eqx.is_array))
    assert len(leaves0) == len(leaves1) and all(a is b for a, b in zip(leaves0, leaves1))

    graph = _graph()
    (e0, f0, s0), g0 = _run(model, graph)
    (e1, f1, s1), g1 = _run(fast, graph)
    assert e0.dtype == jnp.float64
    assert float(jnp.max(jnp.abs(f0))) > 1e-3
    for a, b in ((e1, e0), (f1, f0), (s1, s0)):
        assert _rel(a, b) <= TOL
    assert len(g1) == len(g0) == len(leaves0)
    # every parameter has a gradient except atom_energies (behind stop_gradient in Nequix)
    zero = [i for i, b in enumerate(g0) if not np.any(np.asarray(b))]
    assert zero == [0] and leaves0[0] is model.atom_energies and not np.any(np.asarray(g1[0]))
    for i, (a, b) in enumerate(zip(g1[1:], g0[1:]), 1):
        assert _rel(a, b) <= TOL, i


def test_checkpoints_load_either_way(x64):
    import equinox as eqx

    from eqdsl.integrations.nequix import accelerate

    model, fast = _model(), accelerate(_model())
    trained = jax.tree_util.tree_map(lambda x: x + 1.0 if eqx.is_inexact_array(x) else x, model)
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, trained)
    buf.seek(0)
    restored = eqx.tree_deserialise_leaves(buf, fast)
    for a, b in zip(jax.tree_util.tree_leaves(eqx.filter(restored, eqx.is_array)),
                    jax.tree_util.tree_leaves(eqx.filter(trained, eqx.is_array))):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_refuses_what_no_spec_reproduces(x64):
    from eqdsl.integrations.nequix import accelerate

    # e3nn_jax.tensor_product regroups "3x1o+4x0e" to "4x0e+3x1o" before pairing, Nequix's
    # instructions index the irreps as given: no fixed instruction list matches both
    with pytest.raises(ValueError, match="not sorted and merged"):
        accelerate(_model("3x1o+4x0e"))
    with pytest.raises(TypeError, match="expects a nequix.model.Nequix"):
        accelerate(_model().layers[0])
