"""Code generators, one package per backend: ``helion`` (Helion kernels behind torch custom
ops) and ``pallas`` (Pallas kernels behind JAX functions). Each turns a lowered
``TensorProductIR`` into package files (its ``render_files``), reading the backend-neutral
facts of ``eqdsl.analysis``; ``eqdsl.codegen.generate`` calls them."""
