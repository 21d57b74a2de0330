"""Strict reading of spec files: what both table kinds share.

``eqdsl.spec`` (``[[tensor_product]]``) and ``eqdsl.symmetric.spec``
(``[[symmetric_contraction]]``) read one TOML file the same way: the file as UTF-8 text, the
document's top-level keys (only these two arrays of tables), one ``TableReader`` per table
(unknown keys and wrong types refused, never ignored, as torchgen parses its YAML), and
names unique within a kind. Every error is one ``SpecError`` naming the file, the table,
the key and the reason.
"""

from __future__ import annotations

import keyword
import re
import tomllib
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from .errors import SpecError
from .irreps import Irreps, IrrepsError

__all__ = ["TABLE_KINDS", "TableReader", "parse_document", "parse_tables", "read_spec_text"]

# the arrays of tables a spec file may hold; any other top-level key is refused
TABLE_KINDS = ("tensor_product", "symmetric_contraction")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_S = TypeVar("_S")


def read_spec_text(path: str | Path) -> str:
    """The text of spec file ``path``.

    Raises:
        SpecError: the file cannot be read, or is not UTF-8 text.
    """
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(path), None, None, f"cannot read file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecError(str(path), None, None, "file is not UTF-8 text") from None


def parse_document(text: str, filename: str) -> dict:
    """The TOML document of spec text (``filename`` names it in errors).

    Raises:
        SpecError: invalid TOML, or a top-level key other than ``TABLE_KINDS``.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(filename, None, None, f"invalid TOML: {e}") from None
    extra = sorted(set(data) - set(TABLE_KINDS))
    if extra:
        raise SpecError(filename, None, extra[0],
                        "unknown top-level key; expected [[tensor_product]] or [[symmetric_contraction]] tables")
    return data


def parse_tables(tables, filename: str, kind: str, parse_table: Callable[[dict, str, int], _S]) -> tuple[_S, ...]:
    """``parse_table(table, filename, index)`` of each table of the array ``tables`` (the
    document's ``kind`` key), in file order; each result has a ``name``.

    Raises:
        SpecError: ``tables`` is not an array of tables, a table is bad (``parse_table``'s
            errors), or two tables share a name.
    """
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SpecError(filename, None, kind, f"must be an array of tables ([[{kind}]])")
    specs: list[_S] = []
    seen: set[str] = set()
    for idx, table in enumerate(tables):
        spec = parse_table(table, filename, idx)
        if spec.name in seen:
            raise SpecError(filename, f"{kind}.{idx}", "name", f"duplicate name {spec.name!r}")
        seen.add(spec.name)
        specs.append(spec)
    return tuple(specs)


class TableReader:
    """One table of a spec file, read key by key; every refusal is a ``SpecError``.

    ``where`` names the table in errors: ``<kind>.<index>``, then ``<kind>.<index> (<name>)``
    once ``name()`` has read the table's name.
    """

    def __init__(self, table: dict, filename: str, kind: str, idx: int, known: frozenset[str] | set[str]):
        """Raises ``SpecError`` for the first key (in file order) not in ``known``."""
        self.table, self.filename, self.kind, self.idx = table, filename, kind, idx
        self.where = f"{kind}.{idx}"
        for key in table:
            if key not in known:
                self.fail(key, f"unknown key; expected one of {', '.join(sorted(known))}")

    def fail(self, key: str | None, reason: str) -> NoReturn:
        raise SpecError(self.filename, self.where, key, reason)

    def get(self, key: str, typ: type, default=None, required: bool = False):
        """The value of ``key``, of type ``typ`` (``int`` excludes ``bool``, as TOML tells them
        apart); ``default`` when absent, unless ``required``."""
        if key not in self.table:
            if required:
                self.fail(key, "missing required key")
            return default
        v = self.table[key]
        ok = isinstance(v, int) and not isinstance(v, bool) if typ is int else isinstance(v, typ)
        if not ok:
            self.fail(key, f"expected {typ.__name__}, got {type(v).__name__} {v!r}")
        return v

    def name(self) -> str:
        """The required ``name``: a Python identifier (it names the generated module). From
        here on errors name the table by it."""
        name = self.get("name", str, required=True)
        if not _NAME_RE.fullmatch(name) or keyword.iskeyword(name):
            self.fail("name", f"{name!r} is not a valid Python identifier (letters, digits, '_', starting with a letter)")
        self.where = f"{self.kind}.{self.idx} ({name})"
        return name

    def irreps(self, key: str) -> Irreps:
        """The required e3nn irreps string ``key``: non-empty, every multiplicity positive."""
        text = self.get(key, str, required=True)
        try:
            ir = Irreps(text)
        except IrrepsError as e:
            bad = str(e)
        else:
            bad = None
        if bad is not None:  # raised outside the handler so the one-line error has no chained context
            self.fail(key, bad)
        if not ir:
            self.fail(key, "irreps must not be empty")
        if any(mi.mul == 0 for mi in ir):
            self.fail(key, "multiplicities must be positive")
        return ir

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        """The string ``key``, one of ``options``; ``default`` when absent."""
        v = self.get(key, str, default)
        if v not in options:
            self.fail(key, f"{v!r} is not one of {', '.join(options)}")
        return v

    def dtypes(self, options: tuple[str, ...]) -> tuple[str, ...]:
        """``dtypes``: a non-empty list of distinct values from ``options`` (default all),
        returned in ``options``' order."""
        dtypes = self.get("dtypes", list, list(options))
        if not dtypes or any(d not in options for d in dtypes) or len(set(dtypes)) != len(dtypes):
            self.fail("dtypes", f"expected a non-empty list of distinct values from {', '.join(options)}, got {dtypes!r}")
        return tuple(d for d in options if d in dtypes)
