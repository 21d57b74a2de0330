"""Spec text from an existing e3nn tensor product.

``spec_from_e3nn(tp, name)`` writes a spec reproducing an ``e3nn.o3.TensorProduct``
(any subclass: ``FullyConnectedTensorProduct``, ``ElementwiseTensorProduct``, ...);
``spec_from_e3nn_jax`` does the same for an ``e3nn_jax.legacy.FunctionalTensorProduct``.
The spec lists tp's instructions explicitly, with tp's irreps strings as they are (never
sorted or merged), so the generated op computes ``tp(x1, x2, w)`` with tp's weight
layout.

Neither module records the normalizations it was built with; its instructions hold
only the final path weights (``Instruction.path_weight``, normalizations folded in). The
caller names them, and the path weights they give (``eqdsl.instructions.
normalized_path_weights``) must equal tp's to ``1e-12`` relative, else ``ValueError``:
a module built with ``in1_var`` / ``in2_var`` / ``out_var``, explicit path weights, or
(e3nn-jax) ``gradient_normalization="element"`` is refused rather than approximated.

The Clebsch-Gordan convention is the one of the *installed* library, found by comparing
its ``wigner_3j(1, 2, 2)`` with eqdsl's exact one: equal is ``"e3nn-0.5"`` (e3nn >= 0.5,
e3nn-jax), the negative is ``"e3nn-0.4"`` (e3nn 0.4.x, whose ``wigner_3j`` has the
opposite sign for (1,2,2), (1,3,3), (1,4,4) and their permutations). The spec gets a
``cg_convention`` key only when it is not the default ``"e3nn-0.5"``.

Without a ``tuning`` option, a spec whose kernels are a standard problem's (e.g. MACE's
second interaction is ``mace_large``) gets that problem's measured tuning table
(``eqdsl.tuned``: tile sizes and kernel variants, never the function computed); pass
``tuning={}`` for eqdsl's defaults.
"""

from __future__ import annotations

import numpy as np

from . import cg
from .cg import DEFAULT_CG_CONVENTION
from .instructions import MODES, Instruction, InstructionError, check_instruction, normalized_path_weights
from .irreps import Irreps
from .loader import toml_table
from .spec import parse_spec
from .tuned import for_dtypes, known_tuning, tuning_table

__all__ = ["spec_from_e3nn", "spec_from_e3nn_jax", "cg_convention_of", "DEFAULT_CG_CONVENTION"]

# spec keys written from tp itself: an option may not override them
_FROM_TP = ("name", "irreps_in1", "irreps_in2", "irreps_out", "mode", "instructions", "cg_convention")


def cg_convention_of(w3j_122) -> str:
    """``"e3nn-0.5"`` or ``"e3nn-0.4"`` from a library's ``wigner_3j(1, 2, 2)`` (array
    ``(3, 5, 5)``); ``ValueError`` if it is neither eqdsl's nor its negative."""
    c = np.asarray(w3j_122, dtype=np.float64)
    ref = cg.wigner_3j(1, 2, 2)
    if c.shape == ref.shape and np.allclose(c, ref, rtol=0, atol=1e-9):
        return "e3nn-0.5"
    if c.shape == ref.shape and np.allclose(c, -ref, rtol=0, atol=1e-9):
        return "e3nn-0.4"
    raise ValueError("the installed library's wigner_3j(1, 2, 2) is neither eqdsl's nor its negative: "
                     "unknown Clebsch-Gordan convention")


def _spec_text(
    what: str, tp_instructions, irreps_in1: str, irreps_in2: str, irreps_out: str, shared_weights: bool,
    convention: str, name: str, conv: bool, layout: str, irrep_normalization: str, path_normalization: str,
    dtypes, options: dict, hint: str,
) -> str:
    in1, in2, out = Irreps(irreps_in1), Irreps(irreps_in2), Irreps(irreps_out)
    ins, theirs = [], []
    for j, t in enumerate(tp_instructions):
        if t.connection_mode not in MODES:
            raise ValueError(f"{what}: instruction {j} {_show(t)} has mode {t.connection_mode!r}; "
                             f"eqdsl supports {', '.join(MODES)}")
        i = Instruction(int(t.i_in1), int(t.i_in2), int(t.i_out), t.connection_mode, bool(t.has_weight), 1.0)
        try:
            check_instruction(i, in1, in2, out)
        except InstructionError as e:
            raise ValueError(f"{what}: instruction {j}: {e.reason}") from None
        ins.append(i)
        theirs.append(float(t.path_weight))
    if not ins:
        raise ValueError(f"{what}: has no instruction")
    try:
        ours = normalized_path_weights(in1, in2, out, tuple(ins), irrep_normalization, path_normalization)
    except InstructionError as e:
        raise ValueError(f"{what}: {e.key}: {e.reason}") from None
    for j, (a, b) in enumerate(zip(ours, theirs)):
        if not abs(a - b) <= 1e-12 * abs(b):
            raise ValueError(
                f"{what}: instruction {j} {_show(tp_instructions[j])}: path weight {b!r} in the module, {a!r} from "
                f"irrep_normalization={irrep_normalization!r}, path_normalization={path_normalization!r}: "
                f"wrong irrep_normalization / path_normalization given?{hint}"
            )
    clash = sorted(set(options) & set(_FROM_TP))
    if clash:
        raise ValueError(f"{what}: option {clash[0]!r} comes from the module itself and cannot be given")
    table: dict = {
        "name": name,
        "irreps_in1": irreps_in1,
        "irreps_in2": irreps_in2,
        "irreps_out": irreps_out,
        "instructions": [[i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight] for i in ins],
        "irrep_normalization": irrep_normalization,
        "path_normalization": path_normalization,
        "shared_weights": shared_weights,
        "layout": layout,
        "dtypes": list(dtypes),
    }
    if conv:
        table["conv"] = True
    if convention != DEFAULT_CG_CONVENTION:
        table["cg_convention"] = convention
    table.update(options)
    header = f"# {what}, by eqdsl.spec_from_e3nn\n"
    if "tuning" not in options:
        found = known_tuning(in1, in2, out, tuple(ins), layout, shared_weights)
        if found is not None:
            table["tuning"] = tuning_table(for_dtypes(found[1], dtypes))
            header += f"# tuning: the same kernels as {found[0]}, tuned there (eqdsl.tuned)\n"
    text = header + toml_table(table)
    parse_spec(text, f"<spec_from_e3nn {name}>")  # a SpecError here names the bad option
    return text


def _show(t) -> str:
    return str((t.i_in1, t.i_in2, t.i_out, t.connection_mode, t.has_weight))


def spec_from_e3nn(
    tp,
    name: str,
    *,
    conv: bool = False,
    layout: str = "mul_ir",
    irrep_normalization: str = "component",
    path_normalization: str = "element",
    dtypes=("float32", "float64"),
    **options,
) -> str:
    """Spec TOML text (one ``[[tensor_product]]`` table) computing what ``tp`` computes.

    Args:
        tp: an ``e3nn.o3.TensorProduct`` (or subclass) of the installed e3nn.
        name: the table's name (the generated package's; a Python identifier).
        conv: also generate the fused graph convolution (``conv = true``).
        layout: ``"mul_ir"`` (e3nn's) or ``"ir_mul"``.
        irrep_normalization, path_normalization: what ``tp`` was built with (e3nn's
            defaults ``"component"`` / ``"element"``); checked against its path weights.
        dtypes: which of ``"float32"``, ``"float64"`` to generate.
        **options: more spec keys, e.g. ``reduce="mean"``, ``deterministic=True``,
            ``tuning={"block_b": 8}`` (README "Spec format"); without ``tuning``, the tuning
            of a standard problem with the same kernels, if any (``eqdsl.tuned``).

    Returns:
        Spec text: tp's irreps strings as they are, its instructions explicitly (each
        ``[i_in1, i_in2, i_out, mode, has_weight]``), ``shared_weights`` from tp
        (internal weights are shared), and the installed e3nn's Clebsch-Gordan convention.
        Weights keep e3nn's layout; ``x1`` / ``x2`` / the output are in ``layout``.

    Raises:
        TypeError: ``tp`` is no ``e3nn.o3.TensorProduct``.
        ValueError: a mode eqdsl does not support (``uvuv``, ...), path weights the
            given normalizations do not reproduce (rel 1e-12), an option that tp fixes.
        SpecError: an option is not a valid spec key or value.
    """
    import torch
    from e3nn import o3

    if not isinstance(tp, o3.TensorProduct):
        raise TypeError(f"spec_from_e3nn: expected an e3nn.o3.TensorProduct, got {type(tp).__name__}")
    if "shared_weights" in options:
        raise ValueError("spec_from_e3nn: option 'shared_weights' comes from the module itself and cannot be given")
    import e3nn

    convention = cg_convention_of(o3.wigner_3j(1, 2, 2, dtype=torch.float64).numpy())
    what = f"{type(tp).__name__} (e3nn {e3nn.__version__})"
    return _spec_text(
        what, list(tp.instructions), str(tp.irreps_in1), str(tp.irreps_in2), str(tp.irreps_out),
        bool(tp.shared_weights or tp.internal_weights), convention, name, conv, layout, irrep_normalization,
        path_normalization, dtypes, options, "",
    )


def spec_from_e3nn_jax(
    tp,
    name: str,
    *,
    shared_weights: bool = True,
    conv: bool = False,
    layout: str = "mul_ir",
    irrep_normalization: str = "component",
    path_normalization: str = "element",
    dtypes=("float32", "float64"),
    **options,
) -> str:
    """Spec TOML text computing ``tp.left_right(w, x1, x2)`` (vmapped over rows).

    Args:
        tp: an ``e3nn_jax.legacy.FunctionalTensorProduct`` (what
            ``FunctionalFullyConnectedTensorProduct`` returns, too).
        shared_weights: ``True``: one weight vector for all rows; ``False``: a row per
            batch element (``jax.vmap`` over the weights as well). tp does not say.
        Other arguments as ``spec_from_e3nn`` (e3nn-jax's defaults are ``"component"`` /
            ``"element"``, with ``gradient_normalization="path"``, which leaves the path
            weight in ``path_weight``).

    Raises:
        TypeError, ValueError, SpecError: as ``spec_from_e3nn``.
    """
    import e3nn_jax
    from e3nn_jax.legacy import FunctionalTensorProduct

    if not isinstance(tp, FunctionalTensorProduct):
        raise TypeError(f"spec_from_e3nn_jax: expected an e3nn_jax.legacy.FunctionalTensorProduct, "
                        f"got {type(tp).__name__}")
    convention = cg_convention_of(np.asarray(e3nn_jax.clebsch_gordan(1, 2, 2)))
    what = f"FunctionalTensorProduct (e3nn-jax {e3nn_jax.__version__})"
    hint = " (or gradient_normalization='element', which moves path weights into the weights' init)"
    return _spec_text(
        what, list(tp.instructions), str(tp.irreps_in1), str(tp.irreps_in2), str(tp.irreps_out),
        bool(shared_weights), convention, name, conv, layout, irrep_normalization, path_normalization,
        dtypes, options, hint,
    )
