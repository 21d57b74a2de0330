"""Jinja rendering: templates only loop and substitute; every decision is made in Python."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path

import jinja2

__all__ = ["render"]


def template_dir() -> Path:
    """The installed ``eqdsl.templates`` package, or ``templates/`` of a source checkout."""
    try:
        return Path(str(importlib.resources.files("eqdsl.templates")))
    except ModuleNotFoundError:  # running from a checkout without installing
        return Path(__file__).resolve().parents[2] / "templates"


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context``; a missing name is an error."""
    text = _env().get_template(template).render(**context)
    # One trailing newline, no trailing spaces: generated files stay byte-stable.
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n") + "\n"
