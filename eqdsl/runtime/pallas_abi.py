"""The contract between a generated ``pallas_kernels.py`` and ``eqdsl.runtime.jax.launch``.

A generated module records the version it was written for (``KERNEL_ABI``) and
``eqdsl.runtime.jax.ops.TensorProductFunctions`` refuses a module of another version with
one line saying to regenerate it: the kernels' stores and the launchers' output buffers
must agree, or the results are silently wrong.

Versions:

1. each kernel of a set writes its own output piece from column 0; the launcher
   concatenates the pieces (and puts the fused backward's weight columns in e3nn's order);
2. each kernel writes its columns at their place in the set's full output row, and the
   launcher passes one buffer from kernel to kernel (``input_output_aliases``): no
   concatenation or reordering pass (a shared-weight ``backward_w`` set and the pieces of
   a split ``x1`` block are the exceptions, as in 1);
3. as 2, and the module gives per-dtype defaults, ``BLOCK_BATCH_BY_DTYPE`` and (with the
   conv) ``SEGMENT_EDGES_BY_DTYPE``, over ``BLOCK_BATCH`` / ``SEGMENT_EDGES``.
"""

KERNEL_ABI = 3
