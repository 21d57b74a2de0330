"""Jinja templates for generated modules (installed as ``eqdsl.templates``)."""
