"""Reading the spec file ``eqdsl tune`` tunes, and writing a tuning table back into its text.

The rewrite goes through tomlkit's document model, which keeps everything it does not change
(comments, blank lines, key order, the other tables) byte for byte: a spec's tuning sections
carry the reasons their values were chosen (``examples/specs/mace_large.toml``), and
``eqdsl tune --write`` must keep them.
"""

from __future__ import annotations

from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, InlineTable, Table

from ..backends import TUNING_OPS
from ..spec import TensorProductSpec, load_spec, parse_spec
from .grid import Pairs, TuneError

__all__ = ["read_single", "tuning_sections", "with_tuning"]


def read_single(spec_path: Path) -> tuple[str, TensorProductSpec]:
    """The text and the parsed spec of a file with one ``[[tensor_product]]`` table.

    Raises:
        SpecError: the spec is invalid.
        TuneError: the file has several ``[[tensor_product]]`` tables.
    """
    text = spec_path.read_text(encoding="utf-8")
    specs = load_spec(spec_path)
    if len(specs) != 1:
        raise TuneError(f"{spec_path}: {len(specs)} [[tensor_product]] tables; eqdsl tune takes a spec with one")
    return text, specs[0]


def _split(table: Pairs) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """``table``'s top-level keys, and its sub-tables by op (in ``TUNING_OPS`` order)."""
    top = {k: v for k, v in table if "." not in k}
    subs = {op: {k.partition(".")[2]: v for k, v in table if k.partition(".")[0] == op} for op in TUNING_OPS}
    return top, {op: s for op, s in subs.items() if s}


def tuning_sections(table: Pairs) -> str:
    """TOML text of ``table``: ``[tensor_product.tuning]`` for its top-level keys, then one
    ``[tensor_product.tuning.<op>]`` per op sub-table (in ``TUNING_OPS`` order); ``""`` for ``()``."""
    top, subs = _split(table)

    def section(op: str, pairs: dict[str, int]) -> str:
        return f"[tensor_product.tuning{'.' + op if op else ''}]\n" + "".join(f"{k} = {v}\n" for k, v in pairs.items())

    parts = ([section("", top)] if top else []) + [section(op, s) for op, s in subs.items()]
    return "\n".join(parts)


def _set_keys(container, want: dict[str, int], keep=lambda key: False) -> None:
    """Make ``container``'s plain keys exactly ``want``: an equal value is left as written,
    a changed one replaced in place, a missing one appended (sorted), any other removed
    (except those ``keep`` names: the sub-tables)."""
    for key in [k for k in container if not keep(k) and k not in want]:
        del container[key]
    for key in sorted(want):
        if key not in container or container[key] != want[key]:
            container[key] = want[key]


def with_tuning(text: str, table: Pairs) -> str:
    """Spec text whose tuning is ``table``, everything else kept as written.

    The top-level ``[tensor_product.tuning]`` keys and each ``[tensor_product.tuning.<op>]``
    sub-table are set to ``table``'s (``TensorProductSpec.tuning`` pairs, sub-table keys as
    ``"<op>.<key>"``): values that stay keep their line and comment; new keys go at the end of
    their section, new sections at the end of the tuning table; emptied sections are removed.
    Full-line comments stay where they are.

    Raises:
        TuneError: the text is not TOML, has not exactly one ``[[tensor_product]]`` table, or
            the result would not parse back to ``table`` (a tuning table written in a form
            this rewrite does not handle, e.g. dotted keys).
    """
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as e:
        raise TuneError(f"the spec is not valid TOML: {e}") from None
    tps = doc.get("tensor_product")
    if not isinstance(tps, AoT) or len(tps) != 1:
        raise TuneError("the spec must have exactly one [[tensor_product]] table to write its tuning")
    try:
        _edit(tps[0], table)
    except (TOMLKitError, LookupError) as e:  # tomlkit cannot edit some forms (dotted keys)
        raise TuneError(f"could not write the tuning table into the spec's text ({type(e).__name__}: {e}); "
                        + _FORM) from None
    out = tomlkit.dumps(doc)
    if parse_spec(out)[0].tuning != tuple(sorted(table)):
        raise TuneError("could not write the tuning table into the spec's text; " + _FORM)
    return out


_FORM = "write it as [tensor_product.tuning] and [tensor_product.tuning.<op>] sections"


def _edit(tp, table: Pairs) -> None:
    """Set the tuning of ``tp`` (the document's ``[[tensor_product]]`` table) to ``table``, in place."""
    top, subs = _split(table)
    tuning = tp.get("tuning")
    if tuning is None:
        if not table:
            return
        tuning = tomlkit.table(is_super_table=not top)
        tp["tuning"] = tuning
        tuning = tp["tuning"]
    inline = isinstance(tuning, InlineTable)
    _set_keys(tuning, top, keep=lambda k: k in TUNING_OPS)
    for op in TUNING_OPS:
        if op in tuning and op not in subs:
            del tuning[op]
        elif op in subs:
            if op not in tuning:
                tuning[op] = tomlkit.inline_table() if inline else tomlkit.table()
            _set_keys(tuning[op], subs[op])
    if not table:
        del tp["tuning"]
    elif not top and isinstance(tuning, Table) and not tuning.is_super_table():
        # only sub-tables left: drop the empty [tensor_product.tuning] header (a super table)
        sup = tomlkit.table(is_super_table=True)
        for op in subs:
            sup[op] = tuning[op]
        tp["tuning"] = sup
