"""Fused backward of a channelwise or fully connected product: ``dF/dx1``, ``dF/dx2`` and ``dF/dW`` in one pass.

The three backward families (``kernels``) each read the output cotangent ``g``, by far
the largest operand of a channelwise product (mace_large: 35 KB of ``g`` per row against
4.6 KB of ``x1`` and 8.7 KB of weights), and together read it three times, ``x1`` and
``W`` twice. They ran at 439 + 481 + 419 us for mace_large at 20,000 rows on the H100
(2026-11-23), against a floor of about 420 us for all three (each operand read once,
each gradient written once). A fused kernel reads every operand once.

Eligible (``eqdsl.analysis.fused_bwd_reason`` with ``FUSED_MODES`` is None): per-batch
weights, every path ``uvu`` or ``uvw``, weighted, with a one-channel ``x2`` block: how
MACE, NequIP, Nequix and SevenNet build their interactions (``uvu``, the channelwise rows
of ``docs/problems.md``), and DiffDock's and e3tools' fully connected edge products
(``uvw``, whose per-row weights are the largest operand: diffdock_l2 reads 28.5 KB of
``W`` per row against 0.6 KB of ``g``; separately, ``dF/dx1`` and ``dF/dx2`` each read it,
and ``dF/dW`` writes as much). A ``uvw`` path loops over its output channel inside the
channel tile (``_Fused._path_uvw``): each ``(rows, u, w)`` weight tile is read once,
contracted with ``g`` for the ``x1`` and ``x2`` gradients, and its gradient (an outer
product of the ``x1 x2`` products and ``g``) written in the same step. On the H200
(2026-11-28, 20,000 rows, float32) that took e3tools_conv's backward from 3 kernels and
790 us to 351 us, diffdock_l2's from 951 to 627 (one kernel per ``x1`` block: one for
all spilled). Then for a ``uvu`` path ``p`` (``x1`` block ``a``, ``x2`` block ``s``,
output block ``o``, channel ``u``)::

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
    RADIAL_LOCAL, TILE_B, TP_OPERANDS, Operands, block_access, block_b, block_label, config, element_access, is_native,
    native_store, path_comment, pow2, radial_features_load, radial_weight_tile, split_costs, tile_load,
)
from .printer import (
    Access, Arange, Assign, AtomicAdd, Comment, Loop, Read, Stmt, Store, Tile, TileId, Zeros, plural, print_stmts,
    ranges, sum_expr,
)
from .tuning import Tuning

__all__ = ["FUSED_MODES", "fused_bwd_kernels"]

# The path modes the fused kernel implements (``eqdsl.analysis.fused_bwd_reason``'s ``modes``).
# conv_radial's fused backward forms (rows, channel tile) weight tiles only: ``uvu``.
FUSED_MODES = frozenset({"uvu", "uvw"})


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
            "block_b": block_b(t, self._elems_3d(blocks_in1)),
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

    def _elems_3d(self, blocks_in1: list[int]) -> int:
        """Elements per row of the largest ``(rows, u, w)`` weight tile (``uvw`` paths), or 0."""
        t = self.t
        return max((min(pow2(self.ir.in1[a].mul), t.block_c) * min(pow2(self.ir.out[p.i_out].mul), t.block_r)
                    for a in blocks_in1 for p in self.paths_of[a] if p.mode == "uvw"), default=0)

    def _sb(self, s: int, j: int) -> str:
        """The per-row scalar ``x2[row, block s, component j]`` (a ``(rows, 1)`` tile), loaded once."""
        name = f"sb{s}_{j}"
        if name not in self.scalars:
            self.tensors.add("x2")
            access = block_access(self.ir, self.ops.tensor("x2"), self.ops.row("x2"), "x2", s, j, 0, False)
            self.scalars[name] = Assign(name, Read(access, "[:, None]"))
        return name

    def _path(self, p: PathIR, touched: set, partials: list, stores: list, gi: int) -> list[Stmt]:
        """Statements of path ``p`` in the channel tile: its ``g`` tile, weight, and the three updates.

        The ``gx2`` partials are named per channel group ``gi``: a name assigned in one channel
        loop and again in the next would be loop-carried there (its tile shape may differ).
        """
        ir, ops = self.ir, self.ops
        a, s, o = p.i_in1, p.i_in2, p.i_out
        bo = ir.out[o]
        if p.mode == "uvw":
            return self._path_uvw(p, touched, partials, gi)
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

        sb = self._sb
        lines.append(Assign(f"gwv{p.index}", sum_expr([(n.coeff, [sb(s, n.j), f"a{a}_{n.i}", f"g{o}_{n.k}"])
                                                       for n in p.nonzeros])))
        stores.append(Store(Access(ops.tensor("gw"), ops.row("w"), p.weight_offset, ((Tile("tile_c"), shape[1]),)),
                            f"gwv{p.index}"))
        return lines + self._input_updates(p, touched, partials, gi, "wg")

    def _input_updates(self, p: PathIR, touched: set, partials: list, gi: int, vec: str) -> list[Stmt]:
        """``gx1`` and ``gx2`` updates of path ``p`` from its per-component ``(rows, channel tile)``
        tiles ``{vec}{p}_{k}``: ``W * g`` (``uvu``, ``wg``) or ``sum_w W[u, w] g[w, k]`` (``uvw``,
        ``acch``: accumulated over the output-channel loop)::

            acc{a}_{i}      += sum_{j,k} C[i,j,k] x2_j v_k
            px2_{gi}_{s}_{j} += sum_{i,k} C[i,j,k] a_i v_k
        """
        a, s = p.i_in1, p.i_in2
        lines: list[Stmt] = []
        by_i: dict[int, list] = {}
        by_j: dict[int, list] = {}
        for n in p.nonzeros:
            by_i.setdefault(n.i, []).append(n)
            by_j.setdefault(n.j, []).append(n)
        for i, nzs in sorted(by_i.items()):
            s_ = sum_expr([(n.coeff, [self._sb(s, n.j), f"{vec}{p.index}_{n.k}"]) for n in nzs])
            acc = f"acc{a}_{i}"
            lines.append(Assign(acc, f"{acc} + {s_}" if i in touched else s_))
            touched.add(i)
        for j, nzs in sorted(by_j.items()):
            s_ = sum_expr([(n.coeff, [f"a{a}_{n.i}", f"{vec}{p.index}_{n.k}"]) for n in nzs])
            name = f"px2_{gi}_{s}_{j}"
            if (s, j) in partials:
                lines.append(Assign(name, f"{name} + {s_}"))
            else:
                partials.append((s, j))
                lines.append(Assign(name, s_))
            self.x2_used.add((s, j))
        return lines

    def _path_uvw(self, p: PathIR, touched: set, partials: list, gi: int) -> list[Stmt]:
        """Path ``p`` (``uvw``, weights ``W[u, w]`` per row, ``u`` the tiled ``x1`` channel) in the
        channel tile: a loop over tiles of the output channel ``w`` reads each ``(rows, u, w)``
        weight tile once and writes its gradient there::

            pk_k[b, u]    = sum_{i,j} C[i,j,k] a_i[b, u] x2_j[b]           (before the loop)
            for tile_r in hl.tile(W):                                     (w)
                acch_k[b, u] += sum_w W[b, u, w] g_k[b, w]
                gW[b, u, w]   = sum_k pk_k[b, u] g_k[b, w]                 (stored in the loop)
            then the gx1 / gx2 updates of ``_input_updates`` from acch_k.

        ``gW`` is stored inside the loop (each weight tile's gradient is final there), so
        unlike ``uvu``'s it does not wait for the channel tile's last load.
        """
        ir, ops, t = self.ir, self.ops, self.t
        a, s, o = p.i_in1, p.i_in2, p.i_out
        mul_w = ir.out[o].mul
        ks = sorted({n.k for n in p.nonzeros})
        lines: list[Stmt] = []
        for k in ks:
            terms = [(n.coeff, [f"a{a}_{n.i}", self._sb(s, n.j)]) for n in p.nonzeros if n.k == k]
            lines.append(Assign(f"pk{p.index}_{k}", sum_expr(terms)))
            lines.append(Assign(f"acch{p.index}_{k}", Zeros("[tile_b, tile_c]", ops.tensor("gx1"))))
        self.tensors.update(("w", "g"))
        g_local = f"r{p.index}g{o}"
        native_g = is_native(self.native, ir.out[o])  # one load of all components, split on chip
        body: list[Stmt] = [st for k in ([0] if native_g else ks)
                            for st in tile_load(ir, ops.tensor("g"), ops.row("g"), "g", o, k, self.native, g_local,
                                                "tile_r")[1]]
        index = {"u": Tile("tile_c"), "v": 0, "w": Tile("tile_r")}
        weights = element_access(ops.tensor("w"), ops.row("w"), p.weight_offset, tuple(p.path_shape),
                                 tuple(index[x] for x in "uvw"))
        body.append(Assign(f"wr{p.index}", Read(weights)))
        for k in ks:
            h = f"acch{p.index}_{k}"
            body.append(Assign(h, f"{h} + ({g_local}_{k}[:, None, :] * wr{p.index}).sum(2)"))
        grad = sum_expr([(1.0, [f"pk{p.index}_{k}[:, :, None]", f"{g_local}_{k}[:, None, :]"]) for k in ks])
        gw = element_access(ops.tensor("gw"), ops.row("w"), p.weight_offset, tuple(p.path_shape),
                            tuple(index[x] for x in "uvw"))
        body.append(Store(gw, grad))
        lines.append(Loop(f"tile_r in hl.tile({mul_w}, block_size={min(pow2(mul_w), t.block_r)})", tuple(body)))
        return lines + self._input_updates(p, touched, partials, gi, "acch")
