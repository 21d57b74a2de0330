"""The numpy reference (on the lowered IR) against e3nn.o3.TensorProduct, on random specs.

Specs are drawn as TOML text and go through ``parse_spec`` and ``lower``, so this also
exercises the parser, mode rules, path weights and the layouts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from e3nn import o3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqdsl.irreps import Irrep
from eqdsl.lower import lower
from eqdsl.reference import tensor_product_reference, to_layout
from eqdsl.spec import parse_spec

LMAX = 4
MULS = st.integers(1, 5)


@contextlib.contextmanager
def float64_default():
    """e3nn builds its CG buffers and so(3) generators in torch's default dtype."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@dataclass
class Case:
    text: str
    in1: list  # [(mul, Irrep)]
    in2: list
    out: list
    instructions: list  # [(i1, i2, io, mode, has_weight, path_weight or None)]


def _irreps_text(blocks) -> str:
    return "+".join(f"{m}x{ir}" for m, ir in blocks)


def _irrep(draw) -> Irrep:
    return Irrep(draw(st.integers(0, LMAX)), draw(st.sampled_from([1, -1])))


@st.composite
def tp_cases(draw, modes=("uvw", "uvu", "uvv", "uuu")):
    in1 = [(draw(MULS), _irrep(draw)) for _ in range(draw(st.integers(1, 3)))]
    in1_muls = [m for m, _ in in1]
    # in2 multiplicities often copy in1's, so that uuu paths are possible
    in2 = [
        (draw(st.one_of(MULS, st.sampled_from(in1_muls))), _irrep(draw)) for _ in range(draw(st.integers(1, 3)))
    ]
    out: list = []
    ins: list = []
    used: set = set()
    for _ in range(draw(st.integers(1, 6))):
        i1 = draw(st.integers(0, len(in1) - 1))
        i2 = draw(st.integers(0, len(in2) - 1))
        (m1, ir1), (m2, ir2) = in1[i1], in2[i2]
        allowed = [m for m in modes if m != "uuu" or m1 == m2]
        if not allowed:
            continue
        mode = draw(st.sampled_from(allowed))
        ir_out = draw(st.sampled_from(list(ir1 * ir2)))
        need = {"uvu": m1, "uvv": m2, "uuu": m1}.get(mode)  # uvw: any output multiplicity
        reuse = [
            k for k, (m, ir) in enumerate(out)
            if ir == ir_out and (need is None or m == need) and (i1, i2, k, mode) not in used
        ]
        if reuse and draw(st.booleans()):  # several paths into one output block: fan-in normalization
            io = draw(st.sampled_from(reuse))
        else:
            io = len(out)
            out.append((need if need is not None else draw(MULS), ir_out))
        if (i1, i2, io, mode) in used:
            continue
        used.add((i1, i2, io, mode))
        has_weight = True if mode == "uvw" else draw(st.booleans())
        pw = draw(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 2.0]), st.floats(0.01, 4.0)))
        ins.append((i1, i2, io, mode, has_weight, pw))
    if not ins:  # fall back to one fully connected path
        (m1, ir1), (m2, ir2) = in1[0], in2[0]
        out.append((draw(MULS), next(iter(ir1 * ir2))))
        ins.append((0, 0, len(out) - 1, "uvw", True, None))
    if draw(st.booleans()):  # an output block that no path writes: it must stay zero
        out.append((draw(MULS), _irrep(draw)))
    perm = draw(st.permutations(range(len(out))))  # output blocks in any order
    out = [out[k] for k in perm]
    ins = [(i1, i2, perm.index(io), mode, hw, pw) for i1, i2, io, mode, hw, pw in ins]

    lines = [
        "[[tensor_product]]",
        'name = "random_tp"',
        f'irreps_in1 = "{_irreps_text(in1)}"',
        f'irreps_in2 = "{_irreps_text(in2)}"',
        f'irreps_out = "{_irreps_text(out)}"',
        "instructions = [",
    ]
    for i1, i2, io, mode, hw, pw in ins:
        tail = "" if pw is None else f", {pw!r}"
        lines.append(f'  [{i1}, {i2}, {io}, "{mode}", {"true" if hw else "false"}{tail}],')
    lines.append("]")
    lines.append(f'irrep_normalization = "{draw(st.sampled_from(["component", "norm", "none"]))}"')
    lines.append(f'path_normalization = "{draw(st.sampled_from(["element", "path", "none"]))}"')
    lines.append(f"shared_weights = {'true' if draw(st.booleans()) else 'false'}")
    lines.append(f'layout = "{draw(st.sampled_from(["mul_ir", "ir_mul"]))}"')
    lines.append('dtypes = ["float64"]')
    return Case("\n".join(lines) + "\n", in1, in2, out, ins)


def _e3nn_tp(spec) -> o3.TensorProduct:
    with float64_default():
        return o3.TensorProduct(
            str(spec.irreps_in1),
            str(spec.irreps_in2),
            str(spec.irreps_out),
            [ins.as_tuple() for ins in spec.instructions],
            irrep_normalization=spec.irrep_normalization,
            path_normalization=spec.path_normalization,
            shared_weights=spec.shared_weights,
            internal_weights=False,
        )


def _reference_mul_ir(ir, x1, x2, w):
    """Run the reference in the IR's layout, with inputs and outputs in e3nn's mul_ir."""
    a = to_layout(x1, ir.in1, "mul_ir", ir.layout)
    b = to_layout(x2, ir.in2, "mul_ir", ir.layout)
    out = tensor_product_reference(ir, a, b, w)
    return to_layout(out, ir.out, ir.layout, "mul_ir")


def _inputs(ir, batch, seed):
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=(batch, ir.dim_in1))
    x2 = rng.normal(size=(batch, ir.dim_in2))
    w = rng.normal(size=(ir.weight_numel,) if ir.shared_weights else (batch, ir.weight_numel))
    return x1, x2, w


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp_cases(), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_reference_matches_e3nn(case, batch, seed):
    (spec,) = parse_spec(case.text, "random.toml")
    # the parser kept what was written
    assert [(m, ir) for m, ir in spec.irreps_out] == case.out
    assert [i.as_tuple()[:5] for i in spec.instructions] == [c[:5] for c in case.instructions]
    assert [i.path_weight for i in spec.instructions] == [1.0 if c[5] is None else c[5] for c in case.instructions]

    ir = lower(spec)
    tp = _e3nn_tp(spec)
    assert ir.weight_numel == tp.weight_numel
    assert (ir.dim_in1, ir.dim_in2, ir.dim_out) == (tp.irreps_in1.dim, tp.irreps_in2.dim, tp.irreps_out.dim)
    assert len(ir.paths) == len(tp.instructions)
    offset = 0
    for p, t in zip(ir.paths, tp.instructions):
        assert (p.i_in1, p.i_in2, p.i_out, p.mode, p.has_weight) == (
            t.i_in1, t.i_in2, t.i_out, t.connection_mode, t.has_weight)
        assert p.path_weight == pytest.approx(t.path_weight, rel=1e-15, abs=0.0)
        assert p.path_shape == tuple(t.path_shape)
        assert p.weight_numel == (int(np.prod(t.path_shape)) if t.has_weight else 0)
        assert p.weight_offset == (offset if t.has_weight else -1)
        offset += p.weight_numel

    x1, x2, w = _inputs(ir, batch, seed)
    with float64_default():
        expected = tp(torch.from_numpy(x1), torch.from_numpy(x2), torch.from_numpy(w)).numpy()
    got = _reference_mul_ir(ir, x1, x2, w)
    assert got.shape == expected.shape == (batch, ir.dim_out)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    # unwritten output blocks are exactly zero
    written = {p.i_out for p in ir.paths}
    for b in ir.out:
        if b.index not in written:
            assert not got[:, b.offset : b.offset + b.size].any()


def _wigner_d(irreps, rot: torch.Tensor, inversion: bool) -> np.ndarray:
    """Block-diagonal representation of ``(-1)^inversion * rot`` on ``irreps`` (mul_ir), float64.

    e3nn's ``D_from_matrix`` goes through ``torch.matrix_exp``, which on torch 2.13 CPU is only
    ~1e-10 accurate in float64 for matrices of small norm (seen for ``exp(b X)`` with the l=1
    generator X and 0.01 < b < 0.09: sin(b) off by 1.4e-10 at b = 0.0443), too coarse for a
    1e-10 check. So each ``D^l`` is fitted instead from e3nn's (polynomial, exact to
    rounding) spherical harmonics, ``Y(R x) = D^l(R) Y(x)``, and cross-checked against
    ``D_from_matrix`` at the accuracy that one has.
    """
    with float64_default():
        pts = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
        e3 = o3.Irreps(str(irreps))
        reference = e3.D_from_matrix(-rot if inversion else rot).numpy()
        blocks = []
        for mul, ir in e3:
            y = o3.spherical_harmonics(ir.l, pts, normalize=True).numpy()
            y_rot = o3.spherical_harmonics(ir.l, pts @ rot.T, normalize=True).numpy()
            dt, *_ = np.linalg.lstsq(y, y_rot, rcond=None)
            np.testing.assert_allclose(y @ dt, y_rot, atol=1e-13)
            d = dt.T * (ir.p if inversion else 1)
            blocks.extend([d] * mul)
    out = np.zeros((e3.dim, e3.dim))
    k = 0
    for d in blocks:
        out[k : k + len(d), k : k + len(d)] = d
        k += len(d)
    np.testing.assert_allclose(out, reference, atol=1e-8)  # same basis and parity convention as e3nn
    np.testing.assert_allclose(out @ out.T, np.eye(e3.dim), atol=1e-13)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp_cases(), st.booleans(), st.integers(0, 2**32 - 1))
def test_reference_is_equivariant(case, inversion, seed):
    (spec,) = parse_spec(case.text, "random.toml")
    ir = lower(spec)
    x1, x2, w = _inputs(ir, 2, seed)
    with float64_default():
        torch.manual_seed(seed % 2**31)
        rot = o3.rand_matrix()
    d1, d2, do = (_wigner_d(irr, rot, inversion) for irr in (spec.irreps_in1, spec.irreps_in2, spec.irreps_out))
    out = _reference_mul_ir(ir, x1, x2, w)
    out_of_rotated = _reference_mul_ir(ir, x1 @ d1.T, x2 @ d2.T, w)
    np.testing.assert_allclose(out_of_rotated, out @ do.T, rtol=1e-10, atol=1e-10)


def test_equivariance_check_sees_a_wrong_output_label():
    """The same check fails if the output irreps are mislabelled (1e read as 1o, 2e as 2o)."""
    (spec,) = parse_spec(
        '[[tensor_product]]\nname = "t"\nirreps_in1 = "2x1o"\nirreps_in2 = "1o+2e"\nirreps_out = "3x1e"\n'
        'mode = "uvw"\n'
    )
    ir = lower(spec)
    x1, x2, w = _inputs(ir, 2, 1)
    with float64_default():
        torch.manual_seed(1)
        rot = o3.rand_matrix()
    d1, d2 = _wigner_d(spec.irreps_in1, rot, True), _wigner_d(spec.irreps_in2, rot, True)
    good, bad = _wigner_d(spec.irreps_out, rot, True), _wigner_d("3x1o", rot, True)
    out = _reference_mul_ir(ir, x1, x2, w)
    rotated = _reference_mul_ir(ir, x1 @ d1.T, x2 @ d2.T, w)
    np.testing.assert_allclose(rotated, out @ good.T, atol=1e-10)
    assert np.abs(rotated - out @ bad.T).max() > 0.1


def test_inversion_parity_is_seen():
    """A 1o x 1o -> 1e path (cross product) flips sign relative to 1o under inversion; the
    reference must not be accidentally 'equivariant' to a wrongly labelled output."""
    text = """
[[tensor_product]]
name = "cross"
irreps_in1 = "1o"
irreps_in2 = "1o"
irreps_out = "1e"
mode = "uvw"
"""
    (spec,) = parse_spec(text)
    ir = lower(spec)
    x1, x2 = np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 1.0, 0.0]])
    w = np.ones(1)
    out = tensor_product_reference(ir, x1, x2, w)
    # inversion: x -> -x for both 1o inputs leaves the product unchanged, as a 1e must be
    np.testing.assert_allclose(tensor_product_reference(ir, -x1, -x2, w), out, atol=0)
    # and the cross product of e_x and e_y (e3nn basis order x, y, z) is along e_z
    assert abs(out[0, 0]) < 1e-15 and abs(out[0, 1]) < 1e-15 and abs(out[0, 2]) > 0.1


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_layout_round_trip_and_reference_input_checks(layout):
    text = f"""
[[tensor_product]]
name = "t"
irreps_in1 = "3x1o+2x0e"
irreps_in2 = "2x1o"
irreps_out = "0e+1e"
mode = "uvu"
shared_weights = false
layout = "{layout}"
"""
    (spec,) = parse_spec(text)
    ir = lower(spec)
    x1, x2, w = _inputs(ir, 4, 0)
    for blocks, x in ((ir.in1, x1), (ir.in2, x2)):
        other = "ir_mul" if layout == "mul_ir" else "mul_ir"
        np.testing.assert_array_equal(to_layout(to_layout(x, blocks, layout, other), blocks, other, layout), x)
    with pytest.raises(ValueError):
        tensor_product_reference(ir, x1[:, :-1], x2, w)
    with pytest.raises(ValueError):
        tensor_product_reference(ir, x1, x2, w[0])  # per-batch weights need a batch dimension
