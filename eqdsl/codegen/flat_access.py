"""Rewrite per-block view accesses of generated Helion kernels into whole-row accesses.

The kernel emitters (``helion_backend``) index operands as per-block views: ``x1_2`` is
``x1[:, 64:160].unflatten(1, (32, 3))``, so ``x1_2[tile_b, 5, 1]`` is column
``64 + 5*3 + 1`` of ``x1``. Building those views costs one or two eager torch calls each
per launch, and each view adds a pointer and its strides to the launch: measured on the
H100 machine's host (2026-11-22), mace_large's forward spent ~580 us of host time per call
against ~470-575 us of kernel, and nequip_water's views and checks alone took 241 us.
Passing the whole ``(batch, dim)`` rows (and the flat weight vector) instead leaves a
handful of launch arguments and no views; the column arithmetic moves into the kernel,
where it is integer adds on tile indices that Triton folds.

``flatten_kernels`` does this as a pure text rewrite of the rendered kernels (the
emitters and the template stay in view terms, which is how the paths read):

* ``V[b, i1, ..., ik]`` becomes ``B[b, col]`` (``B[col]`` for an unbatched view, i.e.
  shared weights), where ``col = offset + sum_j ij * stride_j`` over the view's row-major
  shape. Literal indices fold into the constant; each tile (``tile_c`` ->
  ``tile_c.index``) and each ``hl.arange(n)`` keeps its own axis, broadcast with
  ``None`` in the others, so the result has the view access's shape. Helion still masks
  each tile's out-of-range lanes (it tracks the tile behind ``tile.index``), and the
  padded component lanes keep their ``extra_mask``.
* ``hl.load(V, [...])`` / ``hl.store(V, [...], ...)`` / ``hl.atomic_add(V, [...], ...)``
  get the same index rewrite; ``V.size(0)`` and ``V.dtype`` become ``B.size(0)`` /
  ``B.dtype``.
* The row index is kept as written: a tile (``tile_b``), a scalar (``node``,
  ``tile_p.id``) or, in the fused convolution, a 1-D index tensor gathered per edge
  (``s_idx = src[tile_b]``, ``eid = order[tile_b]``; the caller names these
  ``gathered``). Helion indexes with a gathered row and a one-axis column as an outer
  product (each 1-D block-sized indexer its own dimension), as it does the view access;
  against a column of two or more axes it would broadcast the indexers together
  instead, so there the gathered row takes the first of ``1 + axes`` broadcast
  dimensions and the column axes the others: ``w[eid, tile_s, tile_r, 0]`` becomes
  ``weights[eid[:, None, None], off + tile_s.index[None, :, None] * R +
  tile_r.index[None, None, :]]``.

Raises ``ValueError`` on an index it does not know how to fold (a generator bug, never
user input: every name here comes from the IR).
"""

from __future__ import annotations

import io
import math
import re
import tokenize
from dataclasses import dataclass

__all__ = ["View", "flatten_kernels", "flat_params"]


@dataclass(frozen=True)
class View:
    """A per-block view ``name`` of tensor ``base``: columns ``offset:offset+prod(shape)``
    of each row (``batched``) or of the vector (shared weights), reshaped to ``shape``."""

    name: str
    base: str
    offset: int
    shape: tuple[int, ...]
    batched: bool

    def __str__(self) -> str:
        rows = ":, " if self.batched else ""
        return f"{self.name} = {self.base}[{rows}{self.offset}:{self.offset + math.prod(self.shape)}].view{self.shape}"


_TILE = re.compile(r"tile_[a-z]+")
_ARANGE = re.compile(r"hl\.arange\(\d+\)")
_INT = re.compile(r"-?\d+")


def flat_params(params: list[str], views: dict[str, View]) -> list[str]:
    """The kernel parameters after the rewrite: each view's base, in order of first use."""
    out: list[str] = []
    for p in params:
        base = views[p].base if p in views else p
        if base not in out:
            out.append(base)
    return out


def _split_top(s: str) -> list[str]:
    """``s`` split at its top-level commas (outside brackets and parentheses)."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced bracket at {start}")


def _flat_index(view: View, index: str, gathered: frozenset[str] = frozenset()) -> str:
    """The rewritten index list (without brackets) of ``view[index]``; ``gathered``: row
    indices that are 1-D index tensors (see the module docstring)."""
    items = _split_top(index)
    head, rest = (items[:1], items[1:]) if view.batched else ([], items)
    if len(rest) != len(view.shape):
        raise ValueError(f"{view.name}[{index}]: {len(rest)} indices for shape {view.shape}")
    strides = [math.prod(view.shape[j + 1:]) for j in range(len(view.shape))]
    const, axes = view.offset, []
    for item, stride in zip(rest, strides):
        if _INT.fullmatch(item):
            const += int(item) * stride
        elif _TILE.fullmatch(item):
            axes.append((f"{item}.index", stride))
        elif _ARANGE.fullmatch(item):
            axes.append((item, stride))
        else:
            raise ValueError(f"{view.name}[{index}]: cannot fold index {item!r}")
    lead = 1 if head and head[0] in gathered and len(axes) > 1 else 0  # a broadcast row dim
    ndim = lead + len(axes)

    def bcast(pos: int) -> str:
        return "" if ndim == 1 else "[" + ", ".join(":" if i == pos else "None" for i in range(ndim)) + "]"

    if lead:
        head = [f"{head[0]}{bcast(0)}"]
    terms = [str(const)] if const or not axes else []
    for a, (expr, stride) in enumerate(axes):
        terms.append(f"{expr}{bcast(lead + a)}" + (f" * {stride}" if stride != 1 else ""))
    return ", ".join(head + [" + ".join(terms)])


def _prose_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of the comments and string literals of ``text`` (Python
    source): a view's name there (a spec path in the header, a docstring) is left alone."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            spans.append((starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]))
    return spans


def flatten_kernels(text: str, views: dict[str, View], gathered: frozenset[str] = frozenset()) -> str:
    """``text`` (kernel bodies) with every access through a view of ``views`` rewritten to
    its base tensor; ``gathered``: the names of row indices that are 1-D index tensors
    rather than tiles or scalars. See the module docstring."""
    if not views:
        return text
    names = "|".join(re.escape(n) for n in sorted(views, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.])({names})(?![\w])")
    skip = _prose_spans(text)
    out, pos = [], 0
    while True:
        m = pattern.search(text, pos)
        if m is None:
            out.append(text[pos:])
            return "".join(out)
        prose = next(((a, b) for a, b in skip if a <= m.start() < b), None)
        if prose is not None:  # a comment or string (header paths, docstrings) is not code
            out.append(text[pos:prose[1]])
            pos = prose[1]
            continue
        view = views[m.group(1)]
        out.append(text[pos:m.start()])
        after = m.end()
        if text.startswith("[", after):  # V[...]
            end = _closing(text, after)
            out.append(f"{view.base}[{_flat_index(view, text[after + 1:end], gathered)}]")
            pos = end + 1
        elif text.startswith(", [", after) and re.search(r"hl\.(load|store|atomic_add)\($", text[:m.start()]):
            end = _closing(text, after + 2)
            out.append(f"{view.base}, [{_flat_index(view, text[after + 3:end], gathered)}]")
            pos = end + 1
        elif text.startswith(".size(", after) or text.startswith(".dtype", after):
            out.append(view.base)
            pos = after
        else:
            raise ValueError(f"unexpected use of view {view.name}: {text[m.start():m.start() + 60]!r}")
