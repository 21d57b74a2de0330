"""Instructions (paths) of a tensor product, with e3nn 0.6 semantics.

An instruction is e3nn's ``(i_in1, i_in2, i_out, connection_mode, has_weight,
path_weight)``. This module expands the ``mode`` shorthands into instruction lists,
checks instructions against the irreps, and computes e3nn's normalized path weights and
path shapes (``e3nn.o3.TensorProduct.__init__``). Pure Python: no torch, no jax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .irreps import Irreps, MulIr

__all__ = [
    "MODES",
    "OUTPUT_ORDERS",
    "INSTRUCTION_ORDERS",
    "IRREP_NORMALIZATIONS",
    "PATH_NORMALIZATIONS",
    "Instruction",
    "InstructionError",
    "expand_mode",
    "check_instruction",
    "path_shape",
    "normalized_path_alphas",
    "normalized_path_weights",
]

MODES = ("uvw", "uvu", "uvv", "uuu")
# how the channelwise modes order their output blocks and their instructions (expand_mode)
OUTPUT_ORDERS = ("paths", "sorted")
INSTRUCTION_ORDERS = ("paths", "output")
IRREP_NORMALIZATIONS = ("component", "norm", "none")
PATH_NORMALIZATIONS = ("element", "path", "none")


class InstructionError(ValueError):
    """An instruction does not fit the irreps; ``key`` names the spec key to blame."""

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"{key}: {reason}")


@dataclass(frozen=True)
class Instruction:
    """One path, as e3nn's tuple; ``path_weight`` is the user's factor (default 1.0)."""

    i_in1: int
    i_in2: int
    i_out: int
    mode: str
    has_weight: bool
    path_weight: float = 1.0

    def as_tuple(self) -> tuple:
        return (self.i_in1, self.i_in2, self.i_out, self.mode, self.has_weight, self.path_weight)

    def __str__(self) -> str:
        return str(self.as_tuple())


def expand_mode(
    mode: str,
    irreps_in1: Irreps,
    irreps_in2: Irreps,
    irreps_out: Irreps,
    output_order: str = "paths",
    instruction_order: str = "paths",
):
    """Expand a mode shorthand into ``(irreps_out, instructions)``.

    ``uvw``: e3nn's ``FullyConnectedTensorProduct``: every ``(i1, i2, i_out)`` whose
    irreps are allowed, in that loop order; ``irreps_out`` is used as given (the two
    orders must be ``"paths"``).

    ``uvu`` / ``uvv`` / ``uuu``: the channelwise construction of MACE
    (``mace/modules/irreps_tools.py: tp_out_irreps_with_instructions``), NequIP
    (``InteractionBlock``), SevenNet (``IrrepsConvolution``) and Nequix. ``irreps_out``
    is a filter: each allowed ``ir_out`` of ``ir1 x ir2`` (in e3nn's order, ``l``
    ascending) that appears in it becomes one path writing its own ``mul x ir_out``
    block. ``mul`` is ``mul1`` for ``uvu``, ``mul2`` for ``uvv``; ``uuu`` keeps only pairs
    with ``mul1 == mul2``. Then, as those models do:

    * ``output_order``: ``"paths"`` keeps the blocks in path order; ``"sorted"`` orders
      them as e3nn's ``Irreps.sort()`` (by ``(l, p)``, odd before even (e3nn's ``Irrep`` is
      the tuple ``(l, p)``, so ``0o < 0e``), ties in path order; never merged) and
      renumbers each instruction's ``i_out``.
    * ``instruction_order``: ``"paths"`` keeps the instructions (hence the weights, path
      after path) in path order (NequIP); ``"output"`` orders them by ``i_out`` (MACE,
      SevenNet >= 0.11, Nequix: ``sorted(instructions, key=lambda x: x[2])``). With
      ``output_order = "paths"`` the two are the same.

    Raises ``InstructionError`` for an unknown mode or order, an order other than
    ``"paths"`` for ``uvw``, or when no path results.
    """
    if mode not in MODES:
        raise InstructionError("mode", f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if output_order not in OUTPUT_ORDERS:
        raise InstructionError("output_order", f"{output_order!r} is not one of {', '.join(OUTPUT_ORDERS)}")
    if instruction_order not in INSTRUCTION_ORDERS:
        raise InstructionError("instruction_order",
                               f"{instruction_order!r} is not one of {', '.join(INSTRUCTION_ORDERS)}")
    if mode == "uvw":
        if (output_order, instruction_order) != ("paths", "paths"):
            raise InstructionError("output_order", "mode 'uvw' writes irreps_out as given; the orders apply to "
                                   "uvu, uvv and uuu")
        ins = [
            Instruction(i1, i2, io, "uvw", True, 1.0)
            for i1, mi1 in enumerate(irreps_in1)
            for i2, mi2 in enumerate(irreps_in2)
            for io, mio in enumerate(irreps_out)
            if mio.ir.allowed(mi1.ir, mi2.ir)
        ]
        out = irreps_out
    else:
        keep = {mi.ir for mi in irreps_out}
        blocks: list[MulIr] = []
        ins = []
        for i1, mi1 in enumerate(irreps_in1):
            for i2, mi2 in enumerate(irreps_in2):
                if mode == "uuu" and mi1.mul != mi2.mul:
                    continue
                for ir in mi1.ir * mi2.ir:
                    if ir in keep:
                        mul = mi2.mul if mode == "uvv" else mi1.mul
                        ins.append(Instruction(i1, i2, len(blocks), mode, True, 1.0))
                        blocks.append(MulIr(mul, ir))
        if output_order == "sorted":
            # e3nn's Irreps.sort(): sorted((ir, i, mul)), so ties keep their order; p[old] = new
            inv = sorted(range(len(blocks)), key=lambda i: (blocks[i].ir.l, blocks[i].ir.p, i))
            p = {old: new for new, old in enumerate(inv)}
            blocks = [blocks[i] for i in inv]
            ins = [Instruction(i.i_in1, i.i_in2, p[i.i_out], i.mode, i.has_weight, i.path_weight) for i in ins]
        if instruction_order == "output":
            ins = sorted(ins, key=lambda i: i.i_out)
        out = Irreps(blocks)
    if not ins:
        raise InstructionError("irreps_out", f"mode {mode!r} gives no path from these irreps")
    return out, tuple(ins)


def check_instruction(ins: Instruction, irreps_in1: Irreps, irreps_in2: Irreps, irreps_out: Irreps) -> None:
    """Check one instruction as ``e3nn.o3.TensorProduct`` would; raise ``InstructionError``."""
    for idx, irreps, what in ((ins.i_in1, irreps_in1, "i_in1"), (ins.i_in2, irreps_in2, "i_in2"), (ins.i_out, irreps_out, "i_out")):
        if not 0 <= idx < len(irreps):
            raise InstructionError("instructions", f"{ins}: {what}={idx} out of range for {len(irreps)} irreps")
    if ins.mode not in MODES:
        raise InstructionError("instructions", f"{ins}: unknown mode {ins.mode!r}; expected one of {', '.join(MODES)}")
    m1, m2, mo = irreps_in1[ins.i_in1], irreps_in2[ins.i_in2], irreps_out[ins.i_out]
    if mo.ir.p != m1.ir.p * m2.ir.p:
        raise InstructionError("instructions", f"{ins}: parity violation, {m1.ir} x {m2.ir} cannot give {mo.ir}")
    if not abs(m1.ir.l - m2.ir.l) <= mo.ir.l <= m1.ir.l + m2.ir.l:
        raise InstructionError("instructions", f"{ins}: triangle violation, {m1.ir} x {m2.ir} cannot give {mo.ir}")
    need = {
        "uvw": [],
        "uvu": [("mul_in1", m1.mul, "mul_out", mo.mul)],
        "uvv": [("mul_in2", m2.mul, "mul_out", mo.mul)],
        "uuu": [("mul_in1", m1.mul, "mul_in2", m2.mul), ("mul_in1", m1.mul, "mul_out", mo.mul)],
    }[ins.mode]
    for na, a, nb, b in need:
        if a != b:
            raise InstructionError("instructions", f"{ins}: mode {ins.mode!r} needs {na} == {nb}, got {a} != {b}")
    if ins.mode == "uvw" and not ins.has_weight:
        raise InstructionError("instructions", f"{ins}: mode 'uvw' needs has_weight = true (as in e3nn)")
    if not (isinstance(ins.path_weight, float) and math.isfinite(ins.path_weight) and ins.path_weight >= 0):
        raise InstructionError("instructions", f"{ins}: path_weight must be a finite number >= 0")


def path_shape(ins: Instruction, irreps_in1: Irreps, irreps_in2: Irreps, irreps_out: Irreps) -> tuple[int, ...]:
    """Shape of the path's weight block, as e3nn's ``Instruction.path_shape``."""
    m1, m2, mo = irreps_in1[ins.i_in1].mul, irreps_in2[ins.i_in2].mul, irreps_out[ins.i_out].mul
    return {"uvw": (m1, m2, mo), "uvu": (m1, m2), "uvv": (m1, m2), "uuu": (m1,)}[ins.mode]


def _num_elements(ins: Instruction, irreps_in1: Irreps, irreps_in2: Irreps) -> int:
    m1, m2 = irreps_in1[ins.i_in1].mul, irreps_in2[ins.i_in2].mul
    return {"uvw": m1 * m2, "uvu": m2, "uvv": m1, "uuu": 1}[ins.mode]


def normalized_path_alphas(
    irreps_in1: Irreps,
    irreps_in2: Irreps,
    irreps_out: Irreps,
    instructions: tuple[Instruction, ...],
    irrep_normalization: str = "component",
    path_normalization: str = "element",
) -> tuple[Fraction, ...]:
    """The square of e3nn's final ``Instruction.path_weight`` per instruction, exactly.

    Follows ``e3nn.o3.TensorProduct.__init__`` (e3nn 0.6.0): ``alpha`` is ``2 l_out + 1``
    (component), ``(2 l1 + 1)(2 l2 + 1)`` (norm) or 1, divided by the fan-in (element:
    summed over the paths into the same output; path: this path's times the number of
    paths into the output), times the user's ``path_weight`` (a float, taken exactly).
    e3nn's path weight is ``sqrt(alpha)``: the user's ``path_weight`` thus enters under the
    square root. Raises ``InstructionError`` for an unknown normalization.
    """
    out = []
    for ins in instructions:
        m1, m2, mo = irreps_in1[ins.i_in1], irreps_in2[ins.i_in2], irreps_out[ins.i_out]
        if irrep_normalization == "component":
            alpha = Fraction(mo.ir.dim)
        elif irrep_normalization == "norm":
            alpha = Fraction(m1.ir.dim * m2.ir.dim)
        elif irrep_normalization == "none":
            alpha = Fraction(1)
        else:
            raise InstructionError("irrep_normalization", f"unknown value {irrep_normalization!r}")
        same_out = [i for i in instructions if i.i_out == ins.i_out]
        if path_normalization == "element":
            x = sum(_num_elements(i, irreps_in1, irreps_in2) for i in same_out)
        elif path_normalization == "path":
            x = _num_elements(ins, irreps_in1, irreps_in2) * len(same_out)
        elif path_normalization == "none":
            x = 1
        else:
            raise InstructionError("path_normalization", f"unknown value {path_normalization!r}")
        if x > 0:
            alpha /= x
        out.append(alpha * Fraction(ins.path_weight))
    return tuple(out)


def normalized_path_weights(
    irreps_in1: Irreps,
    irreps_in2: Irreps,
    irreps_out: Irreps,
    instructions: tuple[Instruction, ...],
    irrep_normalization: str = "component",
    path_normalization: str = "element",
) -> tuple[float, ...]:
    """e3nn's final ``Instruction.path_weight`` for each instruction (unit input variances):
    ``sqrt(alpha)`` of ``normalized_path_alphas``, correctly rounded to float64."""
    alphas = normalized_path_alphas(irreps_in1, irreps_in2, irreps_out, instructions,
                                    irrep_normalization, path_normalization)
    return tuple(_sqrt(a) for a in alphas)


def _sqrt(a: Fraction) -> float:
    # sqrt of the correctly rounded quotient: what e3nn computes, within one rounding
    return math.sqrt(a.numerator / a.denominator)
