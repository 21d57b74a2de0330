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

Radial weights fused (``accelerate(model, radial=True)``; off by default: on an H100 (2026-11-26, mace_large, 114,688 edges, float32) ``conv_radial``'s kernels took 4,460 us forward and 22,318 us forward+backward against 1,957 and 5,634 us for the matmul + ``conv`` (forming the weights on chip costs 2 E H weight_numel FLOPs on the FP32 units; BENCHMARKS.md, docs/conv_radial.md)): ``edge_weight`` is
``self.edge_mlp(edge_embedding)``, a ``ScalarMLPFunction`` built with ``bias=False``: a
``torch.nn.Sequential`` of ``ScalarLinearLayer`` s (``x @ (weight * alpha)``, alpha =
``gain / sqrt(fan_in)``) with SiLU between them, the last layer linear and bias-free. Each
``InteractionBlock`` whose ``edge_mlp`` is so (and whose ``forward`` feeds it only to
``tp_scatter``) gets an :class:`EqdslRadialTensorProductScatter`, and its ``edge_mlp``
becomes a :class:`RadialHiddenMLP` returning the hidden features ``(num_edges, H)`` (the
same ``mlp`` child: parameter names and state dicts do not change). The scatter calls the
generated ``conv_radial`` with them and the last layer's matrix ``(H, weight_numel)``,
formed outside the op by the layer itself (applied to the identity: ``weight * alpha``,
parametrizations included, differentiable), so the per-edge weights never reach memory.
Blocks whose MLP does not end that way (a bias, or ``DeepLinearMLP``: no nonlinearity, the
layers multiplied into one matrix) keep ``conv`` with materialized weights.

Tested in eager mode. TorchScript and AOTInductor packages (``nequip-compile``) cannot
carry the generated op (a Python ``torch.library`` custom op running Helion kernels).
On a CPU, set ``TRITON_INTERPRET=1`` before anything imports the generated ops.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from types import ModuleType
from typing import Any

import torch
from nequip.nn import replace_submodules
# the interaction block module is where NequIP uses (and imports) it: the class has no public export of its own
from nequip.nn.interaction_block import TensorProductScatter
from nequip.utils.dtype import torch_default_dtype

from eqdsl.from_e3nn import spec_from_e3nn
from eqdsl.loader import load

__all__ = ["EqdslRadialTensorProductScatter", "EqdslTensorProductScatter", "MODIFIER_NAME", "RadialHiddenMLP",
           "accelerate", "modify", "spec_for"]

#: the modifier name that :func:`modify` handles itself (the rest go to NequIP's ``modify``)
MODIFIER_NAME = "enable_eqdsl"

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def spec_for(tp: torch.nn.Module, dtype: torch.dtype, radial_features: int | None = None) -> str:
    """The conv spec (TOML text) of one NequIP edge tensor product.

    Args:
        tp: the ``e3nn.o3.TensorProduct`` of a ``TensorProductScatter`` (``module.tp``).
        dtype: ``torch.float32`` or ``torch.float64``: the one dtype generated.
        radial_features: H of ``conv_radial`` (the radial MLP's last hidden width), or
            ``None``: no ``conv_radial``.

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
    if radial_features is not None:
        kw["radial_features"] = int(radial_features)
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


class RadialHiddenMLP(torch.nn.Module):
    """A NequIP ``ScalarMLPFunction`` run but its last (bias-free, linear) layer.

    Holds the original's ``mlp`` (``torch.nn.Sequential``) under the same name, so the
    parameters and state dict are the original's. ``forward(x)`` ``(num_edges, in)`` ->
    ``(num_edges, H)``; :meth:`matrix` ``(H, out)``, so ``original(x) == forward(x) @
    matrix()``.
    """

    def __init__(self, mlp_function: torch.nn.Module):
        super().__init__()
        self.mlp = mlp_function.mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in list(self.mlp)[:-1]:
            x = layer(x)
        return x

    def matrix(self) -> torch.Tensor:
        """``(H, out)``: the last layer applied to the identity (``weight * alpha``, after
        any parametrization), differentiable with respect to its weight."""
        last = self.mlp[-1]
        w = last.weight
        return last(torch.eye(w.shape[0], dtype=w.dtype, device=w.device))


class EqdslRadialTensorProductScatter(EqdslTensorProductScatter):
    """:class:`EqdslTensorProductScatter` whose ``edge_weight`` argument is the radial MLP's
    hidden features ``(num_edges, H)`` (what the block's :class:`RadialHiddenMLP` returns):
    ``forward`` is ``conv_radial(x, edge_attr, edge_weight, radial.matrix(), edge_src,
    edge_dst, num_nodes)``, equal to the base class's forward given ``edge_weight @
    radial.matrix()``. ``radial`` is the block's ``edge_mlp``, referenced, not registered.
    """

    def __init__(self, feature_irreps_in, irreps_edge_attr, irreps_mid, instructions, radial_features: int) -> None:
        TensorProductScatter.__init__(self, feature_irreps_in, irreps_edge_attr, irreps_mid, instructions)
        self.eqdsl_spec = spec_for(self.tp, self.model_dtype, radial_features)

    def set_radial(self, radial: RadialHiddenMLP) -> None:
        self.__dict__["_radial"] = radial  # a plain attribute: no second registration of its parameters

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        ops = _torch_ops(self.eqdsl_spec)
        dt = self.model_dtype
        return ops.conv_radial(x.to(dt), edge_attr.to(dt), edge_weight.to(dt), self._radial.matrix().to(dt),
                               edge_src, edge_dst, x.size(0))


# the only statement of InteractionBlock.forward (nequip 0.19.1) that may use edge_mlp for the
# radial fusion to hold: its output is tp_scatter's edge_weight argument
_EDGE_MLP_USE = re.compile(r"^edge_weight=self\.edge_mlp\([\w\[\]\.]*\),$")


def _radial_hidden_width(block) -> int | None:
    """H if ``block.edge_mlp`` ends in a bias-free linear ``ScalarLinearLayer`` after a
    nonlinearity-separated stack this module can split, and the block's forward passes its
    output only to ``tp_scatter``; else ``None``."""
    from nequip.nn.mlp import ScalarLinearLayer, ScalarMLPFunction

    mlp = getattr(block, "edge_mlp", None)
    if type(mlp) is not ScalarMLPFunction or not isinstance(getattr(mlp, "mlp", None), torch.nn.Sequential):
        return None  # DeepLinearMLP (no nonlinearity) or something else
    last = mlp.mlp[-1]
    if not isinstance(last, ScalarLinearLayer) or last.bias is not None:
        return None
    try:
        lines = [ln.strip() for ln in inspect.getsource(type(block).forward).splitlines()]
    except (OSError, TypeError):
        return None
    uses = [ln for ln in lines if "edge_mlp" in ln and not ln.startswith("#")]
    if len(uses) != 1 or not _EDGE_MLP_USE.match(uses[0]):
        return None
    return int(last.in_features)


def _replace_radial(block) -> None:
    old = block.tp_scatter
    width = _radial_hidden_width(block)
    if width is None or isinstance(old, EqdslTensorProductScatter):
        return
    with torch_default_dtype(old.model_dtype):
        new = EqdslRadialTensorProductScatter(old.feature_irreps_in, old.irreps_edge_attr, old.irreps_mid,
                                              old.instructions, width)
    new.tp = old.tp  # as _replace: the state dict is unchanged
    block.edge_mlp = RadialHiddenMLP(block.edge_mlp)
    new.set_radial(block.edge_mlp)
    block.tp_scatter = new


def _replace(old: TensorProductScatter) -> EqdslTensorProductScatter:
    if isinstance(old, EqdslTensorProductScatter):
        return old
    with torch_default_dtype(old.model_dtype):
        new = EqdslTensorProductScatter(old.feature_irreps_in, old.irreps_edge_attr, old.irreps_mid, old.instructions)
    # keep the original e3nn module (its buffers): the state dict is the same with or
    # without the swap (NequIP issue 572, as its OpenEquivariance modifier does)
    new.tp = old.tp
    return new


def accelerate(model: torch.nn.Module, *, radial: bool = False) -> torch.nn.Module:
    """Run every NequIP edge tensor product + scatter of ``model`` as an eqdsl fused conv.

    Replaces, in place, each ``nequip.nn.TensorProductScatter`` submodule (one per
    ``InteractionBlock``) by an :class:`EqdslTensorProductScatter` computing the same
    function (see the module docstring); parameters, buffers and their names are
    unchanged. Generates (or reuses from eqdsl's cache) one package per distinct product.

    Args:
        model: any module containing NequIP interaction blocks (a ``GraphModel`` from a
            NequIP model builder, or a ``ModuleDict`` of them).
        radial: fuse each block's radial MLP's last layer into the conv (an
            :class:`EqdslRadialTensorProductScatter` calling ``conv_radial``) where it is
            bias-free and linear (module docstring); other blocks get ``conv``.
            ``False`` (default, the faster today: module docstring): ``conv`` everywhere.

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
    if radial:
        from nequip.nn import InteractionBlock

        for block in [m for m in model.modules() if isinstance(m, InteractionBlock)]:
            _replace_radial(block)
    return replace_submodules(model, TensorProductScatter, _replace)  # the rest: conv


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
