"""Batch-parallel launches of the generated Pallas tensor-product kernels on several devices.

A ``pallas_call`` is opaque to XLA's partitioner: under ``jax.jit`` with inputs sharded
over the batch axis, XLA gathers every operand onto every device around it and each
device computes the whole batch (measured: ``all-gather`` ops in the compiled HLO, a
replicated output). Every kernel of a tensor product is row-parallel, though: row ``z``
of each output depends on row ``z`` of each operand only, except the gradient of shared
weights, a sum over the rows. ``row_parallel`` tells JAX so, for every kernel launch:

* ``jax.jit`` with ``Auto`` mesh axes (``jax.sharding.Mesh``, or ``jax.make_mesh(...,
  axis_types=(AxisType.Auto,))``, inputs placed with ``NamedSharding(mesh, P("b"))``):
  each launch is a ``jax.experimental.custom_partitioning`` op whose ``sharding_rule``
  (Shardy, jax's default partitioner) ties the batch axes of the operands and row
  outputs, and whose ``partition`` runs the launch on each device's rows; a shared-weight
  gradient is the ``psum`` of the per-device sums over the batch's mesh axes.
* Explicit mesh axes (``jax.make_mesh``'s default in jax 0.10, where an array's type
  carries its sharding): each launch runs under ``jax.shard_map`` over the mesh axes that
  shard the batch (operands are resharded to that layout first: their other axes, and
  shared weights, replicated).
* Inside a user's ``jax.shard_map`` (manual axes): the launch runs on the local rows as
  is (``custom_partitioning`` lowers its function inline there);
  ``launch.out_struct`` types its outputs with their varying mesh axes and
  ``autodiff``'s VJP rules sum the gradient of unmapped (replicated) operands.

Every launch pads its own (per-device) rows to a multiple of the batch block and drops
the padding rows after the kernel, so the batch never has to be padded globally (a pad
of a sharded axis moves rows between devices). Gradients follow, because every kernel of
the ``jax.custom_vjp`` wiring (``autodiff.make_vjp_ops``) is launched this way.

``jax.vmap`` over a launch (which ``custom_partitioning`` cannot batch) runs the
unpartitioned launch under ``vmap`` (``jax.custom_batching.custom_vmap``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["RowLayout", "row_parallel", "batch_axes_of"]


class RowLayout(NamedTuple):
    """Which operands and outputs of a launch are row arrays.

    ``args[k]`` is ``(rows, width)`` when ``row_args[k]``, else one ``(1, width)`` row
    given whole to every program (shared weights). ``row_outs[k]``: output ``k`` has one
    row per input row; otherwise it is a ``(1, width)`` sum over the rows (the gradient
    of shared weights), summed over devices (``psum``) when the rows are sharded."""

    row_args: tuple[bool, ...]
    row_outs: tuple[bool, ...]


def _tuple_out(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _pad_rows(x, rows: int):
    return x if x.shape[0] == rows else jnp.pad(x, ((0, rows - x.shape[0]), (0, 0)))


def _local(launch: Callable, layout: RowLayout, block_batch: int, interpret: bool, *args):
    """``launch`` on the rows at hand: rows padded with zeros to a multiple of
    ``block_batch`` (zero rows add nothing to a weight-gradient sum), padding rows of the
    row outputs dropped. Returns a tuple of outputs."""
    rows = next(a.shape[0] for a, r in zip(args, layout.row_args) if r)
    padded = -(-rows // block_batch) * block_batch
    args = tuple(_pad_rows(a, padded) if r else a for a, r in zip(args, layout.row_args))
    outs = _tuple_out(launch(*args, block_batch=block_batch, interpret=interpret))
    if len(outs) != len(layout.row_outs):
        raise AssertionError(f"launch returned {len(outs)} outputs, layout has {len(layout.row_outs)}")
    return tuple(o[:rows] if r else o for o, r in zip(outs, layout.row_outs))


def _axes_tuple(entry) -> tuple[str, ...]:
    """A ``PartitionSpec`` entry (None, an axis name or a tuple of them) as a tuple."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec_entry(axes: tuple[str, ...]):
    return axes[0] if len(axes) == 1 else axes


def batch_axes_of(shardings, row_args) -> tuple[str, ...]:
    """The mesh axes that shard the batch: those of the first row operand whose leading
    axis is sharded (``()`` if none is). Other row operands are resharded to them."""
    for s, r in zip(shardings, row_args):
        spec = getattr(s, "spec", None)
        if r and spec is not None and len(spec) and spec[0] is not None:
            return _axes_tuple(spec[0])
    return ()


def _psum_reductions(outs, layout: RowLayout, axes):
    return tuple(o if r or not axes else jax.lax.psum(o, axes) for o, r in zip(outs, layout.row_outs))


# ------------------------------------------------------------------ Auto axes: custom_partitioning


def _arg_shardings(mesh, layout: RowLayout, axes):
    row = NamedSharding(mesh, P(_spec_entry(axes) if axes else None, None))
    rep = NamedSharding(mesh, P(None, None))
    return tuple(row if r else rep for r in layout.row_args), tuple(row if r else rep for r in layout.row_outs)


def _partition(launch, layout, block_batch, interpret, mesh, arg_shapes, result_shape):
    axes = batch_axes_of([a.sharding for a in arg_shapes], layout.row_args)
    arg_sh, out_sh = _arg_shardings(mesh, layout, axes)

    def lower_fn(*args):
        outs = _psum_reductions(_local(launch, layout, block_batch, interpret, *args), layout, axes)
        return outs if isinstance(result_shape, (tuple, list)) else outs[0]

    out_sh = out_sh if isinstance(result_shape, (tuple, list)) else out_sh[0]
    return mesh, lower_fn, out_sh, arg_sh


def _infer(launch, layout, block_batch, interpret, mesh, arg_shapes, result_shape):
    # GSPMD propagation (jax_use_shardy_partitioner off): rows sharded like the operands'.
    axes = batch_axes_of([a.sharding for a in arg_shapes], layout.row_args)
    out_sh = _arg_shardings(mesh, layout, axes)[1]
    return out_sh if isinstance(result_shape, (tuple, list)) else out_sh[0]


def _rule(launch, layout, block_batch, interpret, mesh, operand_types, result_types):
    """Shardy rule: factor ``r`` is the batch of every row operand and row output; every
    other dimension is its own factor that must stay replicated (the kernels read whole
    rows); ``r`` is a reduction factor when no output has rows (``psum`` in ``partition``)."""
    count = iter(range(1 << 30))
    need = []

    def dims(is_row):
        first = "r" if is_row else f"s{next(count)}"
        other = f"c{next(count)}"
        need.extend([other] if is_row else [first, other])
        return f"{first} {other}"

    ops = ", ".join(dims(r) for r in layout.row_args)
    outs = ", ".join(dims(r) for r in layout.row_outs)
    extra = {"need_replication_factors": tuple(need)}
    if not any(layout.row_outs):
        extra["reduction_factors"] = ("r",)
    return f"{ops} -> {outs}", extra


def _make_partitioned(launch: Callable, layout: RowLayout):
    def fun(launch_, layout_, block_batch, interpret, *args):
        outs = _local(launch_, layout_, block_batch, interpret, *args)
        return outs if len(outs) > 1 else outs[0]

    cp = custom_partitioning(fun, static_argnums=(0, 1, 2, 3))
    cp.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                     propagate_user_sharding=None, sharding_rule=_rule)
    return cp


# ------------------------------------------------------------------ Explicit axes: shard_map


def _explicit_axes(args, layout: RowLayout) -> tuple[tuple[str, ...], object]:
    """``(batch axes, abstract mesh)`` when the operands' types carry an explicit sharding
    of the batch (explicit mesh axes), else ``((), None)``."""
    shardings = []
    mesh = None
    for a in args:
        s = getattr(jax.typeof(a), "sharding", None)
        shardings.append(s)
        m = getattr(s, "mesh", None)
        if mesh is None and m is not None and not getattr(m, "empty", True):
            mesh = m
    axes = batch_axes_of(shardings, layout.row_args)
    if not axes or mesh is None:
        return (), None
    explicit = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit}
    return (axes, mesh) if set(axes) <= explicit else ((), None)


def _shard_map_launch(launch, layout, block_batch, interpret, axes, mesh, args):
    row_spec, rep_spec = P(_spec_entry(axes), None), P(None, None)
    in_specs = tuple(row_spec if r else rep_spec for r in layout.row_args)
    out_specs = tuple(row_spec if r else rep_spec for r in layout.row_outs)
    # shard_map wants each input laid out as its in_spec says (explicit axes): reshard the
    # other row operands to the batch axes and replicate shared rows and column axes.
    args = tuple(jax.sharding.reshard(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs))

    def per_device(*local):
        return _psum_reductions(_local(launch, layout, block_batch, interpret, *local), layout, axes)

    # check_vma=False: the per-device function is not differentiated here (each launch is
    # a primal of the custom_vjp wiring) and the reductions are psum'ed explicitly.
    return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


# ------------------------------------------------------------------ entry point


def row_parallel(launch: Callable, layout: RowLayout) -> Callable:
    """Wrap a kernel launcher ``launch(*args, block_batch, interpret)`` (row operands of
    any row count, see ``RowLayout``) into ``f(*args, block_batch=, interpret=)`` that runs
    it batch-parallel on the devices that hold the rows (module docstring): no gather of
    the operands, row outputs sharded like the row operands, shared-row outputs summed
    over devices. Returns what ``launch`` returns (one array or a tuple), with the row
    outputs cut to the input's row count.
    """
    cp = _make_partitioned(launch, layout)

    def call(*args, block_batch: int, interpret: bool):
        axes, mesh = _explicit_axes(args, layout)
        if axes:
            outs = _shard_map_launch(launch, layout, block_batch, interpret, axes, mesh, args)
            return outs if len(outs) > 1 else outs[0]

        f = custom_vmap(lambda *a: cp(launch, layout, block_batch, interpret, *a))

        @f.def_vmap
        def _vmapped(axis_size, in_batched, *a):
            # custom_partitioning has no batching rule: vmap the launch itself (Pallas
            # batches a pallas_call over a new grid axis).
            axes_in = tuple(0 if b else None for b in in_batched)
            outs = jax.vmap(lambda *x: _local(launch, layout, block_batch, interpret, *x),
                            in_axes=axes_in, axis_size=axis_size)(*a)
            outs = outs if len(outs) > 1 else outs[0]
            return outs, jax.tree.map(lambda _: True, outs)

        return f(*args)

    return call
