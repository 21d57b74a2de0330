"""Drop-in acceleration of existing models' edge tensor products with generated eqdsl ops.

One module per model library, each imported on its own (this package imports none of
them, nor torch or jax): ``eqdsl.integrations.mace`` (mace-torch), and the others in this
directory. Each replaces the model's e3nn tensor product (and, where the model allows
it, the gather and scatter around it) by a package generated from the model's own
module (``eqdsl.spec_from_e3nn``, ``eqdsl.load``).
"""
