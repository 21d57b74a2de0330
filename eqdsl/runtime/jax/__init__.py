"""Runtime of the generated JAX modules (``jax_ops.py``, ``pallas_kernels.py``): no physics.

One job per module:

* ``checks``: argument checks (shapes, dtypes, graph indices), at trace time;
* ``padding``: row padding, the kernels' weight operand, bucket sizes (``pad_graph``);
* ``tiles``: in-kernel column access of the kernel bodies (``load_tile`` & co.) and the
  gathered / reducing operands of the conv kernels;
* ``fma``: the kernels' fused multiply-add (inline PTX on the GPU);
* ``launch``: ``pallas_call`` launches of the kernel sets (plain product and conv);
* ``sharding``: batch-parallel launches on several devices;
* ``autodiff``: the ``jax.custom_vjp`` wiring, derivatives of every order as kernels;
* ``graph``: the conv's sorted graph (``ConvGraph``);
* ``columns``: the conv's ``mul_ir`` <-> ``ir_mul`` column permutations (its kernels run on ``ir_mul`` rows);
* ``ops``: ``TensorProductFunctions``, a generated product's entry points bound to its kernels.

The generated ``pallas_kernels.py`` imports this package as ``rt`` and calls the names
below (its kernel bodies' column access and ``fma``, its kernel sets' launches); the
generated ``jax_ops.py`` binds its metadata and kernels to ``ops.TensorProductFunctions``.
"""

from ..versions import check as _check_versions

_check_versions("jax", "jaxlib")  # before any jax import of this package: a clear error first

from .fma import fma  # noqa: E402
from .launch import launch_fused, launch_rows, launch_weight_sum  # noqa: E402
from .tiles import load_tile, load_vec, radial_rows, radial_vec, store_tile, store_vec  # noqa: E402

__all__ = ["fma", "load_vec", "store_vec", "load_tile", "store_tile", "radial_rows", "radial_vec", "launch_rows",
           "launch_weight_sum", "launch_fused"]
