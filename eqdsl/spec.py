"""Spec files: TOML with one or more ``[[tensor_product]]`` tables.

Parsing validates everything (keys, types, irreps, instructions against the irreps,
names) and raises one ``SpecError`` naming the file, the table, the key and the reason.
What comes out is a tuple of frozen ``TensorProductSpec`` with resolved instructions;
nothing from the file reaches generated code without passing through here.

Keys of a ``[[tensor_product]]`` table (README "Spec format" has a worked example):

========================  =====================================  =====================
key                       type / values                          default
========================  =====================================  =====================
name                      Python identifier, unique in the file  required
irreps_in1, irreps_in2    e3nn irreps string                     required
irreps_out                e3nn irreps (for uvu/uvv/uuu: a filter  required
                          of bare irreps, or the exact output
                          when any term has a multiplicity)
mode                      uvw | uvu | uvv | uuu                  one of mode /
instructions              list of [i1, i2, i_out, mode,          instructions required
                          has_weight, path_weight?]
output_order              paths | sorted (uvu/uvv/uuu: output    paths
                          blocks in path order, or as e3nn's
                          Irreps.sort(), i_out renumbered)
instruction_order         paths | output (uvu/uvv/uuu: the       paths; required
                          instructions, hence the weights, in    with sorted
                          path order (NequIP) or by i_out
                          (MACE, SevenNet, Nequix))
cg_convention             e3nn-0.5 | e3nn-0.4 (wigner_3j signs   e3nn-0.5
                          of e3nn >= 0.5, or of e3nn 0.4.x)
irrep_normalization       component | norm | none                component
path_normalization        element | path | none                  element
shared_weights            bool                                   true (as e3nn)
layout                    mul_ir | ir_mul                        mul_ir
dtypes                    list of float32 | float64              [float32, float64]
conv                      bool: also generate the fused graph    false
                          convolution (gather -> TP -> scatter)
reduce                    sum | mean (over a node's in-edges)    sum (needs conv)
deterministic             bool: dst-sorted segment reduction,    false (needs conv)
                          bitwise reproducible; else atomics
radial_features           int H >= 1: also generate              none (needs conv,
                          ``conv_radial``, the conv given the    per-edge weights,
                          radial MLP's last layer (per-edge      every path weighted)
                          hidden features (E, H) and its
                          (H, weight_numel) matrix); the
                          per-edge weights form on chip
tuning                    table of kernel parameters, each       each backend's
                          backend's keys (e.g. written by        defaults
                          ``eqdsl tune``)
========================  =====================================  =====================

A ``tuning`` table (``[tensor_product.tuning]`` after its ``[[tensor_product]]``) pins
the generated kernels' tile sizes and launch parameters; every key is optional and an
integer. The spec layer passes it through as data (``TensorProductSpec.tuning``); the
backend that reads a key owns and validates it: the Helion keys
(``eqdsl.backends.helion.tuning.KEYS``, documented on its ``Tuning``: ``block_b``,
``block_c``, ``num_warps``, ``grid_c``, ``fuse_bwd``, ``segment``, ...) and the Pallas keys
(``eqdsl.backends.pallas.tuning.KEYS``: ``pallas_block_batch``, ``pallas_num_warps``,
``pallas_factor``, ...). A sub-table ``[tensor_product.tuning.<op>]`` (an op of
``eqdsl.backends.helion.tuning.OPS``: ``fwd``, ``bwd_x1``, ``bwd_x2``, ``bwd_w``, ``bwd``
(the fused backward), ``conv_fwd``, ``conv_bwd_x``, ``conv_bwd_y``, ``conv_bwd_w``,
``conv_bwd``) overrides Helion keys for that op's kernels only (what ``eqdsl tune`` writes:
each op's kernels are timed and chosen apart); the Pallas keys apply to every op.
``eqdsl.backends.check_tuning`` checks a spec's table before anything is generated and
raises the same one-line ``SpecError`` as the rest of the spec (file, table, key).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .cg import CG_CONVENTIONS, DEFAULT_CG_CONVENTION, E3NN_04_LMAX
from .errors import SpecError
from .instructions import (
    INSTRUCTION_ORDERS,
    IRREP_NORMALIZATIONS,
    MODES,
    OUTPUT_ORDERS,
    PATH_NORMALIZATIONS,
    Instruction,
    InstructionError,
    check_instruction,
    expand_mode,
)
from .irreps import Irreps
from .spec_reader import TableReader, parse_document, parse_tables, read_spec_text

__all__ = [
    "TensorProductSpec", "load_spec", "parse_spec", "LAYOUTS", "DTYPES", "REDUCTIONS",
]

LAYOUTS = ("mul_ir", "ir_mul")
DTYPES = ("float32", "float64")
_KNOWN = {
    "name", "irreps_in1", "irreps_in2", "irreps_out", "mode", "instructions",
    "irrep_normalization", "path_normalization", "shared_weights", "layout", "dtypes",
    "conv", "reduce", "deterministic", "tuning", "output_order", "instruction_order", "cg_convention",
    "radial_features",
}
REDUCTIONS = ("sum", "mean")


@dataclass(frozen=True)
class TensorProductSpec:
    """One validated tensor product.

    ``irreps_out`` is the resolved output (for ``uvu``/``uvv``/``uuu`` modes: one block
    per path); ``irreps_out_filter`` is what the file said. ``instructions`` are resolved
    e3nn instructions with the user's path weights.

    ``output_order`` and ``instruction_order`` record how a channelwise mode ordered the
    output blocks (``"paths"`` | ``"sorted"``) and the instructions, hence the weights
    (``"paths"`` | ``"output"``); both are ``"given"`` for ``uvw`` and explicit
    ``instructions``, whose output is ``irreps_out`` as written and whose instructions
    keep the file's order. ``cg_convention`` is one of ``eqdsl.cg.CG_CONVENTIONS``.
    """

    name: str
    irreps_in1: Irreps
    irreps_in2: Irreps
    irreps_out: Irreps
    irreps_out_filter: Irreps
    mode: str | None
    instructions: tuple[Instruction, ...]
    irrep_normalization: str = "component"
    path_normalization: str = "element"
    shared_weights: bool = True
    layout: str = "mul_ir"
    dtypes: tuple[str, ...] = DTYPES
    conv: bool = False
    reduce: str = "sum"
    deterministic: bool = False
    # sorted (key, value) pairs, an op sub-table's keys as "<op>.<key>": data for the
    # backends, which own and validate their keys (eqdsl.backends.check_tuning)
    tuning: tuple[tuple[str, int], ...] = ()
    output_order: str = "paths"  # paths | sorted | given
    instruction_order: str = "paths"  # paths | output | given
    cg_convention: str = DEFAULT_CG_CONVENTION
    # H of conv_radial (the radial MLP's hidden width), or None: no conv_radial
    radial_features: int | None = None
    # (file, table) as errors name them: where a backend's check of ``tuning`` points
    origin: tuple[str, str] = field(default=("<spec>", "tensor_product.0"), compare=False)

    def __str__(self) -> str:
        how = f"mode={self.mode}" if self.mode else f"{len(self.instructions)} instructions"
        return f"{self.name}: {self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} ({how}, {self.layout})"


def load_spec(path: str | Path) -> tuple[TensorProductSpec, ...]:
    """Read and validate a spec file. Raises ``SpecError`` (also for unreadable files)."""
    return parse_spec(read_spec_text(path), str(path))


def parse_spec(text: str, filename: str = "<spec>") -> tuple[TensorProductSpec, ...]:
    """Validate spec text's ``[[tensor_product]]`` tables; ``filename`` is used in error messages only.

    A file may also hold ``[[symmetric_contraction]]`` tables (or only those: then the result
    is empty); ``eqdsl.symmetric.spec.parse_symmetric_specs`` validates them, and ``eqdsl
    generate`` writes both kinds.
    """
    data = parse_document(text, filename)
    tables = data.get("tensor_product")
    if tables is None and "symmetric_contraction" in data:
        return ()  # a file of symmetric contractions only: eqdsl.symmetric.spec parses those tables
    if tables is None:
        raise SpecError(filename, None, "tensor_product", "missing: the file defines no [[tensor_product]] table")
    specs = parse_tables(tables, filename, "tensor_product", _parse_table)
    if not specs:
        raise SpecError(filename, None, "tensor_product", "the file defines no tensor product")
    return specs


def _parse_table(t: dict, filename: str, idx: int) -> TensorProductSpec:
    r = TableReader(t, filename, "tensor_product", idx, _KNOWN)
    fail, get, choice, irreps = r.fail, r.get, r.choice, r.irreps
    name = r.name()
    in1, in2, out_filter = irreps("irreps_in1"), irreps("irreps_in2"), irreps("irreps_out")

    irrep_norm = choice("irrep_normalization", IRREP_NORMALIZATIONS, "component")
    path_norm = choice("path_normalization", PATH_NORMALIZATIONS, "element")
    layout = choice("layout", LAYOUTS, "mul_ir")
    shared = get("shared_weights", bool, True)
    dtypes = r.dtypes(DTYPES)

    conv = get("conv", bool, False)
    reduce = choice("reduce", REDUCTIONS, "sum")
    deterministic = get("deterministic", bool, False)
    for key in ("reduce", "deterministic", "radial_features"):
        if key in t and not conv:
            fail(key, "only applies to the fused convolution: set conv = true")
    radial_features = None
    if "radial_features" in t:
        radial_features = get("radial_features", int, None)
        if isinstance(radial_features, bool) or radial_features < 1:
            fail("radial_features", f"must be a positive integer (the radial MLP's hidden width H), "
                                    f"got {t['radial_features']!r}")
        if shared:
            fail("radial_features", "needs per-edge weights: set shared_weights = false")

    tuning = _parse_tuning(get("tuning", dict, {}), fail)

    cg_convention = choice("cg_convention", CG_CONVENTIONS, DEFAULT_CG_CONVENTION)
    output_order = choice("output_order", OUTPUT_ORDERS, "paths")
    instruction_order = choice("instruction_order", INSTRUCTION_ORDERS, "paths")

    has_mode, has_ins = "mode" in t, "instructions" in t
    if has_mode == has_ins:
        fail("mode" if has_mode else None, "give exactly one of 'mode' or 'instructions'")
    for key in ("output_order", "instruction_order"):
        if key in t and (has_ins or t.get("mode") == "uvw"):
            how = "explicit instructions" if has_ins else "mode 'uvw'"
            fail(key, f"does not apply to {how}: the output is irreps_out as written and the instructions "
                      "keep their order; it applies to the modes uvu, uvv and uuu")
    if output_order == "sorted" and "instruction_order" not in t:
        fail("instruction_order", "output_order = 'sorted' needs it, the weight order: 'output' (instructions "
                                  "sorted by i_out: MACE, SevenNet >= 0.11, Nequix) or 'paths' (path order: NequIP)")
    err: InstructionError | None = None
    try:
        if has_mode:
            mode = choice("mode", MODES, "")
            out, instructions = expand_mode(mode, in1, in2, out_filter, output_order, instruction_order)
            if mode != "uvw":
                _check_channelwise_out(t["irreps_out"], out_filter, out, mode, output_order, in1, in2, fail)
            else:
                output_order = instruction_order = "given"
        else:
            mode = None
            output_order = instruction_order = "given"
            out = out_filter
            instructions = tuple(_parse_instruction(v, j, fail) for j, v in enumerate(get("instructions", list)))
            if not instructions:
                fail("instructions", "must list at least one instruction")
            for ins in instructions:
                check_instruction(ins, in1, in2, out)
            dup = {i.as_tuple()[:4] for i in instructions}
            if len(dup) != len(instructions):
                fail("instructions", "the same (i_in1, i_in2, i_out, mode) appears twice")
    except InstructionError as e:
        err = e
    if err is not None:  # raised outside the handler so the one-line error has no chained context
        fail(err.key, err.reason)
    if radial_features is not None and any(not i.has_weight for i in instructions):
        fail("radial_features", "needs every path weighted (conv_radial forms each edge's weights as "
                                "radial_features @ radial_weight; an unweighted path has none)")
    if cg_convention == "e3nn-0.4":
        lmax = max(max(in1[i.i_in1].ir.l, in2[i.i_in2].ir.l, out[i.i_out].ir.l) for i in instructions)
        if lmax > E3NN_04_LMAX:
            fail("cg_convention", f"e3nn 0.4 has wigner_3j up to l = {E3NN_04_LMAX} only, a path here has "
                                  f"l = {lmax}; use 'e3nn-0.5'")
    return TensorProductSpec(
        name=name, irreps_in1=in1, irreps_in2=in2, irreps_out=out, irreps_out_filter=out_filter,
        mode=mode, instructions=instructions, irrep_normalization=irrep_norm,
        path_normalization=path_norm, shared_weights=shared, layout=layout, dtypes=dtypes,
        conv=conv, reduce=reduce, deterministic=deterministic, tuning=tuning,
        output_order=output_order, instruction_order=instruction_order, cg_convention=cg_convention,
        radial_features=radial_features, origin=(filename, r.where),
    )


_EXPLICIT_MUL_RE = re.compile(r"^\s*\d+\s*x")


def _check_channelwise_out(text: str, written: Irreps, out: Irreps, mode: str, output_order: str,
                           in1: Irreps, in2: Irreps, fail) -> None:
    """A channelwise mode's output against what ``irreps_out`` says: never silently another order.

    Any term written ``<mul>x<ir>`` makes ``irreps_out`` the exact output: it must equal
    ``out``. Bare irreps are a filter, unless they could be read as the output itself
    (multiplicity 1 everywhere, the same irreps) in another order, or list an irrep twice:
    both are refused as ambiguous.
    """
    other_order = "paths" if output_order == "sorted" else "sorted"
    other, _ = expand_mode(mode, in1, in2, written, other_order, "paths")

    def alternatives(target: Irreps) -> str:
        if other == target:
            return f"; output_order = '{other_order}' gives exactly irreps_out: set it"
        return f"; with output_order = '{other_order}' it is '{other}'"

    if any(_EXPLICIT_MUL_RE.match(term) for term in text.split("+")):
        if out != written:
            fail("irreps_out", f"lists multiplicities, so it must be the exact output, but mode '{mode}' with "
                               f"output_order = '{output_order}' gives '{out}'{alternatives(written)} (eqdsl never merges "
                               "blocks; bare irreps such as '0e+1o' are a filter)")
        return
    as_output = Irreps([(1, mi.ir) for mi in written])
    if out == as_output:
        return  # read as a filter or as the output itself, the same
    irs = [str(mi.ir) for mi in written]
    if all(mi.mul == 1 for mi in out) and sorted(irs) == sorted(str(mi.ir) for mi in out):
        fail("irreps_out", f"ambiguous: bare irreps are a filter, and the output, '{out}' (output_order = "
                           f"'{output_order}'), has the same irreps in another order{alternatives(as_output)}; or "
                           "write the output with multiplicities to confirm it, or the filter in output order")
    dup = next((ir for k, ir in enumerate(irs) if ir in irs[:k]), None)
    if dup is not None:
        fail("irreps_out", f"'{dup}' appears twice in a filter (bare irreps, each kept once); write every term "
                           "with its multiplicity to give the exact output")


def _parse_tuning(table: dict, fail) -> tuple[tuple[str, int], ...]:
    """Sorted ``(key, value)`` pairs; a sub-table's keys as ``"<op>.<key>"``. Only the shape
    is checked here (integers, tables of integers): the backends own the keys
    (``eqdsl.backends.check_tuning``)."""
    pairs = []
    for key, v in table.items():
        items = [(f"{key}.{k}", x) for k, x in v.items()] if isinstance(v, dict) else [(key, v)]
        for k, x in items:
            if not isinstance(x, int) or isinstance(x, bool):
                fail(f"tuning.{k}", f"expected an integer; got {x!r}")
            pairs.append((k, x))
    return tuple(sorted(pairs))


def _parse_instruction(v, j: int, fail) -> Instruction:
    key = f"instructions[{j}]"
    if not isinstance(v, list) or len(v) not in (5, 6):
        fail(key, "expected [i_in1, i_in2, i_out, mode, has_weight] or [..., path_weight]")
    i1, i2, io, mode, hw = v[:5]
    for x, what in ((i1, "i_in1"), (i2, "i_in2"), (io, "i_out")):
        if not isinstance(x, int) or isinstance(x, bool):
            fail(key, f"{what} must be an integer, got {x!r}")
    if not isinstance(mode, str):
        fail(key, f"mode must be a string, got {mode!r}")
    if not isinstance(hw, bool):
        fail(key, f"has_weight must be true or false, got {hw!r}")
    pw = 1.0
    if len(v) == 6:
        pw = v[5]
        if isinstance(pw, bool) or not isinstance(pw, (int, float)) or not math.isfinite(pw) or pw < 0:
            fail(key, f"path_weight must be a finite number >= 0, got {pw!r}")
        pw = float(pw)
    return Instruction(i1, i2, io, mode, hw, pw)
