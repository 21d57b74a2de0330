"""Launches of the generated Pallas kernels: ``pallas_call`` grids, block specs and outputs.

``launch_rows`` / ``launch_weight_sum`` / ``launch_fused`` run the plain product's kernel
sets on row blocks; ``launch_segments`` / ``launch_edges`` / ``conv_backward_fused`` /
``segment_sum_rows`` the fused convolution's, over a ``graph.ConvGraph``. Every call is
traced through ``run`` (inline-PTX ``fma`` on the GPU, ``a * b + c`` in interpret mode).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from .fma import inline_fma
from .tiles import Accumulate, Gather

__all__ = [
    "use_interpret", "compiler_params", "varying_axes", "out_struct", "run", "launch_rows", "launch_weight_sum",
    "launch_fused", "launch_segments", "launch_edges", "conv_backward_fused", "segment_sum_rows",
]

NUM_WARPS = 4
NUM_STAGES = 1
# launch_segments: a conv kernel set of several kernels as one launch over a (node, kernel) grid
SEGMENT_PARTS = True


def use_interpret(interpret: bool | None) -> bool:
    """Explicit choice, else interpret mode exactly when the default backend is the CPU."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)


def compiler_params(interpret: bool, num_warps: int | None = None):
    """Triton compiler parameters (``num_warps``, default ``NUM_WARPS``) for a compiled
    kernel; none in interpret mode. Given also without a GPU: passing them selects the
    Triton lowering of Pallas (jax 0.10 defaults to Mosaic GPU when none are given), so
    that ``jit(...).trace(...).lower(lowering_platforms=("cuda",))`` on a CPU machine runs
    the real Pallas -> Triton lowering (the tests do)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=NUM_WARPS if num_warps is None else num_warps, num_stages=NUM_STAGES)


def varying_axes(operands) -> frozenset:
    """The manual mesh axes (inside ``jax.shard_map`` with ``check_vma=True``) along which
    any of ``operands`` varies; empty elsewhere. Raises ``ValueError`` for an operand that
    is ``unreduced`` or ``reduced`` over an axis (a partial sum pending a collective): the
    kernels are not linear in all operands at once, so it must be reduced first."""
    varying = set()
    for a in operands:
        mat = getattr(jax.typeof(a), "manual_axis_type", None)
        if mat is None:
            continue
        if mat.unreduced or mat.reduced:
            raise ValueError("an operand of the tensor product is unreduced/reduced over mesh axes "
                             f"{sorted(mat.unreduced | mat.reduced)}; reduce it (jax.lax.psum) first")
        varying |= mat.varying
    return frozenset(varying)


def out_struct(shape, dtype, operands) -> jax.ShapeDtypeStruct:
    """The ``out_shape`` of a ``pallas_call`` on ``operands``: ``(shape, dtype)``, varying
    over the mesh axes along which any operand varies.

    Inside ``jax.shard_map`` (default ``check_vma=True``) JAX types every value with the
    manual mesh axes it varies over (``jax.typeof(x).manual_axis_type``) and requires the
    ``out_shape`` of a ``pallas_call`` to say it (``manual_axis_type``, jax 0.10 and 0.11):
    a kernel's output row depends on every operand, so it varies wherever one of them
    does. Outside ``shard_map`` the field is empty and ignored.
    """
    from jax.sharding import ManualAxisType

    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=ManualAxisType(varying=varying_axes(operands)))


def run(call, interpret: bool, *operands):
    """``call(*operands)``, a ``pallas_call``: its kernel is traced here, with ``fma`` as
    inline PTX unless in interpret mode.

    Raises ``ValueError`` in interpret mode on operands that vary over manual mesh axes
    (inside ``jax.shard_map`` with ``check_vma=True``): Pallas' HLO interpreter evaluates
    the kernel's jaxpr, traced without mesh axes, on the varying operands, and the first
    constant in the kernel fails JAX's type check ("Primitive mul requires varying manual
    axes to match", jax 0.10.2; 0.11's interpreter is the same code). Running the
    interpreted call in a ``jax.pure_callback`` instead deadlocked on forced host devices.
    Compiled kernels (the GPU) type-check and run under ``check_vma=True``.
    """
    axes = varying_axes(operands) if interpret else ()
    if axes:
        raise ValueError(
            "Pallas interpret mode cannot run inside jax.shard_map with check_vma=True (JAX's Pallas "
            f"interpreter fails on values varying over mesh axes {sorted(axes)}); on the CPU pass "
            "check_vma=False to jax.shard_map (compiled GPU kernels work with either)")
    with inline_fma(not interpret):
        return call(*operands)


# ------------------------------------------------------------------ kernel launches

# Shared-weight gradients are reduced over the batch with per-program partial sums
# (one row per program, then one sum): deterministic, no atomics. The partial sums of
# one launch hold at most max(REDUCE_MIN_PROGRAMS, REDUCE_PARTIAL_ELEMS // width) rows;
# a larger batch is covered by several launches over consecutive row blocks.
REDUCE_PARTIAL_ELEMS = 1 << 25
REDUCE_MIN_PROGRAMS = 256


def _check_rows(rows: int, block_batch: int) -> None:
    if rows % block_batch:
        raise ValueError(f"rows={rows} is not a multiple of block_batch={block_batch}")


def _concat(pieces):
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)


def _chain(calls, operands, shared: dict[int, object], interpret: bool):
    """Run the ``pallas_call`` builders ``calls`` in order on ``operands``, passing the outputs
    named in ``shared`` (``{output index: BlockSpec}``) from each call to the next, so that
    every kernel writes its own columns of one buffer per shared output (``pallas_kernels``
    ABI 2, ``eqdsl.runtime.pallas_abi``) and no concatenation pass joins them.

    ``calls[i](kernel_wrapper, extra_in_specs, input_output_aliases)`` returns the
    ``pallas_call``; from the second on, the previous call's shared outputs are extra
    operands (after ``operands``) aliased to the same outputs, and the kernel ignores their
    refs (``kernel_wrapper``). The first kernel's buffers start uninitialized: the kernels of
    a set write every column between them. Returns every call's outputs (a tuple each): the
    last one's shared outputs are the finished buffers.
    """
    order = sorted(shared)
    n_in = len(operands)
    outs, every = None, []
    for make in calls:
        if outs is None:
            out = run(make(lambda k: k, [], {}), interpret, *operands)
        else:
            carried = [outs[i] for i in order]
            aliases = {n_in + j: i for j, i in enumerate(order)}

            def skip(kernel, n=len(order)):
                def wrapped(*refs):
                    kernel(*refs[:n_in], *refs[n_in + n:])
                wrapped.__name__ = kernel.__name__
                return wrapped

            out = run(make(skip, [shared[i] for i in order], aliases), interpret, *operands, *carried)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        every.append(outs)
    return every


def launch_rows(name: str, kernels, args, *, out_width: int, shared_arg: int | None, block_batch: int,
                interpret: bool,
                num_warps: int | None = None):
    """Run a kernel set whose output has one row per input row.

    ``args``: ``(rows, width)`` operands, blocked by ``block_batch`` rows, except
    ``args[shared_arg]`` (shared weights, ``(1, width)``), given whole to every program.
    ``kernels``: ``(kernel, first column, width)`` triples; each kernel writes its columns of
    one ``(rows, out_width)`` output (no kernels: zeros). Grid: one program per
    ``block_batch`` rows (per kernel).
    """
    from jax.experimental import pallas as pl

    rows = next(a.shape[0] for i, a in enumerate(args) if i != shared_arg)
    _check_rows(rows, block_batch)
    if not kernels:
        return jnp.zeros((rows, out_width), args[0].dtype)
    row_block = lambda i: (i, 0)  # noqa: E731
    in_specs = [
        pl.BlockSpec((1, a.shape[1]), lambda i: (0, 0)) if k == shared_arg
        else pl.BlockSpec((block_batch, a.shape[1]), row_block)
        for k, a in enumerate(args)
    ]
    out_spec = pl.BlockSpec((block_batch, out_width), row_block)

    def call(kernel):
        return lambda wrap, extra, aliases: pl.pallas_call(
            wrap(kernel),
            out_shape=out_struct((rows, out_width), args[0].dtype, args),
            grid=(rows // block_batch,),
            in_specs=in_specs + extra,
            out_specs=out_spec,
            input_output_aliases=aliases,
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + kernel.__name__,
        )

    return _chain([call(kernel) for kernel, _, _ in kernels], args, {0: out_spec}, interpret)[-1][0]


def launch_weight_sum(name: str, kernels, args, *, out_width: int, block_batch: int, interpret: bool,
                num_warps: int | None = None):
    """Run a ``backward_w`` kernel set with shared weights: every program writes the sum
    over its ``block_batch`` rows as one partial-sum row; the partial sums are added up
    (in a fixed order) to one ``(1, out_width)`` row (no kernels: zeros)."""
    from jax.experimental import pallas as pl

    rows = args[0].shape[0]
    _check_rows(rows, block_batch)
    if not kernels:
        return jnp.zeros((1, out_width), args[0].dtype)
    blocks = rows // block_batch
    pieces = []
    for kernel, _, width in kernels:  # each writes its own partial-sum rows from column 0
        chunk = max(REDUCE_MIN_PROGRAMS, REDUCE_PARTIAL_ELEMS // max(width, 1))
        total = None
        for start in range(0, blocks, chunk):
            n = min(chunk, blocks - start)
            in_specs = [pl.BlockSpec((block_batch, a.shape[1]), lambda i, s=start: (i + s, 0)) for a in args]
            call = pl.pallas_call(
                kernel,
                out_shape=out_struct((n, width), args[0].dtype, args),
                grid=(n,),
                in_specs=in_specs,
                out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
                interpret=interpret,
                compiler_params=compiler_params(interpret, num_warps),
                name=name + kernel.__name__,
            )
            part = jnp.sum(run(call, interpret, *args), axis=0, keepdims=True)
            total = part if total is None else total + part
        pieces.append(total)
    return _concat(pieces)


def launch_fused(name: str, kernels, args, *, dim_in2: int, weight_numel: int, block_batch: int, interpret: bool,
                 num_warps: int | None = None, gx1_segments=None):
    """Run the fused backward kernels (``eqdsl.backends.pallas.fused``) of a channelwise product.

    ``args``: ``(x1, x2, w, g)``, ``(rows, width)`` each (per-row weights), blocked by
    ``block_batch`` rows. ``kernels``: ``(kernel, gx1 width, weight width)`` triples; each
    kernel writes three outputs: its paths' weight-gradient columns of the shared
    ``(rows, weight_numel)`` row (e3nn's order), a whole ``(rows, dim_in2)`` row of ``gx2``
    partial sums, and its ``x1`` blocks' gradient columns: of the shared ``(rows, dim_in1)``
    row when ``gx1_segments`` is None, else its own piece, summed per ``x1`` block over the
    ``gx1_segments`` ranges of the pieces' concatenation. Returns ``(gx1, gx2, gw)``, the
    ``gx2`` partials added in kernel order (deterministic, no atomics).
    """
    from jax.experimental import pallas as pl

    rows = args[0].shape[0]
    _check_rows(rows, block_batch)
    in_specs = [pl.BlockSpec((block_batch, a.shape[1]), lambda i: (i, 0)) for a in args]
    outs = _fused_outputs(name, kernels, args, in_specs, rows=rows, block=block_batch, dim_in2=dim_in2,
                          weight_numel=weight_numel, whole=gx1_segments is None, interpret=interpret,
                          num_warps=num_warps)
    gx1, gx2, gw = _join_fused(outs, gx1_segments is None)
    return _sum_segments(gx1, gx1_segments), gx2, gw


def _fused_outputs(name, kernels, operands, in_specs, *, rows: int, block: int, dim_in2: int, weight_numel: int,
                   whole: bool, interpret: bool, num_warps: int | None, make=lambda kernel: kernel):
    """Run the fused backward ``kernels`` (``(kernel, gx1 width, weight width)``; ``make``
    wraps each for the launch) over ``rows // block`` programs of ``block`` rows: every
    kernel's ``(gx1, gx2, gw)`` (``_chain``), ``gw`` one shared ``(rows, weight_numel)``
    buffer, ``gx1`` one shared buffer too when ``whole``, else each kernel's own piece."""
    from jax.experimental import pallas as pl

    def spec(width):
        return pl.BlockSpec((block, width), lambda i: (i, 0))

    dim_in1 = sum(w1 for _, w1, _ in kernels)
    dtype = operands[-1].dtype

    def call(kernel, width1):
        widths = (dim_in1 if whole else width1, dim_in2, weight_numel)
        return lambda wrap, extra, aliases: pl.pallas_call(
            wrap(make(kernel)),
            out_shape=tuple(out_struct((rows, n), dtype, operands) for n in widths),
            grid=(rows // block,),
            in_specs=in_specs + extra,
            out_specs=tuple(spec(n) for n in widths),
            input_output_aliases=aliases,
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + kernel.__name__,
        )

    shared = {0: spec(dim_in1), 2: spec(weight_numel)} if whole else {2: spec(weight_numel)}
    return _chain([call(kernel, width1) for kernel, width1, _ in kernels], operands, shared, interpret)


def _sum_segments(a, segments):
    """``a`` with its column ranges summed per output block: for each block, the sum of
    ``a[:, start:start + width]`` over its ``(start, width)`` ranges, in order; ``a`` itself
    when ``segments`` is None."""
    if segments is None:
        return a
    blocks = []
    for ranges in segments:
        total = a[:, ranges[0][0]:ranges[0][0] + ranges[0][1]]
        for start, width in ranges[1:]:
            total = total + a[:, start:start + width]
        blocks.append(total)
    return _concat(blocks)


def _join_fused(outs, whole: bool):
    """The fused kernels' ``(gx1, gx2, gw)`` outputs, one triple per kernel (``_fused_outputs``),
    joined: ``gw`` and, when ``whole``, ``gx1`` are the last kernel's (shared) buffers;
    otherwise the ``gx1`` pieces concatenated (to be summed per block: ``_sum_segments``);
    the ``gx2`` partial rows added in kernel order."""
    gx2 = outs[0][1]
    for _, b, _ in outs[1:]:
        gx2 = gx2 + b
    gx1 = outs[-1][0] if whole else _concat([a for a, _, _ in outs])
    return gx1, gx2, outs[-1][2]


class _ShapeOf:
    """Stand-in for an operand ref in ``_body_stores``'s abstract trace: indexing it gives
    zeros of the shape indexing the ref would give (rows ``:`` or an index array; columns
    ``pl.ds`` or an index array)."""

    def __init__(self, ref):
        self.shape, self.dtype = tuple(ref.shape), ref.dtype

    def __getitem__(self, key):
        rows, cols = key
        lead = (self.shape[0],) if isinstance(rows, slice) else tuple(jnp.shape(rows))
        if hasattr(cols, "size") and not hasattr(cols, "shape"):  # a pl.ds slice
            shape = lead + (cols.size,)
        else:
            shape = jnp.broadcast_shapes(lead, tuple(jnp.shape(cols)))
        return jnp.zeros(shape, self.dtype)


def _body_stores(body, ins, shared_arg: int | None, be: int, out_ref):
    """The stores of one edge tile of a reducing ``body``: ``(records, shapes)``, the
    ``_Accumulate`` records (their values abstract) and the stored values' shapes, from
    one abstract trace on stand-in operands (``jax.eval_shape``: nothing is emitted into
    the kernel)."""
    seen = {}

    def run():
        idx, mask = jnp.zeros((be,), jnp.int32), jnp.ones((be,), jnp.bool_)
        ops = [_ShapeOf(r) if k == shared_arg else Gather(_ShapeOf(r), idx, mask) for k, r in enumerate(ins)]
        acc = Accumulate(out_ref)
        body(*ops, acc)
        seen["records"] = acc.records
        return [v for _, _, v in acc.records]

    shapes = jax.eval_shape(run)
    return seen["records"], shapes


def _full_spec(a):
    from jax.experimental import pallas as pl

    nd = a.ndim
    return pl.BlockSpec(tuple(a.shape), lambda *_: (0,) * nd)


def launch_segments(name, kernels, args, *, node_arg: int | None, shared_arg: int | None, perm, rowptr, gather,
                    num_nodes: int, out_width: int, block_edges: int, interpret: bool,
                    num_warps: int | None = None, step_sums: bool = False, parts: bool | None = None):
    """Reduction kernels (``conv`` forward, ``conv`` backward_x1): one program per node ``n``
    sums the kernel body over the edges ``perm[rowptr[n]:rowptr[n + 1]]`` (sorted order), in
    tiles of ``block_edges``. ``args[node_arg]`` (if not None) is a node array gathered by
    ``gather`` (``(rows,)``, in sorted order; edges whose entry is the sentinel
    ``num_nodes`` count for nothing); the others are edge arrays gathered by ``perm``,
    except ``args[shared_arg]`` (shared weights, ``(1, width)``, or ``conv_radial``'s radial
    weight, given whole). ``kernels``: ``(body, first column, width)`` triples, each summing
    into its columns of one ``(num_nodes, out_width)`` output. ``step_sums``: carry each running sum as one row, the tile's
    rows summed every step (for tiles of many edges, whose unreduced running sums would not
    fit in registers), instead of one row per edge of a tile.

    ``parts`` (default ``SEGMENT_PARTS``): a set of several kernels runs as one launch whose
    grid is ``(num_nodes, len(kernels))``, program ``(n, p)`` running kernel ``p`` on node
    ``n`` (``lax.switch``: each branch keeps only its own running sums live), instead of one
    launch per kernel in series. A segment program's loop over its edges waits on each
    edge's gathers in turn; the parts of a node then wait side by side instead of one after
    another. Returns ``(num_nodes, out_width)``."""
    from jax.experimental import pallas as pl

    rows = perm.shape[0]
    if not kernels or not rows or not num_nodes:
        return jnp.zeros((num_nodes, out_width), args[0].dtype)
    be = block_edges

    # i: the node, read at the kernel's top level (Pallas' interpreter substitutes program
    # ids there only, not inside a lax.switch branch)
    def segment(body, col0, width, i, rowptr_ref, perm_ref, gather_ref, ins, out_ref):
        start, end = rowptr_ref[i], rowptr_ref[i + 1]
        # zero this kernel's columns of the row in power-of-two chunks (the Triton lowering
        # wants pow2 shapes); the set's other kernels own the rest of the shared row
        col, stop = col0, col0 + width
        while col < stop:
            size = 1 << ((stop - col).bit_length() - 1)
            out_ref[:, pl.ds(col, size)] = jnp.zeros((1, size), out_ref.dtype)
            col += size
        lanes = lax.broadcasted_iota(jnp.int32, (be,), 0)

        def tile(t):
            e = start + t * be + lanes
            ec = jnp.minimum(e, rows - 1)
            eid = perm_ref[ec]
            nid = gather_ref[ec]
            mask = (e < end) & (nid < num_nodes)
            ops = []
            for k, r in enumerate(ins):
                if k == shared_arg:
                    ops.append(r)
                elif k == node_arg:
                    ops.append(Gather(r, jnp.minimum(nid, num_nodes - 1), mask))
                else:
                    ops.append(Gather(r, eid, mask))
            acc = Accumulate(out_ref)
            body(*ops, acc)
            return acc

        # The loop carries the running sum of each store of the body in registers,
        # unreduced: no cross-warp sum and no read-modify-write of the node's row per
        # tile, one of each per node (``_Accumulate.write``); with step_sums one row each.
        records, shapes = _body_stores(body, ins, shared_arg, be, out_ref)
        step = (lambda v: jnp.sum(v, axis=0, keepdims=True)) if step_sums else (lambda v: v)
        totals = lax.fori_loop(
            0, (end - start + be - 1) // be,
            lambda t, carry: tuple(c + step(v) for c, (_, _, v) in zip(carry, tile(t).records)),
            tuple(jnp.zeros(((1,) + a.shape[1:]) if step_sums else a.shape, a.dtype) for a in shapes),
        )
        out = Accumulate(out_ref)
        out.records = records
        out.write(totals)

    def make(body, col0, width):
        def kernel(rowptr_ref, perm_ref, gather_ref, *refs):
            *ins, out_ref = refs
            segment(body, col0, width, pl.program_id(0), rowptr_ref, perm_ref, gather_ref, ins, out_ref)

        kernel.__name__ = body.__name__
        return kernel

    operands = (rowptr, perm, gather, *args)
    if (SEGMENT_PARTS if parts is None else parts) and len(kernels) > 1:
        def kernel(rowptr_ref, perm_ref, gather_ref, *refs):
            *ins, out_ref = refs
            i = pl.program_id(0)
            branches = [functools.partial(segment, body, col0, width, i, rowptr_ref, perm_ref, gather_ref, ins,
                                          out_ref) for body, col0, width in kernels]
            lax.switch(pl.program_id(1), branches)

        call = pl.pallas_call(
            kernel,
            out_shape=out_struct((num_nodes, out_width), args[0].dtype, operands),
            grid=(num_nodes, len(kernels)),
            in_specs=[_full_spec(a) for a in operands],
            out_specs=pl.BlockSpec((1, out_width), lambda i, p: (i, 0)),
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=f"{name}_conv{kernels[0][0].__name__}_parts{len(kernels)}",
        )
        return run(call, interpret, *operands)

    out_spec = pl.BlockSpec((1, out_width), lambda i: (i, 0))

    def call(body, col0, width):
        return lambda wrap, extra, aliases: pl.pallas_call(
            wrap(make(body, col0, width)),
            out_shape=out_struct((num_nodes, out_width), args[0].dtype, operands),
            grid=(num_nodes,),
            in_specs=[_full_spec(a) for a in operands] + extra,
            out_specs=out_spec,
            input_output_aliases=aliases,
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + "_conv" + body.__name__,
        )

    return _chain([call(*k) for k in kernels], operands, {0: out_spec}, interpret)[-1][0]


def launch_edges(name, kernels, args, *, gathers: dict, shared_arg: int | None, shared_out: bool,
                 num_nodes: int, out_width: int, block_edges: int, interpret: bool,
                num_warps: int | None = None):
    """Per-edge kernels (``conv`` backward_x2 and backward_w): one program per
    ``block_edges`` edges (original order). ``gathers``: ``{arg: index (rows,)}`` for the
    node arrays among ``args`` (gathered rows, zero where the index is the sentinel
    ``num_nodes``); the other args are ``(rows, width)`` edge arrays, except
    ``args[shared_arg]``. ``kernels``: ``(body, first column, width)`` triples. Returns
    ``(rows, out_width)``, each kernel writing its columns of one buffer, or with
    ``shared_out`` the ``(1, out_width)`` sum over edges (per-program partial sums of each
    kernel's columns, then one sum in a fixed order: deterministic)."""
    from jax.experimental import pallas as pl

    gather_args = sorted(gathers)
    rows = gathers[gather_args[0]].shape[0]
    _check_rows(rows, block_edges)
    if not kernels:
        return jnp.zeros((1 if shared_out else rows, out_width), args[0].dtype)
    be, blocks = block_edges, rows // block_edges
    ni = len(gather_args)

    def make(body):
        def kernel(*refs):
            idx_refs, ins, out_ref = refs[:ni], refs[ni:-1], refs[-1]
            ops = []
            for k, r in enumerate(ins):
                if k in gathers:
                    nid = idx_refs[gather_args.index(k)][...]
                    ops.append(Gather(r, jnp.minimum(nid, num_nodes - 1), nid < num_nodes))
                else:
                    ops.append(r)
            body(*ops, out_ref)

        kernel.__name__ = body.__name__
        return kernel

    in_specs = [pl.BlockSpec((be,), lambda i: (i,)) for _ in gather_args]
    for k, a in enumerate(args):
        if k in gathers or k == shared_arg:
            in_specs.append(_full_spec(a))
        else:
            in_specs.append(pl.BlockSpec((be, a.shape[1]), lambda i: (i, 0)))
    operands = (*(gathers[k] for k in gather_args), *args)
    if shared_out:  # shared-weight gradients: each kernel its own partial-sum rows from column 0
        pieces = []
        for body, _, width in kernels:
            call = pl.pallas_call(
                make(body),
                out_shape=out_struct((blocks, width), args[0].dtype, operands),
                grid=(blocks,),
                in_specs=in_specs,
                out_specs=pl.BlockSpec((1, width), lambda i: (i, 0)),
                interpret=interpret,
                compiler_params=compiler_params(interpret, num_warps),
                name=name + "_conv" + body.__name__,
            )
            pieces.append(jnp.sum(run(call, interpret, *operands), axis=0, keepdims=True))
        return _concat(pieces)
    out_spec = pl.BlockSpec((be, out_width), lambda i: (i, 0))

    def call(body):
        return lambda wrap, extra, aliases: pl.pallas_call(
            wrap(make(body)),
            out_shape=out_struct((rows, out_width), args[0].dtype, operands),
            grid=(blocks,),
            in_specs=in_specs + extra,
            out_specs=out_spec,
            input_output_aliases=aliases,
            interpret=interpret,
            compiler_params=compiler_params(interpret, num_warps),
            name=name + "_conv" + body.__name__,
        )

    return _chain([call(body) for body, _, _ in kernels], operands, {0: out_spec}, interpret)[-1][0]


def conv_backward_fused(name, kernels, args, graph, *, num_nodes: int, dim_in2: int, weight_numel: int,
                        block_edges: int, segment_edges: int, interpret: bool, num_warps: int | None = None,
                        gx1_segments=None, step_sums: bool = False):
    """The conv's three gradients from one gather of each operand per edge (a channelwise
    product's fused backward kernels, ``eqdsl.backends.pallas.fused``).

    ``args``: ``(x, y, W, G)``, node features ``(N, dim_in1)``, edge rows ``(rows, .)``,
    per-edge weights, node cotangents ``(N, dim_out)``, or for ``conv_radial``'s kernels
    ``(x, y, rf, wr, G)``, the radial features ``(rows, H)`` and the radial weight
    ``(H, weight_numel)`` (given whole to every program) in place of ``W``; ``graph`` a ``ConvGraph``. One
    program per ``block_edges`` edges gathers ``x[src]`` and ``G[dst]`` and runs the fused
    body, which writes ``dF/dy`` and ``dF/dW`` of its edges (``dF/dW`` at its paths' columns of
    one ``(rows, weight_numel)`` buffer all kernels share) and each edge's ``dF/dx``
    message; a segment kernel then sums the messages into their ``src`` nodes
    (``segment_sum_rows``: a fixed order, no atomics). The three-kernel backward gathers
    ``G``, the widest operand, once per kernel. Kernels that own part of an ``x1`` block's
    paths write partial messages: their node sums are added per block after the segment
    sum (``gx1_segments``, as ``launch_fused``); ``step_sums``: ``launch_segments``' for that
    segment sum. Returns ``(gx (N, dim_in1), gy, gW)``
    (``gW`` in the kernel weight layout, as ``backward_w``).
    """
    from jax.experimental import pallas as pl

    x, *mid, g = args  # mid: (y, W), or (y, rf, wr) for conv_radial
    y = mid[0]
    rows = y.shape[0]
    _check_rows(rows, block_edges)
    be = block_edges

    def make(body):
        def kernel(src_ref, dst_ref, x_ref, *refs):
            *mid_refs, g_ref = refs[:len(mid) + 1]
            s, d = src_ref[...], dst_ref[...]
            xs = Gather(x_ref, jnp.minimum(s, num_nodes - 1), s < num_nodes)
            gd = Gather(g_ref, jnp.minimum(d, num_nodes - 1), d < num_nodes)
            body(xs, *mid_refs, gd, *refs[len(mid) + 1:])

        kernel.__name__ = body.__name__
        return kernel

    in_specs = [pl.BlockSpec((be,), lambda i: (i,))] * 2 + [_full_spec(x)]
    # edge rows blocked; conv_radial's radial weight (the third of mid) whole
    in_specs += [pl.BlockSpec((be, a.shape[1]), lambda i: (i, 0)) if k < 2 else _full_spec(a)
                 for k, a in enumerate(mid)]
    in_specs += [_full_spec(g)]
    operands = (graph.src, graph.dst, x, *mid, g)
    outs = _fused_outputs(name + "_conv", kernels, operands, in_specs, rows=rows, block=be, dim_in2=dim_in2,
                          weight_numel=weight_numel, whole=gx1_segments is None, interpret=interpret,
                          num_warps=num_warps, make=make)
    # each edge's dF/dx message: one shared buffer, or (a split x1 block) the kernels' partial
    # pieces, summed per block after the segment sum
    msgs, gy, gw = _join_fused(outs, gx1_segments is None)
    gx = segment_sum_rows(name, msgs, perm=graph.perm_src, rowptr=graph.rowptr_src,
                          gather=graph.gather_src, num_nodes=num_nodes, block_edges=segment_edges,
                          interpret=interpret, num_warps=num_warps, step_sums=step_sums)
    return _sum_segments(gx, gx1_segments), gy, gw


def segment_sum_rows(name, rows_array, *, perm, rowptr, gather, num_nodes: int, block_edges: int, interpret: bool,
                     num_warps: int | None = None, step_sums: bool = False):
    """``out[n] = sum of rows_array[perm[rowptr[n]:rowptr[n + 1]]]`` (``launch_segments``
    with a body that stores its tile: the sum runs in a fixed order; ``step_sums`` as there).
    ``(num_nodes, width)``."""
    from jax.experimental import pallas as pl

    width = rows_array.shape[1]

    def _segment_rows(m_ref, out_ref):
        col = 0
        while col < width:  # power-of-two column chunks (the Triton lowering wants pow2 shapes)
            size = 1 << ((width - col).bit_length() - 1)
            out_ref[:, pl.ds(col, size)] = m_ref[:, pl.ds(col, size)]
            col += size

    return launch_segments(name, [(_segment_rows, 0, width)], (rows_array,), node_arg=None, shared_arg=None, perm=perm,
                           rowptr=rowptr, gather=gather, num_nodes=num_nodes, out_width=width,
                           block_edges=block_edges, interpret=interpret, num_warps=num_warps, step_sums=step_sums)
