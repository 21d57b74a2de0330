"""Fused backward of a channelwise tensor product: ``dF/dx1``, ``dF/dx2`` and ``dF/dW`` in one pass.

The three backward families (``kernels``) each read the output cotangent ``g``, by far
the largest operand of a channelwise product (mace_large: 35 KB of ``g`` per row against
4.6 KB of ``x1`` and 8.7 KB of weights), and together read it three times, ``x1`` and
``W`` twice. They ran at 439 + 481 + 419 us for mace_large at 20,000 rows on the H100
(2026-11-23), against a floor of about 420 us for all three (each operand read once,
each gradient written once). A fused kernel reads every operand once.

Eligible (``eqdsl.analysis.fused_bwd_reason`` is None): per-batch weights, every path
``uvu``, weighted, with a one-channel ``x2`` block, which is how MACE, NequIP, Nequix
and SevenNet build their interactions (the channelwise rows of ``docs/problems.md``).
Then for path ``p`` (``x1`` block ``a``, ``x2`` block ``s``, output block ``o``, channel
``u``)::

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
axis (as ``kernels.grid_c``); each program then writes its own ``gx2`` partial sums.
Where there is more than one partial-sum row per batch row (several kernels, or channel
tiles on the grid), they go to the columns ``part * dim_in2`` of a ``(batch, parts *
dim_in2)`` buffer and the op sums them: deterministic, no atomics. A grid program's
column there depends on its channel tile (``tile_c.id``).

The convolution's fused backward is the same kernel with the convolution's
``Operands`` (``conv``): ``x`` gathered by ``src``, ``G`` by ``dst``, ``y`` / ``W`` /
``gy`` / ``gw`` per edge, ``gx`` scattered into ``src`` with ``hl.atomic_add``.
"""

from __future__ import annotations

from ...ir import PathIR, TensorProductIR
from .kernels import (
    RADIAL_LOCAL, TILE_B, TP_OPERANDS, Operands, block_access, block_b, block_label, config, is_native, native_store,
    path_comment, pow2, radial_features_load, radial_weight_tile, split_costs, tile_load,
)
from .printer import (
    Access, Arange, Assign, AtomicAdd, Comment, Read, Stmt, Store, Tile, TileId, Zeros, plural, print_stmts, ranges,
    sum_expr,
)
from .tuning import Tuning

__all__ = ["fused_bwd_kernels"]


def fused_bwd_kernels(ir: TensorProductIR, tuning: Tuning, native: bool, ops: Operands = TP_OPERANDS,
                      grads: str = "dF/dx1, dF/dx2, dF/dW", prefix: str = "tp") -> list[dict]:
    """Kernel contexts (``kind: fused``) of the fused backward, ``x1`` blocks grouped by ``max_terms``.

    Each kernel writes ``parts`` rows of ``gx2`` partial sums (one, or one per channel
    tile when its channel tiles are a grid axis, ``Tuning.grid_c``); with more than one in
    all they go to the ``(batch, parts * dim_in2)`` buffer ``gx2p`` (the ``Operands``
    role; the convolution's ``gyp``), summed by the op. ``ops``: how operands are
    addressed (``kernels.Operands``: the tensor product's, or the convolution's gathers
    and ``gx1`` scatter); ``grads``: the docstrings' list of what is computed; kernels are
    named ``<prefix>_bwd_fused_<n>``.
    """
    paths_of = {a: [p for p in ir.paths if p.i_in1 == a and p.nonzeros] for a in range(len(ir.in1))}
    # three multiply-adds per nonzero (one per gradient)
    costs = [3 * sum(len(p.nonzeros) for p in paths_of[a]) for a in range(len(ir.in1))]
    groups = [[a for a in g if paths_of[a]] for g in split_costs(costs, tuning)]
    groups = [g for g in groups if g]
    parts = []
    for g in groups:
        muls = {ir.in1[a].mul for a in g}
        mul = muls.pop()
        block_c = min(pow2(mul), tuning.block_c)
        # grid_c as in kernels.grid_c: one multiplicity of more than one tile
        parts.append(-(-mul // block_c) if tuning.grid_c and not muls and mul > block_c else 1)
    total = sum(parts)
    return [
        _Fused(ir, tuning, native, ops, paths_of).kernel(f"{prefix}_bwd_fused_{idx}", g, parts[idx] > 1,
                                                         sum(parts[:idx]) if total > 1 else None, grads)
        | {"parts": parts[idx]}
        for idx, g in enumerate(groups)
    ]


class _Fused:
    def __init__(self, ir: TensorProductIR, tuning: Tuning, native: bool, ops: Operands, paths_of: dict):
        self.ir, self.t, self.native, self.ops, self.paths_of = ir, tuning, native, ops, paths_of
        self.scalars: dict[str, Stmt] = {}
        self.x2_used: set[tuple[int, int]] = set()
        self.tensors: set[str] = set()

    def _load(self, op: str, blk: int, m: int, local: str) -> list[Stmt]:
        self.tensors.add(op)
        return tile_load(self.ir, self.ops.tensor(op), self.ops.row(op), op, blk, m, self.native, local, "tile_c")[1]

    def kernel(self, name: str, blocks_in1: list[int], grid_c: bool, part: int | None, grads: str) -> dict:
        """One kernel; ``part``: its first row of ``gx2`` partial sums in ``gx2p``, or None
        (the only kernel, one part: it writes ``gx2`` itself)."""
        ir, t, ops = self.ir, self.t, self.ops
        gx2 = ops.tensor("gx2" if part is None else "gx2p")
        gx1 = ops.tensor("gx1")

        def gx2_col(s: int, j: int) -> Access:
            col = ir.in2[s].offset + j + (0 if part is None else part * ir.dim_in2)
            return Access(gx2, ops.row("x2"), col, ((TileId("tile_c"), ir.dim_in2),) if grid_c else ())

        by_mul: dict[int, list[int]] = {}
        for a in blocks_in1:
            by_mul.setdefault(ir.in1[a].mul, []).append(a)
        channel_groups = []
        for gi, (mul, blocks) in enumerate(by_mul.items()):
            lines: list[Stmt] = []
            stores: list[Stmt] = []
            partials: list[tuple[int, int]] = []
            for a in blocks:
                ba = ir.in1[a]
                lines.append(Comment(f"x1 block {a}: {block_label(ba)} ({plural(len(self.paths_of[a]), 'path')})"))
                lines += self._load("x1", a, 0, f"a{a}") if is_native(self.native, ba) else [
                    s for m in range(ba.dim) for s in self._load("x1", a, m, f"a{a}")
                ]
                accs = {i: f"acc{a}_{i}" for i in range(ba.dim)}
                touched: set[int] = set()
                for p in self.paths_of[a]:
                    lines.append(path_comment(ir, p))
                    lines += self._path(p, touched, partials, stores, gi)
                for i in range(ba.dim):
                    if i not in touched:
                        lines.append(Assign(accs[i], Zeros("[tile_b, tile_c]", gx1)))
                out = [accs[i] for i in range(ba.dim)]
                if is_native(self.native, ba):
                    access = block_access(ir, gx1, TILE_B, "x1", a, Arange(pow2(ba.dim)), Tile("tile_c"), True)
                    stores += native_store(access, out, ba.dim)
                elif ops.scatter == "atomic":
                    stores += [AtomicAdd(block_access(ir, gx1, ops.scatter_row, "x1", a, i, Tile("tile_c"), False), acc)
                               for i, acc in enumerate(out)]
                else:
                    stores += [Store(block_access(ir, gx1, TILE_B, "x1", a, i, Tile("tile_c"), False), acc)
                               for i, acc in enumerate(out)]
            if grid_c:  # this program's channel tile has its own partial-sum row
                sums = [Store(gx2_col(s, j), f"px2_{gi}_{s}_{j}.sum(1)") for s, j in partials]
            else:
                sums = [Assign(f"accx2_{s}_{j}", f"accx2_{s}_{j} + px2_{gi}_{s}_{j}.sum(1)") for s, j in partials]
            channel_groups.append({"mul": mul, "block_c": min(pow2(mul), t.block_c),
                                   "lines": print_stmts(lines + stores + sums)})
        used = sorted(self.x2_used)
        params = [ops.tensor(r) for r in ("x1", "x2", "g") if r in self.tensors]
        params += (ops.weight_params() if "w" in self.tensors else []) + [gx1, gx2, ops.tensor("gw")]
        path_ids = sorted(p.index for a in blocks_in1 for p in self.paths_of[a])
        return {
            "name": name,
            "kind": "fused",
            "doc": f"Fused backward ({grads}): x1 blocks {ranges(sorted(blocks_in1))}; paths {ranges(path_ids)}.",
            "params": params,
            "batch_param": params[0],
            "block_b": block_b(t, 0),
            "num_warps": t.num_warps,
            "num_stages": t.num_stages,
            "config": config(t),
            "triton_options": "",
            "scalars": print_stmts(self.scalars[n] for n in sorted(self.scalars)),
            "init": [] if grid_c else print_stmts(Assign(f"accx2_{s}_{j}", Zeros("[tile_b]", gx2)) for s, j in used),
            "channel_groups": channel_groups,
            "final": [] if grid_c else print_stmts(Store(gx2_col(s, j), f"accx2_{s}_{j}") for s, j in used),
            "grid_c": grid_c,
            "blocks_in1": sorted(blocks_in1),
            "x2_cols": sorted(ir.in2[s].offset + j for s, j in used),
        }

    def _path(self, p: PathIR, touched: set, partials: list, stores: list, gi: int) -> list[Stmt]:
        """Statements of path ``p`` in the channel tile: its ``g`` tile, weight, and the three updates.

        The ``gx2`` partials are named per channel group ``gi``: a name assigned in one channel
        loop and again in the next would be loop-carried there (its tile shape may differ).
        """
        ir, ops = self.ir, self.ops
        a, s, o = p.i_in1, p.i_in2, p.i_out
        bo = ir.out[o]
        lines: list[Stmt] = []
        if is_native(self.native, bo):
            lines += self._load("g", o, 0, f"g{o}")
        else:
            ks = sorted({n.k for n in p.nonzeros})
            lines += [st for k in ks for st in self._load("g", o, k, f"g{o}")]
        # uvu: W[u, v] with v the one channel of x2
        self.tensors.add("w")
        shape = tuple(p.path_shape)
        weight = Read(Access(ops.tensor("w"), ops.row("w"), p.weight_offset, ((Tile("tile_c"), shape[1]),)))
        if ops.radial is not None:  # conv_radial: the (rows, channel tile) weights formed on chip
            self.scalars[RADIAL_LOCAL] = radial_features_load(ops)
            weight = radial_weight_tile(ops, weight.access, self.t.block_b, min(pow2(ir.in1[a].mul), self.t.block_c))
        lines.append(Assign(f"wt{p.index}", weight))
        for k in sorted({n.k for n in p.nonzeros}):
            lines.append(Assign(f"wg{p.index}_{k}", f"wt{p.index} * g{o}_{k}"))

        def sb(j: int) -> str:
            name = f"sb{s}_{j}"
            if name not in self.scalars:
                self.tensors.add("x2")
                access = block_access(ir, ops.tensor("x2"), ops.row("x2"), "x2", s, j, 0, False)
                self.scalars[name] = Assign(name, Read(access, "[:, None]"))
            return name

        lines.append(Assign(f"gwv{p.index}", sum_expr([(n.coeff, [sb(n.j), f"a{a}_{n.i}", f"g{o}_{n.k}"])
                                                       for n in p.nonzeros])))
        stores.append(Store(Access(ops.tensor("gw"), ops.row("w"), p.weight_offset, ((Tile("tile_c"), shape[1]),)),
                            f"gwv{p.index}"))
        by_i: dict[int, list] = {}
        by_j: dict[int, list] = {}
        for n in p.nonzeros:
            by_i.setdefault(n.i, []).append(n)
            by_j.setdefault(n.j, []).append(n)
        for i, nzs in sorted(by_i.items()):
            s_ = sum_expr([(n.coeff, [sb(n.j), f"wg{p.index}_{n.k}"]) for n in nzs])
            acc = f"acc{a}_{i}"
            lines.append(Assign(acc, f"{acc} + {s_}" if i in touched else s_))
            touched.add(i)
        for j, nzs in sorted(by_j.items()):
            s_ = sum_expr([(n.coeff, [f"a{a}_{n.i}", f"wg{p.index}_{n.k}"]) for n in nzs])
            name = f"px2_{gi}_{s}_{j}"
            if (s, j) in partials:
                lines.append(Assign(name, f"{name} + {s_}"))
            else:
                partials.append((s, j))
                lines.append(Assign(name, s_))
            self.x2_used.add((s, j))
        return lines
