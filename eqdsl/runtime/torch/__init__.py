"""Runtime of the generated PyTorch modules (``torch_ops.py``, ``torch_conv.py``): no physics, no kernels.

One job per module:

* ``checks``: argument checks (shapes, dtypes, devices), cached per argument metadata;
* ``library``: defining the custom operators (``torch.library.Library``, public API), their
  fake implementations and autograd formulas;
* ``autograd``: the derivative rules of the four-linear form the kernels compute, wiring
  every op's derivative to the other ops (gradients of any order);
* ``layout``: the differentiable ``mul_ir`` <-> ``ir_mul`` column permutation;
* ``ops``: ``TensorProductOps``, the ops of a generated tensor product, bound to its kernels;
* ``conv``: ``ConvOps``, the ops of a generated fused graph convolution;
* ``radial``: ``RadialConvOps``, its ``conv_radial`` (the per-edge weights formed on chip).

A generated module binds its metadata and its kernel launchers (``_launch_<op>``, which call
the generated kernels through ``eqdsl.runtime.triton_launch``) to ``TensorProductOps`` /
``ConvOps``; everything else lives here.
"""

from ..versions import check as _check_versions

_check_versions("torch", "triton")  # before any torch import of this package: a clear error first
