"""NequIP (``nequip`` 0.19, PyTorch): run each interaction's edge convolution as one eqdsl op.

What NequIP computes there (``nequip.nn.InteractionBlock``, through its
``TensorProductScatter`` module, ``nequip/nn/_tp_scatter_base.py``)::

    edge_features = tp(x[edge_src], edge_attr, edge_weight)  # e3nn o3.TensorProduct
    out = scatter(edge_features, edge_dst, dim_size=x.size(0))  # sum over a node's in-edges

with ``edge_dst = edge_index[0]``, ``edge_src = edge_index[1]``, ``tp`` a channelwise
(``uvu``) ``o3.TensorProduct`` with per-edge weights (``edge_weight`` from the radial MLP),
default normalizations (``component`` / ``element``) and its output irreps sorted
(``Irreps.sort()``, not merged) with the instructions renumbered to match. The
``avg_num_neighbors`` normalization is applied to ``x`` before this module
(``AvgNumNeighborsNorm``), so it stays outside. That is exactly a generated
``torch_ops.conv(x, edge_attr, edge_weight, src=edge_src, dst=edge_dst, num_nodes=x.size(0))``
of the spec that ``eqdsl.spec_from_e3nn(tp, conv=True)`` writes from the module's own
``tp`` (its irreps and instructions in NequIP's sorted order, checked against the
path weights of ``tp``).

:func:`accelerate` swaps every ``TensorProductScatter`` for an
:class:`EqdslTensorProductScatter` (a subclass that keeps the original ``tp`` module, so
state dicts load with or without the swap, as NequIP's own OpenEquivariance modifier
does). :func:`modify` is a drop-in for ``nequip.model.modify`` that also accepts the
modifier name ``"enable_eqdsl"``, for NequIP configs (``_target_``). NequIP's own
modifier registry is not used: it lists classmethods of module classes already in the
model, so registering there would mean patching NequIP's ``TensorProductScatter`` class.

Tested in eager mode. TorchScript and AOTInductor packages (``nequip-compile``) cannot
carry the generated op (a Python ``torch.library`` custom op running Helion kernels).
On a CPU, set ``TRITON_INTERPRET=1`` before anything imports the generated ops.
"""

from __future__ import annotations

import functools
import hashlib
from types import ModuleType
from typing import Any

import torch
from nequip.nn import replace_submodules
from nequip.nn._tp_scatter_base import TensorProductScatter
from nequip.utils.dtype import torch_default_dtype

from eqdsl.from_e3nn import spec_from_e3nn
from eqdsl.loader import load

__all__ = ["EqdslTensorProductScatter", "MODIFIER_NAME", "accelerate", "modify", "spec_for"]

#: the modifier name that :func:`modify` handles itself (the rest go to NequIP's ``modify``)
MODIFIER_NAME = "enable_eqdsl"

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def spec_for(tp: torch.nn.Module, dtype: torch.dtype) -> str:
    """The conv spec (TOML text) of one NequIP edge tensor product.

    Args:
        tp: the ``e3nn.o3.TensorProduct`` of a ``TensorProductScatter`` (``module.tp``).
        dtype: ``torch.float32`` or ``torch.float64``: the one dtype generated.

    Returns:
        Spec text with ``conv = true``, irreps and instructions exactly as ``tp`` has them.
        Its package name is ``nequip_<hash>``, a hash of the product itself, so equal
        products share one generated package and different ones never share a custom-op
        namespace.

    Raises:
        ValueError: ``dtype`` is not float32/float64, or ``tp``'s path weights are not
            those of the component / element normalizations (from ``spec_from_e3nn``).
    """
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"NequIP model dtype {dtype} is not supported: eqdsl generates float32 and float64 only")
    kw = dict(conv=True, layout="mul_ir", irrep_normalization="component", path_normalization="element",
              dtypes=(_DTYPE_NAMES[dtype],))
    probe = spec_from_e3nn(tp, "nequip_tp", **kw)
    digest = hashlib.sha256(probe.encode()).hexdigest()[:12]
    return spec_from_e3nn(tp, f"nequip_{digest}", **kw)


@functools.lru_cache(maxsize=None)
def _torch_ops(spec_text: str) -> ModuleType:
    # one generation and import per distinct spec and process (eqdsl.load caches on disk)
    return load(spec_text).torch_ops


class EqdslTensorProductScatter(TensorProductScatter):
    """NequIP's ``TensorProductScatter`` as one fused eqdsl graph convolution.

    Same constructor arguments and ``forward`` as the base class. ``forward(x, edge_attr,
    edge_weight, edge_dst, edge_src)`` takes x ``(num_nodes, feature_irreps_in.dim)``,
    edge_attr ``(num_edges, irreps_edge_attr.dim)``, edge_weight ``(num_edges,
    tp.weight_numel)`` (each cast to the model dtype, as NequIP's OpenEquivariance module
    does for AMP) and int64 ``(num_edges,)`` indices; it returns ``(num_nodes,
    irreps_mid.dim)`` in e3nn's ``mul_ir`` layout: for each node, the sum over its
    in-edges of ``tp(x[edge_src], edge_attr, edge_weight)``.

    The spec text is kept (``eqdsl_spec``) rather than the generated module, so the
    module deep-copies and pickles; the ops are loaded on first use in each process.

    Raises:
        ValueError: from :func:`spec_for` (unsupported dtype or normalization).
    """

    def __init__(self, feature_irreps_in, irreps_edge_attr, irreps_mid, instructions) -> None:
        super().__init__(feature_irreps_in, irreps_edge_attr, irreps_mid, instructions)
        self.eqdsl_spec = spec_for(self.tp, self.model_dtype)

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        ops = _torch_ops(self.eqdsl_spec)
        dt = self.model_dtype
        return ops.conv(x.to(dt), edge_attr.to(dt), edge_weight.to(dt), edge_src, edge_dst, x.size(0))


def _replace(old: TensorProductScatter) -> EqdslTensorProductScatter:
    if isinstance(old, EqdslTensorProductScatter):
        return old
    with torch_default_dtype(old.model_dtype):
        new = EqdslTensorProductScatter(old.feature_irreps_in, old.irreps_edge_attr, old.irreps_mid, old.instructions)
    # keep the original e3nn module (its buffers): the state dict is the same with or
    # without the swap (NequIP issue 572, as its OpenEquivariance modifier does)
    new.tp = old.tp
    return new


def accelerate(model: torch.nn.Module) -> torch.nn.Module:
    """Run every NequIP edge tensor product + scatter of ``model`` as an eqdsl fused conv.

    Replaces, in place, each ``nequip.nn.TensorProductScatter`` submodule (one per
    ``InteractionBlock``) by an :class:`EqdslTensorProductScatter` computing the same
    function (see the module docstring); parameters, buffers and their names are
    unchanged. Generates (or reuses from eqdsl's cache) one package per distinct product.

    Args:
        model: any module containing NequIP interaction blocks (a ``GraphModel`` from a
            NequIP model builder, or a ``ModuleDict`` of them).

    Returns:
        ``model`` itself, modified.

    Raises:
        ValueError: ``model`` has no ``TensorProductScatter`` (nothing would be
            accelerated), or a product cannot be reproduced by a spec (see
            :func:`spec_for`).
    """
    found = [m for m in model.modules() if isinstance(m, TensorProductScatter)]
    if not found:
        raise ValueError("accelerate: the model has no nequip TensorProductScatter module (is it a NequIP model?)")
    return replace_submodules(model, TensorProductScatter, _replace)


def modify(model: Any, modifiers: list | dict) -> Any:
    """``nequip.model.modify`` that also knows the modifier ``"enable_eqdsl"`` (:func:`accelerate`).

    Same arguments and result as ``nequip.model.modify`` (a model, a ``ModuleDict`` or a
    model config dict with ``_target_``; a list of ``{"modifier": name, **kwargs}`` dicts,
    or a dict of such lists per sub-model). Modifiers are applied in the given order;
    ``enable_eqdsl`` takes no arguments. Usable as a config ``_target_``::

        model:
          _target_: eqdsl.integrations.nequip.modify
          modifiers:
            - modifier: enable_eqdsl
          model:
            _target_: nequip.model.NequIPGNNModel
            ...

    Raises:
        TypeError: ``enable_eqdsl`` given keyword arguments.
        RuntimeError: an unknown modifier name (from NequIP).
    """
    from nequip.model import modify as nequip_modify

    per_model = isinstance(modifiers, dict)
    model = nequip_modify(model, {k: [] for k in modifiers} if per_model else [])  # builds a config dict

    def apply(sub: torch.nn.Module, cfgs: list) -> None:
        for cfg in cfgs:
            if cfg["modifier"] == MODIFIER_NAME:
                extra = set(cfg) - {"modifier"}
                if extra:
                    raise TypeError(f"modifier {MODIFIER_NAME!r} takes no arguments, got {sorted(extra)}")
                accelerate(sub)
            else:
                nequip_modify(sub, [cfg])

    if isinstance(model, torch.nn.ModuleDict):
        for name, sub in model.items():
            apply(sub, modifiers[name] if per_model else modifiers)
    else:
        apply(model, modifiers)
    return model
