"""The one error type a user sees for a bad spec."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec file is invalid.

    ``str(err)`` is one line: ``<file>: [<table>] <key>: <reason>``, so the CLI can print
    it as is. ``path``, ``table``, ``key`` and ``reason`` are kept as attributes.
    """

    def __init__(self, path: str, table: str | None, key: str | None, reason: str):
        self.path, self.table, self.key, self.reason = path, table, key, reason
        where = path
        if table:
            where += f": [{table}]"
        if key:
            where += f" {key}" if table else f": {key}"
        super().__init__(f"{where}: {reason}")
