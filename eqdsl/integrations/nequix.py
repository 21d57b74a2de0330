"""Nequix (``nequix`` 0.4, JAX / Equinox): run each layer's edge convolution as one eqdsl op.

What a ``nequix.model.NequixConvolution`` computes between its two linears (its
``kernel=False`` branch)::

    m = e3nn.tensor_product(messages[senders], sh, filter_ir_out=tp_irreps)  # e3nn-jax
    m = m * radial_message                                  # one weight per output channel
    agg = e3nn.scatter_sum(m, dst=receivers, output_size=num_nodes)

``e3nn_jax.tensor_product`` regroups both inputs, forms every path ``(i1, i2, ir_out)``
with ``ir_out`` in the filter as a ``mul1 x ir_out`` block (``sh`` has one channel per
irrep), scales the Clebsch-Gordan coefficients (equal to e3nn's ``wigner_3j``) by
``sqrt(2 l_out + 1)`` under the default ``irrep_normalization = "component"`` and applies
no path normalization, then SORTS the blocks (``Irreps.sort()``, stable) and merges
equal neighbours. ``radial_message`` (one column per output channel) multiplies the
sorted blocks. That is a channelwise (``uvu``) product with per-edge weights whose
weights come path after path in sorted-output order.

Nequix has a seam for a fused kernel: with ``kernel=True`` its layer calls
``tp_conv.forward(x, sh, radial_message, receivers, senders)`` (OpenEquivariance's
convention: the sum over edges of the product into ``receivers``), expects the result
in the layer's unsorted ``tp_irreps`` order and sorts it itself (``layer.sort``). The
spec written here reproduces exactly that contract: ``irreps_out = tp_irreps`` in path
order, the ``uvu`` instructions listed in sorted order (so the weights line up with
``radial_message``), ``path_normalization = "none"`` and e3nn-jax's current
``irrep_normalization``. :func:`accelerate` rebuilds each layer with ``kernel=True`` and
a ``tp_conv`` that calls the generated ``jax_ops.conv``; the parameters and their
order are unchanged, so ``eqx.tree_serialise_leaves`` checkpoints load into either.

Not fused here: the radial MLP's last layer (``conv_radial``). Nequix's ``radial_mlp``
(``nequix.model.MLP``, ``use_bias=False``) does end in a bias-free linear layer (``x @
weights``, no normalization factor), so the generated ``conv_radial`` would apply. But the
layer's seam hands ``tp_conv.forward`` only ``jax.vmap(radial_mlp)(radial_basis)``, and
``tp_conv`` is a static field: the last layer's matrix, a parameter (a traced array under
``jit`` / ``grad``), can reach the op only by overriding ``NequixConvolution.__call__`` (a
copy of Nequix's layer code: linears, neighbour normalization, skip, norm, gate) or by
putting a traced array in a static field (which Equinox warns is a mistake). Neither is a
small, safe change, so every layer calls ``jax_ops.conv`` with the materialized weights.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from types import ModuleType

import e3nn_jax as e3nn
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from nequix.model import Nequix, NequixConvolution

from eqdsl.from_e3nn import DEFAULT_CG_CONVENTION, cg_convention_of
from eqdsl.loader import load, toml_table

__all__ = ["EqdslConv", "EqdslNequixConvolution", "accelerate", "spec_for"]


def _check_regrouped(irreps: e3nn.Irreps, what: str) -> None:
    # e3nn_jax.tensor_product regroups (sorts and merges) its inputs before pairing them,
    # while Nequix builds tp_irreps, the radial weights' order and its kernel seam from the
    # irreps as given. They describe the same product only for regrouped irreps; for the
    # others the layer's kernel branch would compute another function than its e3nn-jax
    # branch, so refuse rather than pick one.
    if e3nn.Irreps(irreps) != e3nn.Irreps(irreps).regroup():
        raise ValueError(
            f"Nequix {what} {irreps} are not sorted and merged ({e3nn.Irreps(irreps).regroup()}): "
            "e3nn_jax.tensor_product pairs the regrouped irreps, the layer's tp_irreps and weights follow "
            "the given ones; not supported (build the model with sorted, merged hidden_irreps)"
        )


def spec_for(layer: NequixConvolution, input_irreps: e3nn.Irreps, sh_irreps: e3nn.Irreps) -> str:
    """The conv spec (TOML text) of one Nequix layer's edge tensor product.

    Args:
        layer: a ``nequix.model.NequixConvolution`` (its path-order output is
            ``layer.tp_irreps``).
        input_irreps: the layer's input irreps as Nequix built it: ``f"{n_species}x0e"``
            for the first layer, the previous layer's ``output_irreps`` after that (the
            layer does not keep them: its linears store them regrouped).
        sh_irreps: the edge spherical harmonics irreps (``e3nn.s2_irreps(model.lmax)``).

    Returns:
        Spec text: ``conv = true``, float32 and float64, ``mul_ir`` layout, explicit
        ``uvu`` instructions in sorted-output order with ``i_out`` indexing
        ``tp_irreps``; package name ``nequix_<hash of the product>``, so equal layers
        share one generated package.

    Raises:
        ValueError: the layer's irreps are not regrouped (see the module docstring),
            the rebuilt paths do not give the layer's ``tp_irreps``, or e3nn-jax's
            ``irrep_normalization`` is one eqdsl does not know.
    """
    irreps_in1 = e3nn.Irreps(input_irreps)
    sh_irreps = e3nn.Irreps(sh_irreps)
    _check_regrouped(irreps_in1, "layer input irreps")
    _check_regrouped(sh_irreps, "spherical harmonics irreps")
    if any(mul != 1 for mul, _ in sh_irreps):
        raise ValueError(f"spherical harmonics irreps {sh_irreps} must have multiplicity 1 per irrep")
    # the paths exactly as NequixConvolution.__init__ and e3nn_jax.tensor_product form them
    out, paths = [], []
    for i, (mul, ir1) in enumerate(irreps_in1):
        for j, (_, ir2) in enumerate(sh_irreps):
            for ir_out in ir1 * ir2:
                if ir_out in layer.output_irreps:
                    paths.append((i, j, len(out)))
                    out.append((mul, ir_out))
    tp_irreps = e3nn.Irreps(out)
    if tp_irreps != layer.tp_irreps:
        raise ValueError(f"rebuilt paths give {tp_irreps}, the layer has tp_irreps {layer.tp_irreps}")
    inv = tp_irreps.sort().inv  # inv[k]: the path whose block is k-th after sorting
    norm = e3nn.config("irrep_normalization")
    if norm not in ("component", "norm", "none"):
        raise ValueError(f"e3nn_jax irrep_normalization {norm!r} is not supported")
    table = {
        "irreps_in1": str(irreps_in1),
        "irreps_in2": str(sh_irreps),
        "irreps_out": str(tp_irreps),
        "instructions": [[*paths[p], "uvu", True] for p in inv],
        "shared_weights": False,
        "irrep_normalization": norm,
        "path_normalization": "none",  # e3nn_jax.tensor_product has none
        "layout": "mul_ir",
        "conv": True,
        "dtypes": ["float32", "float64"],
    }
    convention = cg_convention_of(np.asarray(e3nn.clebsch_gordan(1, 2, 2)))
    if convention != DEFAULT_CG_CONVENTION:
        table["cg_convention"] = convention
    name = "nequix_" + hashlib.sha256(toml_table(table).encode()).hexdigest()[:12]
    return f"# Nequix layer edge product (e3nn-jax {e3nn.__version__}), by eqdsl.integrations.nequix\n" + toml_table(
        {"name": name, **table})


@functools.lru_cache(maxsize=None)
def _jax_ops(spec_text: str) -> ModuleType:
    # one generation and import per distinct spec and process (eqdsl.load caches on disk)
    return load(spec_text).jax_ops


class EqdslConv:
    """Nequix's ``tp_conv`` contract on a generated ``jax_ops.conv``.

    ``forward(x, sh, weights, receivers, senders)``: x ``(num_nodes, dim_in1)``, sh
    ``(num_edges, dim_sh)``, weights ``(num_edges, weight_numel)`` (``radial_message``),
    integer ``(num_edges,)`` indices; returns ``(num_nodes, tp_irreps.dim)``, for each
    node the sum over edges ``e`` with ``receivers[e] == node`` of the product of
    ``x[senders[e]]``, ``sh[e]`` and ``weights[e]``, in ``tp_irreps`` (path) order. The
    three float inputs are promoted to one dtype, as e3nn-jax's einsum would.

    A static field of an Equinox module: hashable, equal when the spec is.
    """

    def __init__(self, spec_text: str) -> None:
        self.spec_text = spec_text

    def __eq__(self, other) -> bool:
        return isinstance(other, EqdslConv) and other.spec_text == self.spec_text

    def __hash__(self) -> int:
        return hash(self.spec_text)

    def __repr__(self) -> str:
        return f"EqdslConv({self.spec_text.splitlines()[1]})"

    def forward(self, x, sh, weights, receivers, senders):
        dt = jnp.result_type(x, sh, weights)
        ops = _jax_ops(self.spec_text)
        return ops.conv(x.astype(dt), sh.astype(dt), weights.astype(dt), senders, receivers, x.shape[0])


class EqdslNequixConvolution(NequixConvolution):
    """A ``NequixConvolution`` whose edge product + segment sum is an eqdsl fused conv.

    Same fields, parameters and ``__call__`` as the layer it is built from, with
    ``kernel = True`` and ``tp_conv`` an :class:`EqdslConv`, so Nequix's own kernel
    branch runs it (``layer.sort`` then orders the result as the e3nn-jax branch does).
    """

    def __init__(self, layer: NequixConvolution, tp_conv: EqdslConv) -> None:
        # Equinox modules are frozen after __init__: copying every field here is how a
        # module with different static fields is made (eqx.tree_at cannot reach them)
        for f in dataclasses.fields(layer):
            setattr(self, f.name, getattr(layer, f.name))
        self.kernel = True
        self.tp_conv = tp_conv


def accelerate(model: Nequix) -> Nequix:
    """A copy of ``model`` whose every ``NequixConvolution`` runs its edge convolution in eqdsl.

    Each layer's ``tensor_product`` of gathered node features with the edge spherical
    harmonics, times the radial weights, summed into receivers, becomes one generated
    ``jax_ops.conv`` of :func:`spec_for` (same function; see the module docstring). The
    divide by ``sqrt(avg_n_neighbors)``, linears, skip, norm and gate are Nequix's own.
    Differentiable in reverse mode to any order (energy, forces, then a loss gradient);
    forward-mode JAX (``jax.jvp``) is not supported by the generated op.

    Args:
        model: a ``nequix.model.Nequix`` (float32 or float64 parameters).

    Returns:
        A new ``Nequix`` (``model`` is unchanged, Equinox modules being immutable) with
        the same parameter leaves in the same order. Generates (or reuses from eqdsl's
        cache) one package per distinct layer product.

    Raises:
        TypeError: ``model`` is not a ``Nequix``.
        ValueError: a layer already uses another kernel (OpenEquivariance), or its
            product cannot be reproduced (see :func:`spec_for`).
    """
    if not isinstance(model, Nequix):
        raise TypeError(f"accelerate expects a nequix.model.Nequix, got {type(model).__name__}")
    sh_irreps = e3nn.s2_irreps(model.lmax)
    layers = []
    input_irreps = e3nn.Irreps(f"{model.n_species}x0e")  # one-hot species, as Nequix.__init__
    for i, layer in enumerate(model.layers):
        if isinstance(layer, EqdslNequixConvolution):
            layers.append(layer)
        elif layer.kernel:
            raise ValueError(f"Nequix layer {i} already runs a kernel ({layer.tp_conv!r}); "
                             "build or load the model with kernel=False")
        else:
            layers.append(EqdslNequixConvolution(layer, EqdslConv(spec_for(layer, input_irreps, sh_irreps))))
        input_irreps = layer.output_irreps
    return eqx.tree_at(lambda m: m.layers, model, layers)
