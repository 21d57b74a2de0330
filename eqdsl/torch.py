"""``torch.nn.Module`` wrappers of generated packages, with e3nn's interface.

``TensorProduct`` calls a package's ``torch_ops.tensor_product`` with the call signature
of ``e3nn.o3.TensorProduct`` (``forward(x1, x2, weight=None)``, leading batch dimensions
broadcast), optional internal weights (an ``nn.Parameter`` drawn from the standard
normal, as e3nn initializes them) and e3nn's metadata (``irreps_in1``, ``irreps_in2``,
``irreps_out``, ``instructions`` with the normalized path weights, ``weight_numel``,
``shared_weights``, ``internal_weights``). ``Conv`` does the same for the fused graph
convolution ``torch_ops.conv`` of a ``conv = true`` spec.

``TensorProduct.from_e3nn(tp)`` / ``Conv.from_e3nn(tp)`` build the spec of an e3nn
module (``eqdsl.spec_from_e3nn``), generate and load it (``eqdsl.load``) and copy tp's
internal weights, if any.

A module keeps the spec text of its package (``spec_text``), so ``copy.deepcopy`` and
``torch.save`` / ``torch.load`` of a whole model work: a process that has not loaded the
package yet loads it again from that text (``eqdsl.load``). TorchScript is not supported
(the generated ops are ``torch.library`` custom ops behind Python wrappers); use
``torch.compile`` or ``make_fx`` (README "Training on forces").
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import torch

from .instructions import Instruction as _Ins
from .instructions import path_shape as _path_shape
from .irreps import Irreps
from .loader import load

__all__ = ["TensorProduct", "Conv", "Instruction"]


class Instruction(NamedTuple):
    """One path, as ``e3nn.o3.TensorProduct.instructions``: ``path_weight`` is the final
    (normalized) path weight, ``path_shape`` its weight block's shape."""

    i_in1: int
    i_in2: int
    i_out: int
    connection_mode: str
    has_weight: bool
    path_weight: float
    path_shape: tuple


def _package(spec_or_module, name: str | None, cache_dir) -> ModuleType:
    if isinstance(spec_or_module, ModuleType):
        if not hasattr(spec_or_module, "WEIGHT_NUMEL"):
            raise TypeError(f"{spec_or_module.__name__} is not a generated eqdsl package (no WEIGHT_NUMEL)")
        return spec_or_module
    return load(spec_or_module, name=name, cache_dir=cache_dir)


class _Base(torch.nn.Module):
    _needs_conv = False

    def __init__(self, spec_or_module, *, internal_weights: bool | None = None, name: str | None = None,
                 cache_dir=None):
        super().__init__()
        pkg = _package(spec_or_module, name, cache_dir)
        if self._needs_conv and not pkg.CONV:
            raise ValueError(f"{type(self).__name__}: the spec of {pkg.__name__} has no conv = true")
        self._package_name = pkg.__name__
        spec_file = getattr(pkg, "SPEC_FILE", None)
        self.spec_text = Path(spec_file).read_text(encoding="utf-8") if spec_file else None
        self._spec_name = _table_name(pkg)
        self.irreps_in1 = Irreps(pkg.IRREPS_IN1)
        self.irreps_in2 = Irreps(pkg.IRREPS_IN2)
        self.irreps_out = Irreps(pkg.IRREPS_OUT)
        self.instructions = [
            Instruction(i1, i2, io, mode, hw, pw, _path_shape(_Ins(i1, i2, io, mode, hw), self.irreps_in1,
                                                              self.irreps_in2, self.irreps_out))
            for (i1, i2, io, mode, hw, _), pw in zip(pkg.INSTRUCTIONS, pkg.PATH_WEIGHTS)
        ]
        self.weight_numel = int(pkg.WEIGHT_NUMEL)
        self.shared_weights = bool(pkg.SHARED_WEIGHTS)
        self.layout = pkg.LAYOUT
        if internal_weights is None:  # e3nn's default
            internal_weights = self.shared_weights and any(i.has_weight for i in self.instructions)
        if internal_weights and not self.shared_weights:
            raise ValueError(f"{type(self).__name__}: internal weights need shared weights "
                             f"(the spec of {pkg.__name__} has shared_weights = false)")
        self.internal_weights = bool(internal_weights)
        if self.internal_weights and self.weight_numel > 0:
            self.weight = torch.nn.Parameter(torch.randn(self.weight_numel))
        else:
            self.register_parameter("weight", None)

    @property
    def package(self) -> ModuleType:
        """The generated package (loaded again from ``spec_text`` in a new process)."""
        pkg = sys.modules.get(self._package_name)
        if pkg is None:
            if self.spec_text is None:
                pkg = importlib.import_module(self._package_name)
            else:
                pkg = load(self.spec_text, name=self._spec_name)
                self._package_name = pkg.__name__
        return pkg

    def _weights(self, weight, like: torch.Tensor) -> torch.Tensor:
        if weight is None:
            if self.weight_numel > 0 and not self.internal_weights:
                raise ValueError(f"{type(self).__name__}: weights must be given (no internal weights)")
            if self.weight is not None:
                return self.weight
            return like.new_zeros((0,))
        return weight

    def extra_repr(self) -> str:
        return (f"{self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} | {len(self.instructions)} paths | "
                f"{self.weight_numel} weights, package {self._package_name}")

    @classmethod
    def from_e3nn(cls, tp, *, name: str | None = None, cache_dir=None, **options):
        """A module computing what the ``e3nn.o3.TensorProduct`` ``tp`` computes.

        ``options`` go to ``eqdsl.spec_from_e3nn`` (``irrep_normalization``,
        ``path_normalization``: what tp was built with; ``layout``, ``dtypes``, spec
        keys). ``name`` defaults to ``e3nn_<hash of the spec>``, unique per spec, since a
        package's torch ops are registered under its name. tp's internal weights, if
        any, are copied (same dtype and device). Raises as ``spec_from_e3nn``.
        """
        from .from_e3nn import spec_from_e3nn

        if cls._needs_conv:
            options["conv"] = True
        if name is None:
            digest = hashlib.sha256(spec_from_e3nn(tp, "e3nn", **options).encode()).hexdigest()
            name = f"e3nn_{digest[:16]}"
        module = cls(load(spec_from_e3nn(tp, name, **options), cache_dir=cache_dir),
                     internal_weights=bool(tp.internal_weights))
        if module.weight is not None:
            module.weight = torch.nn.Parameter(tp.weight.detach().clone())
        return module


def _table_name(pkg: ModuleType) -> str:
    # eqdsl.load names the module eqdsl_<key>_<name>; the directory is the table's name
    return Path(pkg.__file__).parent.name


def _flat(t: torch.Tensor, lead: tuple, dim: int) -> torch.Tensor:
    return t.expand(*lead, dim).reshape(-1, dim)


class TensorProduct(_Base):
    """A generated tensor product as an ``nn.Module`` with e3nn's interface.

    Args:
        spec_or_module: a generated package (``eqdsl.load(...)`` or an imported
            ``DIR/<name>``), or anything ``eqdsl.load`` takes (spec text, path,
            ``TensorProductSpec``).
        internal_weights: keep the weights as a parameter ``weight`` ``(weight_numel,)``,
            standard normal (e3nn's init); default as e3nn: if the weights are shared and
            some path has weights. Needs ``shared_weights = true``.
        name: the table, for a spec with several; cache_dir: as ``eqdsl.load``.

    Raises:
        ValueError: internal weights with per-row weights; TypeError: no generated package.
    """

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``TP(x1, x2, weight)``, as ``e3nn.o3.TensorProduct.forward``.

        Args:
            x1: ``(..., irreps_in1.dim)``; x2: ``(..., irreps_in2.dim)``, in the spec's
                layout (e3nn's ``mul_ir`` unless the spec says ``ir_mul``).
            weight: ``(weight_numel,)`` if shared, else ``(..., weight_numel)``;
                ``None`` takes the internal weights. Leading dimensions broadcast.

        Returns:
            ``(..., irreps_out.dim)``, dtype of the inputs (one of the spec's dtypes).

        Raises:
            ValueError: no weights given and none internal; bad shapes; TypeError: dtypes
                (from the generated op, which names the argument).
        """
        w = self._weights(weight, x1)
        d1, d2 = self.irreps_in1.dim, self.irreps_in2.dim
        shapes = [x1.shape[:-1], x2.shape[:-1]] + ([] if self.shared_weights else [w.shape[:-1]])
        lead = torch.broadcast_shapes(*shapes)
        a, b = _flat(x1, lead, d1), _flat(x2, lead, d2)
        if not self.shared_weights:
            w = _flat(w, lead, self.weight_numel)
        out = self.package.torch_ops.tensor_product(a, b, w)
        return out.reshape(*lead, out.shape[-1])


class Conv(_Base):
    """A generated fused graph convolution (``conv = true``) as an ``nn.Module``.

    ``out[dst[e]] += TP(node_features[src[e]], edge_attr[e], weights[e])`` (or the mean
    over each node's in-edges with ``reduce = "mean"``), no per-edge message in memory.
    Arguments as ``TensorProduct``; raises ``ValueError`` for a spec without ``conv``.
    """

    _needs_conv = True

    def forward(self, node_features: torch.Tensor, edge_attr: torch.Tensor, weights: torch.Tensor | None,
                src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """The convolution, as the package's ``torch_ops.conv``.

        Args:
            node_features: ``(num_nodes, irreps_in1.dim)``; edge_attr:
                ``(num_edges, irreps_in2.dim)``; weights: ``(weight_numel,)`` if shared,
                else ``(num_edges, weight_numel)``, ``None`` for the internal weights;
                src, dst: integer ``(num_edges,)``; num_nodes: rows of the output.

        Returns:
            ``(num_nodes, irreps_out.dim)``.
        """
        w = self._weights(weights, node_features)
        return self.package.torch_ops.conv(node_features, edge_attr, w, src, dst, num_nodes)

    @property
    def radial_features(self) -> int | None:
        """H of the package's ``conv_radial`` (spec key ``radial_features``), or ``None``."""
        return getattr(self.package, "RADIAL_FEATURES", None)

    def conv_radial(self, node_features: torch.Tensor, edge_attr: torch.Tensor, radial_features: torch.Tensor,
                    radial_weight: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                    num_nodes: int) -> torch.Tensor:
        """The convolution with per-edge weights ``radial_features @ radial_weight``, formed
        on chip (the package's ``torch_ops.conv_radial``; no ``(num_edges, weight_numel)``
        tensor in memory).

        Args:
            node_features, edge_attr, src, dst, num_nodes: as ``forward``.
            radial_features: ``(num_edges, H)``, H = ``self.radial_features``: the radial
                MLP's last hidden features.
            radial_weight: ``(H, weight_numel)``, the MLP's last (bias-free, linear) layer
                as a matrix, columns in e3nn's weight order; same dtype as node_features.

        Returns:
            ``(num_nodes, irreps_out.dim)``, equal to ``forward(node_features, edge_attr,
            radial_features @ radial_weight, src, dst, num_nodes)``; differentiable to any
            order with respect to all four tensors.

        Raises:
            ValueError: the spec has no ``radial_features``; bad tensors (from the
                generated op, which names the argument).
        """
        if self.radial_features is None:
            raise ValueError(f"{type(self).__name__}.conv_radial: the spec of {self._package_name} has no "
                             "radial_features")
        return self.package.torch_ops.conv_radial(node_features, edge_attr, radial_features, radial_weight, src,
                                                  dst, num_nodes)
