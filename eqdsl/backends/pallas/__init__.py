"""The Pallas (JAX) backend, one job per module.

``assemble`` (entry point, ``render_files``) <- ``kernels`` (kernel builder), ``fused``
(fused backward) <- ``operands`` (operand reads), ``plan`` (layout, kinds, splits);
``passes`` (factoring, fma chains) and ``printer`` (source lines) over ``stmts`` (the
statements); ``tuning`` (the ``pallas_*`` spec keys). Arithmetic is ``eqdsl.kernel_ir``.
"""
