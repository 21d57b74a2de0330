"""The Helion backend: ``TensorProductIR`` -> ``helion_kernels.py`` + ``torch_ops.py`` (and the
fused graph convolution's ``helion_conv_kernels.py`` + ``torch_conv.py``).

Modules, in the order data flows through them:

* ``tuning``: block sizes and launch parameters (``Tuning``), the spec keys that set them.
* ``printer``: kernel statements and operand accesses as frozen dataclasses, printed once.
* ``kernels``: the operand and weight kernel builders (the four derivatives of the
  four-linear form), parameterised by ``Operands`` (how rows are addressed).
* ``fused``: the channelwise products' fused backward.
* ``conv``: the convolution: the same builders with gathered rows and scatters.
* ``assemble``: template contexts and ``render_files``.
"""
