"""Symmetric contraction (MACE product basis): spec, exact U tensors, IR, reference (issue 27)."""
