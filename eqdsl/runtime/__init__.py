"""What generated packages import at run time (no physics, no code generation: nothing here
imports ``eqdsl.codegen`` or ``eqdsl.backends``).

* ``torch/``: the PyTorch side (checks, operators, autograd, ``TensorProductOps``, ``ConvOps``);
* ``jax/``: the JAX side (checks, padding, in-kernel helpers, launches, autodiff, sharding,
  ``TensorProductFunctions``);
* ``triton_launch``: launching the shipped Triton code of the Helion kernels;
* ``cubins``: installing prebuilt binaries into Triton's cache (``eqdsl build``);
* ``versions``: the supported version ranges of torch, triton, helion, jax;
* ``layout``: ``mul_ir`` <-> ``ir_mul`` column orders (the convolutions' kernels run on ``ir_mul`` rows).
"""
