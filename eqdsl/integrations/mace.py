"""MACE (mace-torch, PyTorch): run each interaction's edge tensor product as an eqdsl op.

What MACE computes there (``RealAgnostic*InteractionBlock.forward``, mace-torch 0.3.16,
``mace/modules/blocks.py``)::

    tp_weights = self.conv_tp_weights(edge_feats)       # radial MLP, per edge
    if hasattr(self, "conv_fusion"):
        message = self.conv_tp(node_feats, edge_attrs, tp_weights, edge_index)
    else:
        mji = self.conv_tp(node_feats[edge_index[0]], edge_attrs, tp_weights)
        message = scatter_sum(mji, index=edge_index[1], dim=0, dim_size=node_feats.shape[0])

``conv_tp`` is ``o3.TensorProduct(edge_irreps, sh_irreps, irreps_mid, instructions,
shared_weights=False, internal_weights=False)`` with e3nn's default normalizations
(``component`` / ``element``): channelwise (``uvu``) paths whose output irreps are sorted
(``Irreps.sort()``, not merged) with ``i_out`` renumbered (``tp_out_irreps_with_instructions``).
``edge_index[0]`` is the sender (``src``), ``edge_index[1]`` the receiver (``dst``).

``accelerate(model)`` uses that ``conv_fusion`` hook: each ``conv_tp`` becomes a
:class:`MACEConvTP` (an ``eqdsl.torch.Conv`` taking MACE's four arguments) running the
generated fused convolution ``conv(node_feats, edge_attrs, tp_weights, src, dst,
num_nodes)``, and ``conv_fusion`` is set on the block, so no per-edge message is written.
``conv=False`` replaces only the per-edge product (an ``eqdsl.torch.TensorProduct``) and
leaves MACE's gather and ``scatter_sum`` as they are. The specs come from each block's own
``conv_tp`` (``eqdsl.spec_from_e3nn``): its irreps and instructions in MACE's order, path
weights checked against the module's, and the Clebsch-Gordan signs of the e3nn installed
in this process, so the accelerated model computes what the original computes here
(e3nn 0.4.x, which mace-torch 0.3.16 pins, has the opposite sign for a few CG blocks:
the spec then says ``cg_convention = "e3nn-0.4"``).

Radial weights fused (``radial=True`` with ``conv=True``; off by default: on an H100 (2026-11-26, mace_large, 114,688 edges, float32) ``conv_radial``'s kernels took 4,460 us forward and 22,318 us forward+backward against 1,957 and 5,634 us for the matmul + ``conv`` (forming the weights on chip costs 2 E H weight_numel FLOPs on the FP32 units; BENCHMARKS.md, docs/conv_radial.md)): where a block's
``conv_tp_weights`` is e3nn's ``FullyConnectedNet`` (every block of mace-torch 0.3.16 but
``RealAgnosticResidualNonLinearInteractionBlock``), its last layer is a bias-free linear map
``x @ (weight / sqrt(h_in * var_in / var_out))`` (the last layer of e3nn's ``nn.FullyConnectedNet``, no activation).
``conv_tp_weights`` then becomes a :class:`RadialHidden` that runs the layers but the last
(the same ``layerK`` children, so parameter names and state dicts do not change) and returns
the hidden features ``(num_edges, H)``; MACE's ``tp_weights * cutoff`` scales them per edge,
which commutes with the linear layer. ``conv_tp`` becomes a :class:`MACERadialConvTP` calling
the generated ``conv_radial`` with those features and the last layer's effective matrix
``(H, weight_numel)``, formed outside the op by the layer itself (applied to the identity:
its normalization, whatever the e3nn version, differentiable, so gradients reach the
layer's ``weight``). The per-edge weights ``(num_edges, weight_numel)`` are never written.
Blocks whose MLP does not end that way (``RadialMLP``: ``torch.nn.Linear`` with a bias), or
whose ``forward`` uses ``tp_weights`` otherwise than ``conv_tp_weights(...)``, ``* cutoff``
and ``conv_tp(...)``, fall back to ``conv`` with materialized weights
(:func:`radial_blocks` lists which blocks use ``conv_radial``).

Product basis (``products=True``, the default): each ``EquivariantProductBasisBlock``'s
``symmetric_contractions`` (mace's ``SymmetricContraction``, MACE's eq. 10-11) becomes a
:class:`MACESymmetricContraction` running the generated symmetric contraction
(``eqdsl.symmetric.load``; ``docs/symmetric_contraction.md``, "MACE integration"). What the
block calls there (``symmetric_contractions(node_feats, node_attrs)``)::

    node_feats (num_nodes, mul, dim_in)   # reshape_irreps: irrep blocks side by side on the last axis
    node_attrs (num_nodes, num_elements)  # one-hot element encoding (ones (num_nodes, 1) if agnostic)
    -> (num_nodes, dim_out * mul)         # mul_ir: each output irrep's (mul, 2l+1) block row-major

mace's ``Contraction`` weights the elements by ``node_attrs`` (``einsum("...,ekc,be->bc...")``);
the kernel takes one integer element per node. The module takes ``elem =
node_attrs.argmax(-1)`` and, with ``check_one_hot`` (default), reads on the host whether
every row of ``node_attrs`` is exactly one-hot (entries 0 or 1, one 1), refusing any other
``node_attrs`` with a ``ValueError``: there the argmax would compute another function. The
check costs one device sync per product block and is skipped (like the op's own range check)
under ``torch.compile`` and CUDA-graph capture. Where ``node_attrs`` requires grad
(``AtomicDipolesMACE`` sets it; mace's calculator does under ``torch.compile``), its gradient
is exact too: ``d out[b] / d node_attrs[b, e]`` is the contraction with element ``e``'s
weights, computed (``num_elements`` forward calls) only when autograd actually needs it.
The spec is the module's own (``eqdsl.symmetric.spec_from_mace``: irreps, correlations,
``num_elements``, and the CG signs recognized from its ``U_matrix_<nu>`` buffers; a module
with cuEquivariance's basis, ``use_reduced_cg=True`` with cuequivariance installed, is
refused), generated in the ``ir_mul`` layout: ``node_feats.transpose(1, 2)`` flattened is
exactly its input rows (one copy, where MACE's ``mul_ir`` rows would need two). The weights
are the module's own parameters, re-flattened at every call (``weights_from_mace``: a
concatenation, differentiable), and the ``Contraction`` children stay registered under
``contractions``, so training updates mace's parameters and state dict keys do not change.

Eager PyTorch (and ``torch.compile`` / ``make_fx``) only: TorchScript (``torch.jit.script``,
MACE's LAMMPS export) cannot carry the generated ops. On a CPU, set ``TRITON_INTERPRET=1``
before the first call (the op says so otherwise).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import sys
from dataclasses import replace
from types import ModuleType, SimpleNamespace

import torch

from eqdsl.torch import Conv, TensorProduct

__all__ = ["accelerate", "MACEConvTP", "MACERadialConvTP", "MACESymmetricContraction", "RadialHidden", "packages",
           "radial_blocks"]


class MACEConvTP(Conv):
    """``eqdsl.torch.Conv`` with the call signature of MACE's fused ``conv_tp``.

    ``forward(node_feats, edge_attrs, tp_weights, edge_index)`` returns the per-node sum
    ``out[edge_index[1][e]] += TP(node_feats[edge_index[0][e]], edge_attrs[e],
    tp_weights[e])``, ``(num_nodes, irreps_out.dim)`` with ``num_nodes =
    node_feats.shape[0]``, in MACE's (sorted) output order.
    """

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                edge_index: torch.Tensor) -> torch.Tensor:
        return super().forward(node_feats, edge_attrs, tp_weights, edge_index[0], edge_index[1],
                               node_feats.shape[0])


class RadialHidden(torch.nn.Sequential):
    """An e3nn ``FullyConnectedNet``'s layers, run but the last: the hidden features.

    Holds the same layer modules under the same names (``layer0`` ... ``layerK``), so the
    parameters and state dict are the original net's. ``forward(x)`` ``(num_edges, in)`` ->
    ``(num_edges, H)``; :meth:`matrix` is the last layer's effective matrix ``(H, out)``,
    so ``net(x) == forward(x) @ matrix()``.
    """

    def __init__(self, net: torch.nn.Sequential):
        super().__init__()
        for name, layer in net.named_children():
            self.add_module(name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in list(self)[:-1]:  # (slicing a Sequential builds another of its class)
            x = layer(x)
        return x

    def matrix(self) -> torch.Tensor:
        """``(H, out)``: the last layer applied to the identity, i.e. its weight with the
        layer's own normalization, differentiable with respect to that weight."""
        return _applied_to_identity(self[-1])


def _applied_to_identity(layer: torch.nn.Module) -> torch.Tensor:
    w = next(layer.parameters())
    return layer(torch.eye(w.shape[0], dtype=w.dtype, device=w.device))


class MACERadialConvTP(MACEConvTP):
    """:class:`MACEConvTP` taking the radial MLP's hidden features instead of its output.

    ``forward(node_feats, edge_attrs, hidden, edge_index)``: ``hidden`` ``(num_edges, H)`` is
    what the block's :class:`RadialHidden` returned (times MACE's cutoff); the op is
    ``conv_radial(node_feats, edge_attrs, hidden, radial.matrix(), src, dst, num_nodes)``,
    equal to ``MACEConvTP.forward(node_feats, edge_attrs, hidden @ radial.matrix(),
    edge_index)``. ``radial`` is the block's ``conv_tp_weights``, referenced, not registered
    (its parameters stay under ``conv_tp_weights``).
    """

    def set_radial(self, radial: RadialHidden) -> None:
        self.__dict__["_radial"] = radial  # a plain attribute: no second registration of its parameters

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, hidden: torch.Tensor,
                edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv_radial(node_feats, edge_attrs, hidden, self._radial.matrix(), edge_index[0],
                                edge_index[1], node_feats.shape[0])


class MACESymmetricContraction(torch.nn.Module):
    """mace's ``SymmetricContraction`` as a generated eqdsl op, with its call signature.

    ``forward(node_feats, node_attrs)``: ``node_feats`` ``(num_nodes, mul, dim_in)`` (what
    ``EquivariantProductBasisBlock`` passes: ``reshape_irreps``'s output), ``node_attrs``
    ``(num_nodes, num_elements)`` one-hot, same float dtype; returns ``(num_nodes, dim_out *
    mul)`` in mace's ``mul_ir`` layout, what the original module returns (module docstring).
    Differentiable to any order in ``node_feats`` and the weights; in ``node_attrs`` to first
    order (module docstring).

    Args:
        module: the mace ``SymmetricContraction`` to replace. Its ``contractions`` (mace
            ``Contraction`` modules: ``weights_max``, ``weights``, the ``U_matrix_<nu>`` buffers)
            become this module's children under the same name, so parameter and buffer names
            are unchanged; only the weights are read (at every call), the buffers identify
            the spec.
        dtypes: ``"float32"`` / ``"float64"`` names to generate kernels for.
        check_one_hot: read ``node_attrs`` on the host to refuse rows that are not exactly
            one-hot (module docstring); settable later as the attribute of the same name.
        cache_dir: where the package is generated (``eqdsl.symmetric.load``).

    Raises:
        ValueError: buffers that are not mace's ``U_matrix_real`` in the e3nn basis (e.g.
            ``use_reduced_cg=True`` with cuequivariance installed), or irreps the spec kind
            cannot express (``eqdsl.symmetric.spec_from_mace``).
    """

    def __init__(self, module, *, dtypes=("float32", "float64"), check_one_hot: bool = True, cache_dir=None):
        super().__init__()
        from eqdsl.symmetric import load, spec_from_mace, symmetric_spec_to_toml

        spec = spec_from_mace(module, "mace_products", layout="ir_mul", dtypes=tuple(dtypes))
        # one package per distinct contraction: the name (the torch ops' namespace) is a hash of the spec
        digest = hashlib.sha256(symmetric_spec_to_toml(spec).encode()).hexdigest()[:12]
        spec = replace(spec, name=f"mace_products_{digest}")
        pkg = load(spec, cache_dir=cache_dir)
        self.spec_text = symmetric_spec_to_toml(spec)  # to load the package again (deepcopy, torch.load)
        self._package_name = pkg.__name__
        self.irreps_in, self.irreps_out = module.irreps_in, module.irreps_out
        self.contractions = module.contractions
        self.check_one_hot = bool(check_one_hot)
        self.mul, self.num_elements = int(pkg.MUL), int(pkg.NUM_ELEMENTS)
        self.dim_in = spec.irreps_in.dim // self.mul
        self.out_dims = tuple(mi.ir.dim for mi in spec.irreps_out)
        # what weights_from_mace reads of the IR (a plain namespace: copies and pickles cheaply)
        self._layout = SimpleNamespace(out_dims=self.out_dims, correlation=tuple(pkg.CORRELATION),
                                       num_params=tuple(pkg.NUM_PARAMS), num_elements=self.num_elements,
                                       mul=self.mul)
        self.weights()  # the parameters' shapes against the spec, once (ValueError)

    @property
    def package(self) -> ModuleType:
        """The generated package (loaded again from ``spec_text`` in a new process)."""
        pkg = sys.modules.get(self._package_name)
        if pkg is None:
            from eqdsl.symmetric import load

            pkg = load(self.spec_text)
            self._package_name = pkg.__name__
        return pkg

    def weights(self) -> torch.Tensor:
        """``(num_elements, weight_numel)``: the contractions' parameters in the op's layout
        (``weights_from_mace``; differentiable, one concatenation)."""
        from eqdsl.symmetric import mace_weight_blocks, weights_from_mace

        return weights_from_mace(self._layout, mace_weight_blocks(self))

    def contract(self, x_rows: torch.Tensor, weights: torch.Tensor, elem: torch.Tensor) -> torch.Tensor:
        """The op on ``ir_mul`` rows ``(num_nodes, dim_in * mul)`` with ``weights`` ``(num_elements,
        weight_numel)`` and ``elem`` ``(num_nodes,)``, its result converted to mace's ``mul_ir`` rows."""
        out = self.package.torch_symmetric.symmetric_contraction(x_rows, weights, elem, check=False)
        if all(d == 1 for d in self.out_dims):  # scalars only: both layouts are one
            return out
        n, mul, pieces, col = out.shape[0], self.mul, [], 0
        for d in self.out_dims:  # ir_mul block (d, mul) -> mul_ir block (mul, d): one copy
            block = out[:, col:col + d * mul]
            col += d * mul
            pieces.append(block if d == 1 else block.reshape(n, d, mul).transpose(1, 2).reshape(n, mul * d))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def forward(self, node_feats: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        name = type(self).__name__
        n = node_feats.shape[0]
        if node_feats.dim() != 3 or tuple(node_feats.shape[1:]) != (self.mul, self.dim_in):
            raise ValueError(f"{name}: node_feats must have shape (num_nodes, {self.mul}, {self.dim_in}) "
                             f"(mace's reshape_irreps), got {tuple(node_feats.shape)}")
        if node_attrs.dim() != 2 or tuple(node_attrs.shape) != (n, self.num_elements) \
                or not node_attrs.is_floating_point():
            raise ValueError(f"{name}: node_attrs must be a float (num_nodes, num_elements) = ({n}, "
                             f"{self.num_elements}) one-hot encoding, got {node_attrs.dtype} {tuple(node_attrs.shape)}")
        elem = node_attrs.detach().argmax(dim=1)
        if self.check_one_hot and not torch.compiler.is_compiling() and not (
                node_attrs.is_cuda and torch.cuda.is_current_stream_capturing()):
            a = node_attrs.detach()
            if not bool((((a == 0) | (a == 1)).all(dim=1) & (a.sum(dim=1) == 1)).all()):
                raise ValueError(f"{name}: node_attrs has a row that is not exactly one-hot (entries 0 or 1, one 1); "
                                 "the eqdsl op takes one element per node, mace's einsum any weighting")
        weights = self.weights()
        # (N, mul, dim_in) -> (N, dim_in, mul) rows: the spec's ir_mul layout (a copy unless mul or dim_in is 1)
        x_rows = node_feats.transpose(1, 2).reshape(n, self.dim_in * self.mul)
        out = self.contract(x_rows, weights, elem)
        if node_attrs.requires_grad and torch.is_grad_enabled():
            out = out + _NodeAttrsGrad.apply(node_attrs, x_rows.detach(), weights.detach(), self)
        return out

    def extra_repr(self) -> str:
        return f"{self.irreps_in} -> {self.irreps_out} | {self.num_elements} elements, package {self._package_name}"


class _NodeAttrsGrad(torch.autograd.Function):
    """Zeros ``(num_nodes, dim_out)`` whose backward is the gradient of the contraction with
    respect to ``node_attrs``: ``grad[b, e] = <g[b], contraction(x[b], W[e])>`` (mace's output
    is linear in ``node_attrs``). Its only differentiable input is ``node_attrs``, so autograd
    runs the backward (``num_elements`` forward calls) only where that gradient is needed."""

    @staticmethod
    def forward(ctx, node_attrs, x_rows, weights, module):
        ctx.save_for_backward(x_rows, weights)
        ctx.module = module
        return x_rows.new_zeros(x_rows.shape[0], sum(module.out_dims) * module.mul)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x_rows, weights = ctx.saved_tensors
        n, num_elements = x_rows.shape[0], ctx.module.num_elements
        grad = g.new_empty(n, num_elements)
        for e in range(num_elements):
            elem = torch.full((n,), e, dtype=torch.int64, device=g.device)
            grad[:, e] = (g * ctx.module.contract(x_rows, weights, elem)).sum(dim=1)
        return grad, None, None, None


# the statements of a block's forward that may touch tp_weights for the radial fusion to hold:
# the MLP's output, MACE's per-edge cutoff factor (commutes with the last linear layer), the conv
_TP_WEIGHTS_USES = (
    re.compile(r"^tp_weights = self\.conv_tp_weights\([\w\s,]*\)$"),
    re.compile(r"^tp_weights = tp_weights \* cutoff$"),
    re.compile(r"^message = self\.conv_tp\(\w+, edge_attrs, tp_weights, edge_index\)$"),
    re.compile(r"^[\w\[\]]+, edge_attrs, tp_weights$"),  # the unfused branch's call, split over lines
)


def _is_linear(layer: torch.nn.Module, width: int) -> bool:
    """Whether ``layer(x) == x @ layer(I)`` on random ``x`` ``(3, width)``: linear, no bias and
    no activation (the layer's own normalization factor allowed), checked by what it computes."""
    w = next(layer.parameters())
    x = torch.randn(3, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(w)
    with torch.no_grad():
        return torch.allclose(layer(x), x @ _applied_to_identity(layer), rtol=1e-4, atol=1e-5)


def _radial_hidden_width(block) -> int | None:
    """H if ``block.conv_tp_weights`` ends in a bias-free linear layer this module can split
    off and the block's forward only feeds its output to ``conv_tp``; else ``None``."""
    from e3nn.nn import FullyConnectedNet

    net = block.conv_tp_weights
    if not isinstance(net, FullyConnectedNet) or len(net) == 0:
        return None
    last = net[-1]
    h = net.hs[-2]
    if [tuple(p.shape) for p in last.parameters()] != [(h, net.hs[-1])] or not _is_linear(last, h):
        return None
    try:
        lines = [ln.strip() for ln in inspect.getsource(type(block).forward).splitlines()]
    except (OSError, TypeError):
        return None
    uses = [ln for ln in lines if "tp_weights" in ln and not ln.startswith("#")]
    if not all(any(r.match(ln) for r in _TP_WEIGHTS_USES) for ln in uses):
        return None
    return int(h)


def _has_fusion_hook(block) -> bool:
    try:
        return "conv_fusion" in inspect.getsource(type(block).forward)
    except (OSError, TypeError):  # no source: cannot tell, so refuse
        return False


def _model_dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()


def accelerate(model: torch.nn.Module, *, conv: bool = True, radial: bool = False, products: bool = True,
               check_one_hot: bool = True, dtype=None, irrep_normalization: str = "component",
               path_normalization: str = "element", cache_dir=None) -> torch.nn.Module:
    """Replace every interaction block's ``conv_tp`` (and every product block's symmetric
    contraction) by a generated eqdsl op, in place.

    Args:
        model: a mace-torch model (``MACE``, ``ScaleShiftMACE``, ...) whose interaction
            blocks hold an ``e3nn.o3.TensorProduct`` ``conv_tp`` (not one converted to
            cuEquivariance / OpenEquivariance). Modified in place; copy it first
            (``copy.deepcopy``) to keep the original.
        conv: ``True``: the fused convolution through MACE's ``conv_fusion`` hook (gather,
            product and scatter in one op); ``False``: the per-edge product only.
        radial: with ``conv``, fuse each block's radial MLP's last layer into the conv
            (``conv_radial``, module docstring) where it is a bias-free linear layer;
            other blocks get ``conv``. ``False`` (default, the faster today: module
            docstring): ``conv`` everywhere.
        products: also replace each ``EquivariantProductBasisBlock.symmetric_contractions``
            (mace's ``SymmetricContraction``) by a :class:`MACESymmetricContraction`
            (module docstring; default ``True``); ``False`` leaves them e3nn/mace's.
        check_one_hot: with ``products``, refuse a ``node_attrs`` that is not exactly one-hot
            (one host read per product block and call; :class:`MACESymmetricContraction`).
        dtype: the dtype(s) to generate kernels for (``torch.float32`` / ``"float64"`` or
            a list); default: the dtype of the model's parameters.
        irrep_normalization, path_normalization: what the blocks' ``conv_tp`` were built
            with (MACE: e3nn's defaults); checked against their path weights.
        cache_dir: where generated packages go (``eqdsl.load``).

    Returns:
        ``model`` itself. Blocks with identical products share one generated package.
        ``state_dict`` keys of the replaced ``conv_tp`` (e3nn's ``output_mask`` buffer)
        are gone: load a saved state dict before accelerating. The product blocks' keys
        (``...symmetric_contractions.contractions.*``) are unchanged.

    Raises:
        ValueError: no interaction block with an e3nn ``conv_tp``; a block without the
            ``conv_fusion`` hook (use ``conv=False``); path weights the normalizations do
            not reproduce (``eqdsl.spec_from_e3nn``); with ``products``, a symmetric
            contraction in cuEquivariance's basis (``use_reduced_cg=True`` where
            cuequivariance is installed: use ``products=False``) or a product block
            configured for cuEquivariance. Nothing is replaced then.
        TypeError: a ``conv_tp`` that is no ``e3nn.o3.TensorProduct``; with ``products``, a
            ``symmetric_contractions`` that is no mace ``SymmetricContraction``.
    """
    from e3nn import o3
    from mace.modules.blocks import InteractionBlock

    dtypes = _dtypes(model if dtype is None else dtype)
    blocks = [m for m in model.modules() if isinstance(m, InteractionBlock)]
    if not blocks:
        raise ValueError("accelerate: the model has no MACE interaction block")
    for block in blocks:
        tp = block.conv_tp
        if not isinstance(tp, o3.TensorProduct):
            raise TypeError(f"accelerate: {type(block).__name__}.conv_tp is a {type(tp).__name__}, not an "
                            "e3nn.o3.TensorProduct (already converted? accelerate the e3nn model)")
        if conv and not _has_fusion_hook(block):
            raise ValueError(f"accelerate: {type(block).__name__}.forward has no conv_fusion hook; use conv=False")
    # every product module is built (specs checked, packages generated) before anything is replaced
    product_modules = _product_modules(model, dtypes, check_one_hot, cache_dir) if products else []
    for block in blocks:
        hidden = _radial_hidden_width(block) if conv and radial else None
        cls = MACEConvTP if conv else TensorProduct
        extra = {}
        if hidden is not None:
            cls, extra = MACERadialConvTP, {"radial_features": hidden}
        new = cls.from_e3nn(block.conv_tp, dtypes=dtypes, irrep_normalization=irrep_normalization,
                            path_normalization=path_normalization, cache_dir=cache_dir, **extra)
        if hidden is not None:
            block.conv_tp_weights = RadialHidden(block.conv_tp_weights)
            new.set_radial(block.conv_tp_weights)
        block.conv_tp = new
        if conv:
            block.conv_fusion = True  # MACE tests hasattr(self, "conv_fusion")
    for block, new in product_modules:
        block.symmetric_contractions = new
    return model


def _product_modules(model, dtypes, check_one_hot, cache_dir) -> list:
    """``[(product block, MACESymmetricContraction)]`` for every ``EquivariantProductBasisBlock``;
    blocks sharing one contraction share one new module."""
    from mace.modules.blocks import EquivariantProductBasisBlock
    from mace.modules.symmetric_contraction import SymmetricContraction

    out, made = [], {}
    for block in (m for m in model.modules() if isinstance(m, EquivariantProductBasisBlock)):
        sc = block.symmetric_contractions
        if isinstance(sc, MACESymmetricContraction):
            raise ValueError("accelerate: the model's product blocks are accelerated already")
        if not isinstance(sc, SymmetricContraction):
            raise TypeError(f"accelerate: EquivariantProductBasisBlock.symmetric_contractions is a "
                            f"{type(sc).__name__}, not mace's SymmetricContraction (converted to cuEquivariance? accelerate the e3nn model, "
                            "or pass products=False)")
        cfg = getattr(block, "cueq_config", None)
        if cfg is not None and cfg.enabled and (cfg.optimize_all or cfg.optimize_symmetric):
            raise ValueError("accelerate: a product block configured for cuEquivariance (cueq_config) calls its "
                             "symmetric contraction with another layout; pass products=False")
        if id(sc) not in made:
            made[id(sc)] = MACESymmetricContraction(sc, dtypes=dtypes, check_one_hot=check_one_hot,
                                                    cache_dir=cache_dir)
        out.append((block, made[id(sc)]))
    return out


def radial_blocks(model: torch.nn.Module) -> list[bool]:
    """For each interaction block of an accelerated model, in ``model.modules()`` order:
    whether its conv takes the radial MLP's last layer (``conv_radial``)."""
    from mace.modules.blocks import InteractionBlock

    return [isinstance(m.conv_tp, MACERadialConvTP) for m in model.modules() if isinstance(m, InteractionBlock)]


def _dtypes(dtype) -> list[str]:
    if isinstance(dtype, torch.nn.Module):
        dtype = _model_dtype(dtype)
    items = dtype if isinstance(dtype, (list, tuple)) else [dtype]
    names = []
    for d in items:
        name = str(d).removeprefix("torch.")
        if name not in ("float32", "float64"):
            raise ValueError(f"accelerate: dtype must be float32 or float64, got {d!r}")
        names.append(name)
    return [d for d in ("float32", "float64") if d in names]


def packages(model: torch.nn.Module) -> list:
    """The generated package modules an accelerated model calls (one per distinct product or
    symmetric contraction), e.g. to precompile their kernels (``Path(pkg.__file__).parent``)."""
    seen = {}
    for m in model.modules():
        if isinstance(m, (Conv, TensorProduct, MACESymmetricContraction)):
            pkg = m.package
            seen.setdefault(pkg.__name__, pkg)
    return list(seen.values())
