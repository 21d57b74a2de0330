"""``SymmetricOps``: the custom ops of one generated symmetric contraction, bound to its kernels.

The contraction (``eqdsl.symmetric.ir``) contracted with an output cotangent ``G`` is the form
``F(x, W, G)``, a polynomial of degree ``N <= 4`` in ``x`` per node and channel, linear in
``W`` and ``G``. Its ``k``-th directional derivative ``F_k(x, W, G, v_1..v_k) = D^k_x F[v_1..v_k]``
is linear in ``W``, ``G`` and every ``v_j`` and symmetric in the ``v_j``; one op per partial
derivative (``eqdsl/symmetric/helion.py`` generates a kernel for each)::

    fwd_d{k}(x, v_1..v_k, weights, elem)      = dF_k/dG   (N, dim_out)           (fwd: k = 0)
    bwd_w_d{k}(x, v_1..v_k, g, elem)          = dF_k/dW   (num_elements, weight_numel)
    bwd_x_d{k}(x, v_1..v_k, weights, g, elem) = dF_k/dx   (N, dim_x)

Because ``<h, dF_k/dG> = F_k(x, W, h, ...)``, ``<h, dF_k/dW> = F_k(x, h, G, ...)`` and
``<u, dF_k/dx> = F_{k+1}(x, W, G, ..., u)``, the derivatives of each op are ops of the same
three families (``_backward``): ``d/dx`` raises ``k`` by one, ``d/dv_j`` is ``bwd_x`` of the
other directions. ``F_k = 0`` for ``k > N`` (``bwd_x``: ``k >= N``), where the op is zeros
without a kernel: gradients of every order work, none is refused.

Rows of ``x``, ``v_j``, ``g``, the results: the spec's layout (the kernels read it in place).
``elem``: integer ``(N,)`` (int32 or int64), never differentiated.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from eqdsl.irreps import Irreps
from eqdsl.symmetric.tables import KINDS, columns, op_name

from .checks import CheckCache, describe, check_device, check_same_device
from .library import define_op, register_backward, register_fake

__all__ = ["SymmetricOps"]

_INT_DTYPES = (torch.int32, torch.int64)
# bwd_w's per-node rows of dA (the folded weights' gradient) are written for this many values
# (rows x folded weight_numel) at a time (MACE-MP: 1,278 nodes a chunk, 268 MB in float32), then
# summed into their elements' rows.
ROWS_CHUNK_ELEMENTS = 1 << 26


class SymmetricOps:
    """The ops of one symmetric contraction (see the module docstring) and its entry point.

    Args:
        namespace: the ops' namespace (``torch.ops.<namespace>``, ``eqdsl_sc_<name>``).
        kernels: ``{op name: callable}``: ``kernel(*operands, *tables, result)`` (``tables_on``)
            runs the op's kernel on contiguous operands of a non-empty batch (``result``
            preallocated; ``bwd_w*`` take no ``elem`` and write one row of ``dA`` per node,
            summed per element in chunks of ``ROWS_CHUNK_ELEMENTS`` values: by a matmul with
            the element indicator (``_exact_matmul``), else by ``index_add_`` (CPU float32,
            and CUDA float32 while TF32 is on; its summation order varies between runs on
            CUDA). Looked up at each call.
        tables: ``tables.get(kind, k, layout)`` gives the op's ``eqdsl.symmetric.tables.OpTables``
            and ``tables.ir`` the IR (``PackageTables``); copied to each (device, dtype) once and
            kept. Every kernel runs the folded tables (``tables.get(..., folded=True)``,
            ``eqdsl.symmetric.fold``): ``fwd`` and ``bwd_x`` on the folded weights ``A`` (``fold``:
            one batched matmul a call), ``bwd_w`` writes rows of ``dA``, whose per-element sums
            ``unfold`` turns into ``dW``. The kernels always run on ``ir_mul`` rows (channels
            contiguous: on an H100,
            MACE-MP's forward took 1.7 ms on ``ir_mul`` rows against 2.6 ms on ``mul_ir``
            rows with the best tile of each, 2026-11-27); a ``mul_ir`` contraction's operands
            are permuted into ``ir_mul`` (one column gather each) and its result back.
        dim_in, dim_out: columns of ``x`` and ``out`` (``dim * mul``).
        num_elements, weight_numel: the weight table's shape.
        max_order: ``{kind: largest k with a kernel}`` (``N``, ``N``, ``N - 1``).
        dtypes: the float dtypes the kernels were generated for.

    Attributes:
        ops: ``{op name: operator}`` (``torch.ops.<namespace>.<op>.default``).
        impls: ``{op name: implementation}``.
    """

    def __init__(self, namespace: str, kernels: Mapping[str, Callable], tables, *, dim_in: int, dim_out: int,
                 num_elements: int, weight_numel: int, max_order: Mapping[str, int],
                 dtypes: tuple[torch.dtype, ...]):
        self.namespace = namespace
        self._kernels = kernels
        self._tables = tables
        self._device_tables: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self._fold_matrices: dict[torch.device, torch.Tensor] = {}
        self._perms: dict[tuple, torch.Tensor] = {}
        self.dim_in, self.dim_out = dim_in, dim_out
        self.num_elements, self.weight_numel = num_elements, weight_numel
        self.max_order = dict(max_order)
        self.dtypes = tuple(dtypes)
        self.ops: dict[str, object] = {}
        self.impls: dict[str, Callable] = {}
        for kind in KINDS:
            for k in range(self.max_order[kind] + 1):
                self._define(kind, k)
        for kind in KINDS:
            for k in range(self.max_order[kind] + 1):
                self._register_autograd(kind, k)
        self._checked = CheckCache(self.check)

    # ------------------------------------------------------------------ entry point

    def check(self, x, weights, elem) -> None:
        """``TypeError`` / ``ValueError`` naming the argument of a ``symmetric_contraction`` call
        (metadata only; the element range is ``check_range``)."""
        op = self.namespace + ".symmetric_contraction"
        for name, t in (("x", x), ("weights", weights), ("elem", elem)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{op}: {name} must be a torch.Tensor, got {describe(t)}")
        allowed = ", ".join(str(d) for d in self.dtypes)
        for name, t in (("x", x), ("weights", weights)):
            if t.dtype not in self.dtypes:
                raise TypeError(f"{op}: {name} must have dtype in ({allowed}), got {t.dtype}")
        if x.dtype != weights.dtype:
            raise TypeError(f"{op}: x and weights must share one dtype, got {x.dtype} and {weights.dtype}")
        if elem.dtype not in _INT_DTYPES:
            raise TypeError(f"{op}: elem must be an integer tensor (torch.int32 or torch.int64) of element "
                            f"indices, got {elem.dtype}")
        if x.dim() != 2 or x.shape[1] != self.dim_in:
            raise ValueError(f"{op}: x must have shape (num_nodes, {self.dim_in}), got {tuple(x.shape)}")
        if tuple(weights.shape) != (self.num_elements, self.weight_numel):
            raise ValueError(f"{op}: weights must have shape ({self.num_elements}, {self.weight_numel}) "
                             f"(num_elements, weight_numel), got {tuple(weights.shape)}")
        if tuple(elem.shape) != (x.shape[0],):
            raise ValueError(f"{op}: elem must have shape ({x.shape[0]},) (one element index per row of x), "
                             f"got {tuple(elem.shape)}")
        check_same_device(op, ("x", "weights", "elem"), (x, weights, elem))

    def check_range(self, elem: torch.Tensor) -> None:
        """``ValueError`` unless ``0 <= elem < num_elements`` (reads ``elem`` on the host: one
        device sync; an index out of range would be an out-of-bounds access in the kernels)."""
        if elem.numel():
            lo, hi = int(elem.min()), int(elem.max())
            if lo < 0 or hi >= self.num_elements:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{self.namespace}.symmetric_contraction: elem holds {bad}, outside "
                                 f"0..{self.num_elements - 1} (num_elements = {self.num_elements})")

    def symmetric_contraction(self, x: torch.Tensor, weights: torch.Tensor, elem: torch.Tensor, *,
                              check: bool = True) -> torch.Tensor:
        """The checked ``fwd`` op (the generated module's ``symmetric_contraction`` documents it)."""
        (self.check if torch.compiler.is_compiling() else self._checked)(x, weights, elem)
        if check and not torch.compiler.is_compiling() and not _capturing(x):
            self.check_range(elem)
        return self.ops["fwd"](x, weights, elem)

    # ------------------------------------------------------------------ the ops

    def _args(self, kind: str, k: int) -> tuple[str, ...]:
        vs = tuple(f"v{j}" for j in range(1, k + 1))
        return {"fwd": ("x", *vs, "weights", "elem"), "bwd_w": ("x", *vs, "g", "elem"),
                "bwd_x": ("x", *vs, "weights", "g", "elem")}[kind]

    def _shape(self, kind: str, x: torch.Tensor) -> tuple[int, int]:
        return {"fwd": (x.shape[0], self.dim_out), "bwd_w": (self.num_elements, self.weight_numel),
                "bwd_x": (x.shape[0], self.dim_in)}[kind]

    def _check_operands(self, qual: str, names, tensors) -> None:
        for name, t in zip(names, tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{qual}: {name} must be a torch.Tensor, got {describe(t)}")
        x = tensors[0]
        n = x.shape[0] if x.dim() == 2 else -1
        widths = {"x": self.dim_in, "g": self.dim_out, "weights": None, "elem": None}
        for name, t in zip(names, tensors):
            if name == "elem":
                if t.dtype not in _INT_DTYPES or tuple(t.shape) != (n,):
                    raise ValueError(f"{qual}: elem must be int32/int64 of shape ({n},), got {t.dtype} {tuple(t.shape)}")
                continue
            if t.dtype not in self.dtypes or t.dtype != x.dtype:
                raise TypeError(f"{qual}: {name} must have x's dtype ({x.dtype}, one of {self.dtypes}), got {t.dtype}")
            want = (self.num_elements, self.weight_numel) if name == "weights" else (n, widths.get(name, self.dim_in))
            if tuple(t.shape) != want:
                raise ValueError(f"{qual}: {name} must have shape {want}, got {tuple(t.shape)}")
        check_same_device(qual, tuple(names), tuple(tensors))

    def _fold_matrix(self, like: torch.Tensor) -> torch.Tensor:
        """The ``(P, K)`` fold matrix (``eqdsl.symmetric.fold``) in float64 on ``like``'s device, once."""
        fold = self._tables.fold
        f = self._fold_matrices.get(like.device)
        if f is None:
            dense = torch.zeros(fold.rows, fold.cols, dtype=torch.float64)
            for p, kk, v in fold.entries:
                dense[p, kk] += v
            f = self._fold_matrices[like.device] = dense.to(like.device)
        return f

    def fold(self, weights: torch.Tensor) -> torch.Tensor:
        """The folded weights ``A`` ``(num_elements, P * mul)`` of ``weights`` (``eqdsl.symmetric.fold``):
        ``A[e, p] = sum_kk F[p, kk] W[e, kk]`` over rows of ``mul`` channels, one batched matmul in
        float64 (a few hundred rows: never TF32, whatever ``torch.backends`` allows), then
        ``weights``' dtype."""
        fold = self._tables.fold
        e, mul = weights.shape[0], fold.ir.mul
        a = torch.matmul(self._fold_matrix(weights), weights.reshape(e, fold.cols, mul).double())
        return a.to(weights.dtype).reshape(e, fold.rows * mul)

    def unfold(self, ga: torch.Tensor) -> torch.Tensor:
        """``dW`` ``(num_elements, weight_numel)`` of a gradient ``ga`` with respect to the folded
        weights, ``(num_elements, P * mul)``: ``F^T`` applied per element (float64, as ``fold``)."""
        fold = self._tables.fold
        e, mul = ga.shape[0], fold.ir.mul
        w = torch.matmul(self._fold_matrix(ga).t(), ga.reshape(e, fold.rows, mul).double())
        return w.to(ga.dtype).reshape(e, fold.cols * mul)

    def tables_on(self, kind: str, k: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(slots, mono_ptr, mono_cols, mono_terms, cols, coeff)`` of op ``kind``/``k`` on ``like``'s
        device (``coeff`` in its dtype, the rest int32; the folded IR's), built and copied once."""
        key = (kind, k, like.device, like.dtype)
        got = self._device_tables.get(key)
        if got is None:
            t = self._tables.get(kind, k, "ir_mul", folded=True)
            ints = dict(dtype=torch.int32, device=like.device)

            def matrix(rows, width):
                return torch.tensor(rows, **ints).reshape(len(rows), width)

            got = (matrix(t.slots, 2), torch.tensor(t.mono_ptr, **ints),
                   matrix(t.mono_cols, len(t.columns) - t.head_width), torch.tensor(t.mono_terms, **ints),
                   matrix(t.cols, len(t.columns)), torch.tensor(t.coeff, dtype=like.dtype, device=like.device))
            self._device_tables[key] = got
        return got

    def _perm(self, which: str, inverse: bool, device) -> torch.Tensor | None:
        """Columns of a ``which`` (``"in"``: x-shaped, ``"out"``: out-shaped) row in the spec's
        layout, in ``ir_mul`` order (``inverse``: the other way); None for an ``ir_mul`` spec."""
        ir = self._tables.ir
        if ir.layout == "ir_mul":
            return None
        key = (which, inverse, device)
        got = self._perms.get(key)
        if got is None:
            irreps = ir.irreps_in if which == "in" else ir.irreps_out
            dims = tuple(mi.ir.dim for mi in Irreps(irreps))
            src, dst = columns(dims, ir.mul, ir.layout), columns(dims, ir.mul, "ir_mul")
            perm = torch.empty(sum(dims) * ir.mul, dtype=torch.int64)
            c = torch.arange(ir.mul)
            for (sb, ss), (db, _) in zip(src, dst):
                perm[db + c] = sb + c * ss
            got = torch.argsort(perm) if inverse else perm
            got = self._perms[key] = got.to(device)
        return got

    def _to_ir_mul(self, t: torch.Tensor, which: str) -> torch.Tensor:
        perm = self._perm(which, False, t.device)
        return t if perm is None else t.index_select(1, perm)

    def _from_ir_mul(self, t: torch.Tensor, which: str) -> torch.Tensor:
        perm = self._perm(which, True, t.device)
        return t if perm is None else t.index_select(1, perm)

    def _define(self, kind: str, k: int) -> None:
        name = op_name(kind, k)
        qual = f"{self.namespace}::{name}"
        names = self._args(kind, k)
        kernels = self._kernels

        def impl(*tensors):
            self._check_operands(qual, names, tensors)
            check_device(qual, tensors[0].device)
            x = tensors[0]
            shape = self._shape(kind, x)
            if x.shape[0] == 0:
                return x.new_zeros(shape)
            operands = [self._to_ir_mul(t, "out") if n == "g" else
                        self._to_ir_mul(t, "in") if n == "x" or n.startswith("v") else
                        self.fold(t) if n == "weights" else
                        t.to(torch.int64).contiguous() if n == "elem" else t.contiguous()  # the Triton code's elem: int64
                        for n, t in zip(names, tensors)]
            tables = self.tables_on(kind, k, x)
            if kind == "bwd_w":  # per-node rows of dA summed per element, a chunk of nodes at a time
                elem = operands.pop()
                width = self._tables.fold.ir.weight_numel
                ga = x.new_zeros((self.num_elements, width))
                step = max(1, ROWS_CHUNK_ELEMENTS // width)
                rows = x.new_empty((min(step, x.shape[0]), width))
                by_matmul = _exact_matmul(x)
                if by_matmul:  # (E, nodes) indicator: no host sync, unlike one_hot's range check
                    onehot = (torch.arange(self.num_elements, device=x.device)[:, None] == elem).to(x.dtype)
                for s in range(0, x.shape[0], step):
                    part = [t[s:s + step] for t in operands]
                    out = rows[:part[0].shape[0]]
                    kernels[name](*part, *tables, out)
                    if by_matmul:
                        ga.addmm_(onehot[:, s:s + step], out)
                    else:
                        ga.index_add_(0, elem[s:s + step], out)
                return self.unfold(ga)
            result = x.new_empty(shape)
            kernels[name](*operands, *tables, result)
            return self._from_ir_mul(result, {"fwd": "out", "bwd_x": "in"}[kind])

        def fake(*tensors):
            self._check_operands(qual, names, tensors)
            return tensors[0].new_empty(self._shape(kind, tensors[0]))

        op = define_op(qual, impl, schema="(" + ", ".join(f"Tensor {a}" for a in names) + ") -> Tensor")
        register_fake(op, fake)
        self.ops[name], self.impls[name] = op, impl

    def call(self, kind: str, k: int, x, vs, *rest) -> torch.Tensor:
        """Op ``kind`` of order ``k`` at ``(x, *vs, *rest)``; zeros where ``F_k`` vanishes
        (``k`` beyond ``max_order``) or a direction is None (a zero cotangent)."""
        if k > self.max_order[kind] or any(v is None for v in vs) or any(r is None for r in rest):
            return x.new_zeros(self._shape(kind, x))
        return self.ops[op_name(kind, k)](x, *vs, *rest)

    def _register_autograd(self, kind: str, k: int) -> None:
        call = self.call

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, h):
            saved = ctx.saved_tensors
            needs = ctx.needs_input_grad
            x, vs = saved[0], list(saved[1:1 + k])
            rest = saved[1 + k:]
            grads: list = [None] * len(saved)
            if kind == "fwd":  # <h, dF_k/dG> = F_k(x, W, h, vs)
                (w, elem), g = rest, h
                if needs[0]:
                    grads[0] = call("bwd_x", k, x, vs, w, g, elem)
                for j in range(k):
                    if needs[1 + j]:
                        grads[1 + j] = call("bwd_x", k - 1, x, vs[:j] + vs[j + 1:], w, g, elem)
                if needs[1 + k]:
                    grads[1 + k] = call("bwd_w", k, x, vs, g, elem)
            elif kind == "bwd_w":  # <h, dF_k/dW> = F_k(x, h, G, vs)
                (g, elem), w = rest, h
                if needs[0]:
                    grads[0] = call("bwd_x", k, x, vs, w, g, elem)
                for j in range(k):
                    if needs[1 + j]:
                        grads[1 + j] = call("bwd_x", k - 1, x, vs[:j] + vs[j + 1:], w, g, elem)
                if needs[1 + k]:
                    grads[1 + k] = call("fwd", k, x, vs, w, elem)
            else:  # <h, dF_k/dx> = F_{k+1}(x, W, G, vs, h)
                w, g, elem = rest
                up = vs + [h]
                if needs[0]:
                    grads[0] = call("bwd_x", k + 1, x, up, w, g, elem)
                for j in range(k):
                    if needs[1 + j]:
                        grads[1 + j] = call("bwd_x", k, x, vs[:j] + vs[j + 1:] + [h], w, g, elem)
                if needs[1 + k]:
                    grads[1 + k] = call("bwd_w", k + 1, x, up, g, elem)
                if needs[2 + k]:
                    grads[2 + k] = call("fwd", k + 1, x, up, w, elem)
            return tuple(grads)

        register_backward(self.ops[op_name(kind, k)], backward, setup_context)


def _exact_matmul(x: torch.Tensor) -> bool:
    """Whether a matmul of ``x``'s dtype and device sums as exactly as ``index_add_`` (each
    product by 0 or 1 exact, accumulated in the dtype): float64, or CUDA float32 while TF32
    is off (``torch.backends.cuda.matmul.allow_tf32``; TF32 would round the rows to 10
    mantissa bits). There it replaces ``index_add_``, whose atomics serialize as every node
    of an element adds into the same row: 8.2 ms of MACE-MP's float64 training step on an
    H100 (2026-11-27)."""
    if x.dtype == torch.float64:
        return True
    return x.is_cuda and x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32


def _capturing(x: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured (no host reads of device data then)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()
