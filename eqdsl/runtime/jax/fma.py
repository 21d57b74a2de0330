"""``fma(a, b, c)``: the fused multiply-add of the generated Pallas kernels' sums."""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["fma", "inline_fma"]


# ``fma``, one PTX ``fma.rn`` each on the GPU; elsewhere (interpret mode) ``a * b + c``.
_INLINE_FMA = contextvars.ContextVar("eqdsl_inline_fma", default=False)
_FMA_PTX = {
    np.dtype(np.float32): ("fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f"),
    np.dtype(np.float64): ("fma.rn.f64 $0, $1, $2, $3;", "=d,d,d,d"),
}


def fma(a, b, c):
    """In a kernel: ``a * b + c`` with one rounding (PTX ``fma.rn``) when compiled for the
    GPU, else ``a * b + c``; operands broadcast to one shape, float32 or float64."""
    dtype = jnp.result_type(a, b, c)
    ptx = _FMA_PTX.get(np.dtype(dtype)) if _INLINE_FMA.get() else None
    if ptx is None:
        return a * b + c
    from jax.experimental.pallas import triton as pltriton

    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b), jnp.shape(c))
    args = [jnp.broadcast_to(jnp.asarray(x, dtype), shape) for x in (a, b, c)]
    return pltriton.elementwise_inline_asm(ptx[0], args=args, constraints=ptx[1], pack=1,
                                           result_shape_dtypes=[jax.ShapeDtypeStruct(shape, dtype)])[0]


@contextlib.contextmanager
def inline_fma(enabled: bool):
    """Within the block, ``fma`` traces to inline PTX ``fma.rn`` when ``enabled`` (a kernel
    traced for the GPU), else to ``a * b + c`` (interpret mode). A context variable, so
    that the kernel bodies, which call ``rt.fma`` with no mode argument, are traced right."""
    token = _INLINE_FMA.set(enabled)
    try:
        yield
    finally:
        _INLINE_FMA.reset(token)
