"""Fused backward of a channelwise tensor product: ``dF/dx1``, ``dF/dx2`` and ``dF/dW`` in one pass.

The three backward families (``helion_backend``) each read the output cotangent ``g``,
by far the largest operand of a channelwise product (mace_large: 35 KB of ``g`` per row
against 4.6 KB of ``x1`` and 8.7 KB of weights), and together read it three times,
``x1`` and ``W`` twice. They ran at 439 + 481 + 419 us for mace_large at 20,000 rows on
the H100 (2026-11-23), against a floor of about 420 us for all three (each operand read
once, each gradient written once). A fused kernel reads every operand once.

Eligible (``fused_bwd_reason`` is None): per-batch weights, every path ``uvu``, weighted,
with a one-channel ``x2`` block, which is how MACE, NequIP, Nequix and SevenNet build
their interactions (the channelwise rows of ``docs/problems.md``). Then for path ``p`` (``x1`` block
``a``, ``x2`` block ``s``, output block ``o``, channel ``u``)::

    gx1[b, a, u, i] += sum_{j,k} C[i,j,k] W[b, p, u] x2[b, s, j] g[b, o, u, k]
    gW[b, p, u]      = sum_{i,j,k} C[i,j,k] x1[b, a, u, i] x2[b, s, j] g[b, o, u, k]
    gx2[b, s, j]    += sum_{u,i,k} C[i,j,k] W[b, p, u] x1[b, a, u, i] g[b, o, u, k]

The first two are per channel; the third sums over channels. A kernel owns whole ``x1``
blocks (``gx1`` needs every path of its block) and the paths out of them::

    for tile_b in hl.tile(batch):                  # the grid: batch tiles
        sb<s>_<j> = x2[tile_b, j]                  # per-row scalars
        accx2_<j> = zeros([tile_b])                  # gx2, summed over channel tiles
        for tile_c in hl.tile(M):                  # per multiplicity of the kernel's x1 blocks
            <x1 tiles of the blocks>
            per path: <g tile>, wt = W[tile_b, p, tile_c], wg_k = wt * g_k
                      gw<p> = sum C a_i sb_j g_k;  gx1 acc_i += C sb_j wg_k;
                      px2_j += C a_i wg_k         # (batch, channel) partial sums
            <stores: gx1 blocks, gw of each path>  # after every load of the tile
            accx2_j += px2_j.sum(1)                  # one cross-lane sum per tile and component
        gx2[tile_b, j] = accx2_j

Stores come after the tile's last load: Triton keeps the program order of loads and
stores to tensors it cannot prove distinct (``Tuning.hoist_weights``). ``max_terms``
(of the op ``bwd``'s tuning) groups ``x1`` blocks into kernels. With ``grid_c`` a kernel
whose blocks share one multiplicity of several channel tiles makes them a second grid
axis (as ``helion_backend._grid_c``); each program then writes its own ``gx2`` partial
sums. Where there is more than one partial-sum row per batch row (several kernels, or
channel tiles on the grid), they go to the columns ``part * dim_in2`` of a ``(batch,
parts * dim_in2)`` buffer and the op sums them: deterministic, no atomics. The ``gx2``
stores are written as whole-row columns here (not per-block views): a grid program's
column depends on its channel tile (``tile_c.id``).
"""

from __future__ import annotations

from ..ir import PathIR, TensorProductIR
from .helion_backend import (
    Tuning,
    _block_b,
    _block_label,
    _config,
    _is_native,
    _native_store,
    _path_comment,
    _plural,
    _pow2,
    _ranges,
    _split,
    _sum,
    _tile_load,
)

__all__ = ["fused_bwd_reason", "fused_bwd_kernels", "GX2_PARTIALS"]

GX2_PARTIALS = "gx2p"  # the (batch, kernels * dim_in2) buffer of per-kernel gx2 partial sums


def fused_bwd_reason(ir: TensorProductIR) -> str | None:
    """Why ``ir`` gets no fused backward kernel, or None when it does (see the module docstring)."""
    if ir.shared_weights:
        return "shared weights (the weight gradient is a sum over the batch)"
    for p in ir.paths:
        if p.mode != "uvu" or not p.has_weight:
            return f"path {p.index} is not a weighted uvu path"
        if ir.in2[p.i_in2].mul != 1:
            return f"path {p.index}'s x2 block has {ir.in2[p.i_in2].mul} channels, not 1"
    return None


def fused_bwd_kernels(ir: TensorProductIR, tuning: Tuning, native: bool) -> list[dict]:
    """Kernel contexts (``kind: fused``) of the fused backward, ``x1`` blocks grouped by ``max_terms``.

    Each kernel writes ``parts`` rows of ``gx2`` partial sums (one, or one per channel
    tile when its channel tiles are a grid axis, ``Tuning.grid_c``); with more than one in
    all they go to the ``(batch, parts * dim_in2)`` buffer ``gx2p``, summed by the op.
    """
    paths_of = {a: [p for p in ir.paths if p.i_in1 == a and p.nonzeros] for a in range(len(ir.in1))}
    # three multiply-adds per nonzero (one per gradient)
    costs = [3 * sum(len(p.nonzeros) for p in paths_of[a]) for a in range(len(ir.in1))]
    groups = [[a for a in g if paths_of[a]] for g in _split(costs, tuning)]
    groups = [g for g in groups if g]
    parts = []
    for g in groups:
        muls = {ir.in1[a].mul for a in g}
        mul = muls.pop()
        block_c = min(_pow2(mul), tuning.block_c)
        # grid_c as in helion_backend._grid_c: one multiplicity of more than one tile
        parts.append(-(-mul // block_c) if tuning.grid_c and not muls and mul > block_c else 1)
    total = sum(parts)
    return [
        _kernel(ir, idx, g, paths_of, tuning, native, parts[idx] > 1, sum(parts[:idx]) if total > 1 else None)
        | {"parts": parts[idx]}
        for idx, g in enumerate(groups)
    ]


def _kernel(ir: TensorProductIR, index: int, blocks_in1: list[int], paths_of: dict[int, list[PathIR]],
            tuning: Tuning, native: bool, grid_c: bool, part: int | None) -> dict:
    """One kernel; ``part``: its first row of ``gx2`` partial sums in ``gx2p``, or None
    (the only kernel, one part: it writes ``gx2`` itself)."""
    t = tuning
    params = {"x1": set(), "x2": set(), "g": set(), "w": set(), "gx1": set(), "gw": set()}
    scalars: dict[str, str] = {}
    x2_used: set[tuple[int, int]] = set()
    gx2 = "gx2" if part is None else GX2_PARTIALS

    def gx2_col(s: int, j: int) -> str:
        col = ir.in2[s].offset + j + (0 if part is None else part * ir.dim_in2)
        return f"{col} + tile_c.id * {ir.dim_in2}" if grid_c else str(col)

    by_mul: dict[int, list[int]] = {}
    for a in blocks_in1:
        by_mul.setdefault(ir.in1[a].mul, []).append(a)
    channel_groups = []
    for gi, (mul, blocks) in enumerate(by_mul.items()):
        lines: list[str] = []
        stores: list[str] = []
        partials: list[tuple[int, int]] = []
        for a in blocks:
            ba = ir.in1[a]
            params["x1"].add(a)
            params["gx1"].add(a)
            lines.append(f"# x1 block {a}: {_block_label(ba)} ({_plural(len(paths_of[a]), 'path')})")
            lines += _tile_load(ir, "x1", a, 0, native, f"a{a}", "tile_c")[1] if _is_native(native, ba) else [
                line for m in range(ba.dim) for line in _tile_load(ir, "x1", a, m, native, f"a{a}", "tile_c")[1]
            ]
            accs = {i: f"acc{a}_{i}" for i in range(ba.dim)}
            touched: set[int] = set()
            for p in paths_of[a]:
                lines.append(_path_comment(ir, p))
                lines += _path(ir, p, native, scalars, x2_used, params, touched, partials, stores, gi)
            for i in range(ba.dim):
                if i not in touched:
                    lines.append(f"{accs[i]} = hl.zeros([tile_b, tile_c], dtype=gx1_{a}.dtype)")
            out = [accs[i] for i in range(ba.dim)]
            if _is_native(native, ba):
                stores += _native_store(f"gx1_{a}", out, ba.dim)
            else:
                stores += [f"gx1_{a}[tile_b, {i}, tile_c] = {acc}" for i, acc in enumerate(out)]
        if grid_c:  # this program's channel tile has its own partial-sum row
            sums = [f"{gx2}[tile_b, {gx2_col(s, j)}] = px2_{gi}_{s}_{j}.sum(1)" for s, j in partials]
        else:
            sums = [f"accx2_{s}_{j} = accx2_{s}_{j} + px2_{gi}_{s}_{j}.sum(1)" for s, j in partials]
        channel_groups.append({"mul": mul, "block_c": min(_pow2(mul), t.block_c), "lines": lines + stores + sums})
    used = sorted(x2_used)
    param_list = (
        [f"x1_{a}" for a in sorted(params["x1"])]
        + [f"x2_{s}" for s in sorted({s for s, _ in used})]
        + [f"g_{o}" for o in sorted(params["g"])]
        + [f"w{p}" for p in sorted(params["w"])]
        + [f"gx1_{a}" for a in sorted(params["gx1"])]
        + [gx2]
        + [f"gw{p}" for p in sorted(params["gw"])]
    )
    path_ids = sorted(p.index for a in blocks_in1 for p in paths_of[a])
    return {
        "name": f"tp_bwd_fused_{index}",
        "kind": "fused",
        "doc": (
            f"Fused backward (dF/dx1, dF/dx2, dF/dW): x1 blocks {_ranges(sorted(blocks_in1))}; "
            f"paths {_ranges(path_ids)}."
        ),
        "params": param_list,
        "batch_param": param_list[0],
        "block_b": _block_b(t, 0),
        "num_warps": t.num_warps,
        "num_stages": t.num_stages,
        "config": _config(t),
        "triton_options": "",
        "scalars": [f"{name} = {expr}" for name, expr in sorted(scalars.items())],
        "init": [] if grid_c else [f"accx2_{s}_{j} = hl.zeros([tile_b], dtype={gx2}.dtype)" for s, j in used],
        "channel_groups": channel_groups,
        "final": [] if grid_c else [f"{gx2}[tile_b, {gx2_col(s, j)}] = accx2_{s}_{j}" for s, j in used],
        "grid_c": grid_c,
        "blocks_in1": sorted(blocks_in1),
        "x2_cols": sorted(ir.in2[s].offset + j for s, j in used),
    }


def _path(ir, p: PathIR, native: bool, scalars: dict, x2_used: set, params: dict, touched: set,
          partials: list, stores: list, gi: int) -> list[str]:
    """Lines of path ``p`` in the channel tile: its ``g`` tile, weight, and the three updates.

    The ``gx2`` partials are named per channel group ``gi``: a name assigned in one channel
    loop and again in the next would be loop-carried there (its tile shape may differ).
    """
    a, s, o = p.i_in1, p.i_in2, p.i_out
    bo = ir.out[o]
    params["g"].add(o)
    params["w"].add(p.index)
    params["gw"].add(p.index)
    lines = []
    if _is_native(native, bo):
        lines += _tile_load(ir, "g", o, 0, native, f"g{o}", "tile_c")[1]
    else:
        ks = sorted({n.k for n in p.nonzeros})
        lines += [line for k in ks for line in _tile_load(ir, "g", o, k, native, f"g{o}", "tile_c")[1]]
    # uvu: W[u, v] with v the one channel of x2
    lines.append(f"wt{p.index} = w{p.index}[tile_b, tile_c, 0]")
    for k in sorted({n.k for n in p.nonzeros}):
        lines.append(f"wg{p.index}_{k} = wt{p.index} * g{o}_{k}")

    def sb(j: int) -> str:
        name = f"sb{s}_{j}"
        scalars.setdefault(name, f"x2_{s}[tile_b, {j}, 0][:, None]")
        return name

    lines.append(f"gwv{p.index} = " + _sum([(n.coeff, [sb(n.j), f"a{a}_{n.i}", f"g{o}_{n.k}"]) for n in p.nonzeros]))
    stores.append(f"gw{p.index}[tile_b, tile_c, 0] = gwv{p.index}")
    by_i: dict[int, list] = {}
    by_j: dict[int, list] = {}
    for n in p.nonzeros:
        by_i.setdefault(n.i, []).append(n)
        by_j.setdefault(n.j, []).append(n)
    for i, nzs in sorted(by_i.items()):
        s_ = _sum([(n.coeff, [sb(n.j), f"wg{p.index}_{n.k}"]) for n in nzs])
        acc = f"acc{a}_{i}"
        lines.append(f"{acc} = {acc} + {s_}" if i in touched else f"{acc} = {s_}")
        touched.add(i)
    for j, nzs in sorted(by_j.items()):
        s_ = _sum([(n.coeff, [f"a{a}_{n.i}", f"wg{p.index}_{n.k}"]) for n in nzs])
        name = f"px2_{gi}_{s}_{j}"
        if (s, j) in partials:
            lines.append(f"{name} = {name} + {s_}")
        else:
            partials.append((s, j))
            lines.append(f"{name} = {s_}")
        x2_used.add((s, j))
    return lines
