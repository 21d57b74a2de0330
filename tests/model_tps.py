"""e3nn tensor products built the way the models build them (independently of eqdsl)."""

from __future__ import annotations

from e3nn import o3


def channelwise_tp(in1, in2, target, *, shared: bool = False, sort_instructions: bool = True) -> o3.TensorProduct:
    """MACE's / NequIP's channelwise edge product, as mace-torch 0.3.16 builds it
    (``irreps_tools.tp_out_irreps_with_instructions``): every ``(in1, in2, ir_out in the
    target)`` is one ``uvu`` path writing its own ``mul x ir_out`` block; then the output is
    sorted with e3nn's ``Irreps.sort()`` (never merged) and ``i_out`` renumbered. MACE
    (``sort_instructions``) also sorts the instructions by ``i_out``; NequIP 0.19 keeps them
    in path order. Built in the current default dtype."""
    in1, in2, target = o3.Irreps(in1), o3.Irreps(in2), o3.Irreps(target)
    out, instructions = [], []
    for i, (mul, ir_in) in enumerate(in1):
        for j, (_, ir_edge) in enumerate(in2):
            for ir_out in ir_in * ir_edge:
                if ir_out in target:
                    instructions.append((i, j, len(out), "uvu", True))
                    out.append((mul, ir_out))
    out, perm, _ = o3.Irreps(out).sort()
    instructions = [(i1, i2, perm[io], mode, w) for i1, i2, io, mode, w in instructions]
    if sort_instructions:
        instructions = sorted(instructions, key=lambda x: x[2])
    return o3.TensorProduct(in1, in2, out, instructions, shared_weights=shared, internal_weights=False)
