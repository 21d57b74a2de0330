"""The one error type a user sees for a bad spec."""

from __future__ import annotations


def _one_line(text: str) -> str:
    """``text`` as is if printable, else its ``repr`` (a file name or TOML key may hold a newline)."""
    return text if text.isprintable() else repr(text)


class SpecError(ValueError):
    """A spec file is invalid.

    ``str(err)`` is one line: ``<file>: [<table>] <key>: <reason>``, so the CLI can print
    it as is. ``path``, ``table``, ``key`` and ``reason`` are kept as attributes.
    """

    def __init__(self, path: str, table: str | None, key: str | None, reason: str):
        self.path, self.table, self.key, self.reason = path, table, key, reason
        where = _one_line(path)
        if table:
            where += f": [{table}]"
        if key:
            where += f" {_one_line(key)}" if table else f": {_one_line(key)}"
        super().__init__(f"{where}: {reason}")
