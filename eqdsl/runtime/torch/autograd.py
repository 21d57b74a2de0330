"""Autograd of the generated ops: every derivative of every op is another of the ops.

The kernels compute the four partial derivatives of the four-linear form
``F(x1, x2, W, g) = sum W C x1 x2 g``: ``fwd(x1, x2, W) = dF/dg``, ``bwd_x1(g, x2, W) =
dF/dx1``, ``bwd_x2(x1, g, W) = dF/dx2``, ``bwd_w(x1, x2, g) = dF/dW``. ``F`` is linear in
``x1``, ``x2`` and ``g``, so the vector-Jacobian product of any of them with a cotangent
``h`` is again one of them with ``h`` in place of the argument it replaced: gradients of
every order (forces, then their gradient with respect to the weights) are these ops.
The fused convolution's ops are the same form composed with gathers by the graph
(``F_conv = sum_e F(x[src_e], y_e, W_e, G[dst_e])``) and follow the same rules.
"""

from __future__ import annotations

from .library import register_backward

__all__ = ["register_autograd", "fused_vjp"]


def register_autograd(fwd, bwd_x1, bwd_x2, bwd_w, linear=None, fused=None, *, graph: int = 0) -> None:
    """Wire the derivatives of ``F(x1, x2, W, g) = sum W C x1 x2 g`` to each other.

    ``fwd(x1, x2, W) = dF/dg``, ``bwd_x1(g, x2, W) = dF/dx1``, ``bwd_x2(x1, g, W) =
    dF/dx2``, ``bwd_w(x1, x2, g) = dF/dW`` (operators of ``library.define_op``); only
    the gradients autograd asks for are computed.

    Unweighted paths (weight 1) make ``F`` affine in ``W``, not linear:
    ``<h, dF/dW> = F_W(x1, x2, h, g)`` with ``F_W`` the weighted paths alone. So the
    derivatives of ``bwd_w`` call ``linear = (fwd_lin, bwd_x1_lin, bwd_x2_lin)``, the
    three operand derivatives of ``F_W`` (themselves wired the same way); without
    unweighted paths ``F_W = F`` and ``linear`` is ``None``.

    ``fused(x1, x2, W, g) = (dF/dx1, dF/dx2, dF/dW)`` (a channelwise product's fused
    backward), where given, computes the forward's gradients whenever two or more are
    needed: one pass over the cotangent instead of one per gradient. Its own derivative
    is the sum of the three ops' derivatives (``fused_vjp``).

    ``graph``: 0 for the plain product; for the convolution the number of graph tensors
    every op takes after its operands, followed by ``num_nodes`` (not differentiated).
    """
    n_in = 3 + graph  # the tensors a three-operand op saves: its operands and the graph
    extra_grads = (None,) * (graph + 1) if graph else ()

    def setup(n_tensors):
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs[:n_tensors])
            ctx.scalars = tuple(inputs[n_tensors:])  # num_nodes of the convolution

        return setup_context

    def unpack(ctx, n_operands):
        saved = ctx.saved_tensors
        return saved[:n_operands], (*saved[n_operands:], *ctx.scalars)

    def wire(fwd_, bwd_x1_, bwd_x2_, fused_=None):
        def fwd_backward(ctx, h):
            (x1, x2, w), ex = unpack(ctx, 3)
            n1, n2, nw = ctx.needs_input_grad[:3]
            if fused_ is not None and n1 + n2 + nw >= 2:
                gx1, gx2, gw = fused_(x1, x2, w, h, *ex)
                return (gx1 if n1 else None, gx2 if n2 else None, gw if nw else None) + extra_grads
            return (
                bwd_x1_(h, x2, w, *ex) if n1 else None,
                bwd_x2_(x1, h, w, *ex) if n2 else None,
                bwd_w(x1, x2, h, *ex) if nw else None,
            ) + extra_grads

        def bwd_x1_backward(ctx, h):
            (g, x2, w), ex = unpack(ctx, 3)
            ng, n2, nw = ctx.needs_input_grad[:3]
            return (
                fwd_(h, x2, w, *ex) if ng else None,
                bwd_x2_(h, g, w, *ex) if n2 else None,
                bwd_w(h, x2, g, *ex) if nw else None,
            ) + extra_grads

        def bwd_x2_backward(ctx, h):
            (x1, g, w), ex = unpack(ctx, 3)
            n1, ng, nw = ctx.needs_input_grad[:3]
            return (
                bwd_x1_(g, h, w, *ex) if n1 else None,
                fwd_(x1, h, w, *ex) if ng else None,
                bwd_w(x1, h, g, *ex) if nw else None,
            ) + extra_grads

        for op, backward in ((fwd_, fwd_backward), (bwd_x1_, bwd_x1_backward), (bwd_x2_, bwd_x2_backward)):
            register_backward(op, backward, setup(n_in))

    wire(fwd, bwd_x1, bwd_x2, fused)
    if linear is not None:
        wire(*linear)
    fwd_w, bwd_x1_w, bwd_x2_w = linear if linear is not None else (fwd, bwd_x1, bwd_x2)

    if fused is not None:
        def fused_backward(ctx, k1, k2, kw):
            saved, ex = unpack(ctx, 4)
            return fused_vjp((fwd, bwd_x1, bwd_x2, bwd_w), (fwd_w, bwd_x1_w, bwd_x2_w),
                             saved, (k1, k2, kw), ctx.needs_input_grad, ex) + extra_grads

        register_backward(fused, fused_backward, setup(n_in + 1))

    def bwd_w_backward(ctx, h):
        # F is affine in W: a weight cotangent h takes W's place in the weighted paths only
        (x1, x2, g), ex = unpack(ctx, 3)
        n1, n2, ng = ctx.needs_input_grad[:3]
        return (
            bwd_x1_w(g, x2, h, *ex) if n1 else None,
            bwd_x2_w(x1, g, h, *ex) if n2 else None,
            fwd_w(x1, x2, h, *ex) if ng else None,
        ) + extra_grads

    register_backward(bwd_w, bwd_w_backward, setup(n_in))


def fused_vjp(ops, linear, saved, cotangents, needs, extra=()):
    """Input gradients of a fused backward ``(gx1, gx2, gw) = (bwd_x1(g, x2, W),
    bwd_x2(x1, g, W), bwd_w(x1, x2, g))``: each sums the three ops' formulas.

    ``ops = (fwd, bwd_x1, bwd_x2, bwd_w)``, ``linear``: the ``*_lin`` triple (or the same
    three ops), ``saved = (x1, x2, W, g)``, ``cotangents = (k1, k2, kw)`` (None: not
    flowing), ``needs``: which of the four inputs want a gradient; ``extra``: arguments
    after the three operands of every op call (the convolution's graph and node count).
    """
    fwd, bwd_x1, bwd_x2, bwd_w = ops
    fwd_w, bwd_x1_w, bwd_x2_w = linear
    x1, x2, w, g = saved
    k1, k2, kw = cotangents
    n1, n2, nw, ng = needs[:4]

    def terms(*pairs):
        out = None
        for want, op, args in pairs:
            if want and all(a is not None for a in args):
                value = op(*args, *extra)
                out = value if out is None else out + value
        return out

    return (
        terms((n1, bwd_x1, (g, k2, w)), (n1, bwd_x1_w, (g, x2, kw))),
        terms((n2, bwd_x2, (k1, g, w)), (n2, bwd_x2_w, (x1, g, kw))),
        terms((nw, bwd_w, (k1, x2, g)), (nw, bwd_w, (x1, k2, g))),
        terms((ng, fwd, (k1, x2, w)), (ng, fwd, (x1, k2, w)), (ng, fwd_w, (x1, x2, kw))),
    )


