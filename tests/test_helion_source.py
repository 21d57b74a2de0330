"""Static checks of the generated Helion source that the CPU interpreter cannot make.

Triton compiles a ``for`` loop with the names assigned before it and reassigned inside it
as loop-carried values whose type (shape) must not change. The interpreter runs such code
happily, so a reused temporary name (e.g. a ``(batch, channel)`` product before a
reduction loop and a ``(batch, reduction)`` one inside it) only fails when the kernel is
compiled for a GPU. The generator names its temporaries so that the only loop-carried
names are its accumulators (``acc*``) and the sub-tile row helpers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from eqdsl.backends.helion.conv import graph_names
from eqdsl.codegen.generate import generate_files
from eqdsl.lower import lower
from eqdsl.spec import load_spec, parse_spec
from eqdsl.tune import with_tuning

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [p for p in sorted((ROOT / "examples" / "specs").glob("*.toml")) if load_spec(p)]  # tensor products
CARRIED_OK = {"rows", "ok", "okc"}
# accumulators: ``acc*``, and the segment (deterministic conv) kernels' per-node ``tot*``
CARRIED_PREFIXES = ("acc", "tot")

# Every mode, uvw reductions over x1 and over x2, several channel groups (from test_torch_grads).
MODES = (
    '[[0, 0, 0, "uvw", true], [1, 1, 4, "uvw", true], [0, 1, 1, "uvv", true], '
    '[1, 0, 1, "uvw", true, 0.5], [1, 0, 2, "uvu", false], [0, 1, 2, "uvv", false], '
    '[1, 1, 3, "uuu", true]]'
)


def _assigned(nodes) -> set[str]:
    return {
        t.id
        for node in nodes
        for sub in ast.walk(node)
        if isinstance(sub, ast.Assign)
        for t in sub.targets
        if isinstance(t, ast.Name)
    }


def _reassigned_in_loops(body, outer: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, name) for each name a ``for`` body assigns that was assigned before the loop."""
    bad, seen = [], set(outer)
    for stmt in body:
        if isinstance(stmt, ast.For):
            bad += [(stmt.lineno, n) for n in sorted(_assigned(stmt.body) & seen)
                    if n not in CARRIED_OK and not n.startswith(CARRIED_PREFIXES)]
            bad += _reassigned_in_loops(stmt.body, frozenset(seen))
        else:
            seen |= _assigned([stmt])
    return bad


def _kernel_sources(spec_path: Path, out: Path) -> dict[str, str]:
    return {rel: text for rel, text in generate_files(spec_path, out, triton=False).items()
            if rel.endswith(("helion_kernels.py", "helion_conv_kernels.py"))}


def _check(sources: dict[str, str]) -> None:
    assert sources
    for rel, text in sources.items():
        for fn in ast.parse(text).body:
            if isinstance(fn, ast.FunctionDef):
                assert not _reassigned_in_loops(fn.body), (rel, fn.name, _reassigned_in_loops(fn.body)[:5])


def test_checker_flags_a_reused_temporary():
    src = "def k():\n    q0 = a\n    for t in r:\n        q0 = b\n        acc0 = acc0 + q0\n"
    assert _reassigned_in_loops(ast.parse(src).body[0].body) == [(3, "q0")]


@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_carry_only_accumulators(spec_path, tmp_path):
    _check(_kernel_sources(spec_path, tmp_path / "gen"))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_every_mode_carries_only_accumulators(shared, layout, tmp_path):
    spec = tmp_path / "modes.toml"
    spec.write_text(
        "[[tensor_product]]\n"
        'name = "modes"\n'
        'irreps_in1 = "2x0e+1x1o"\n'
        'irreps_in2 = "3x0e+1x1o"\n'
        'irreps_out = "1x0e+1x1o+1x1o+1x1e+2x1e"\n'
        f"instructions = {MODES}\n"
        f"shared_weights = {'true' if shared else 'false'}\n"
        f'layout = "{layout}"\n'
    )
    _check(_kernel_sources(spec, tmp_path / "gen"))


# ---------------------------------------------------------------- printer (whole-row accesses)

from eqdsl.backends.helion.kernels import TILE_B, element_access  # noqa: E402
from eqdsl.backends.helion.printer import (  # noqa: E402
    Access, Arange, Assign, AtomicAdd, Loop, MaskedLoad, MaskedStore, Read, Row, Store, Tile, TileId, Zeros, print_stmt,
)

C, R, S = Tile("tile_c"), Tile("tile_r"), Tile("tile_s")


def test_access_folds_literals_and_broadcasts_tiles():
    """Block element ``(i0, i1)`` of a row-major block at a column offset: literals fold
    into the constant, each tile keeps its own axis (``None`` in the others)."""
    x1_2 = lambda *ix: element_access("x1", TILE_B, 64, (32, 3), ix)  # noqa: E731  (mul_ir 32x1o at column 64)
    assert print_stmt(Assign("a", Read(x1_2(5, 1), "[:, None]"))) == "a = x1[tile_b, 80][:, None]"
    assert print_stmt(Assign("b", Read(element_access("x1", TILE_B, 0, (1, 32), (0, C))))) == "b = x1[tile_b, tile_c.index]"
    w3 = element_access("weights", None, 96, (4, 8), (R, C))  # shared weights: no row
    assert print_stmt(Assign("c", Read(w3, "[None, :, :]"))) == (
        "c = weights[96 + tile_r.index[:, None] * 8 + tile_c.index[None, :]][None, :, :]")
    with pytest.raises(ValueError, match="indices for block shape"):
        element_access("x1", TILE_B, 64, (32, 3), (0,))


def test_load_store_atomic_and_zeros():
    x1_2 = element_access("x1", TILE_B, 64, (32, 3), (C, Arange(4)))
    assert print_stmt(Assign("v", MaskedLoad(x1_2, "m"))) == (
        "v = hl.load(x1, [tile_b, 64 + tile_c.index[:, None] * 3 + hl.arange(4)[None, :]], extra_mask=m)")
    assert print_stmt(MaskedStore(x1_2, "v", "m")) == (
        "hl.store(x1, [tile_b, 64 + tile_c.index[:, None] * 3 + hl.arange(4)[None, :]], v, extra_mask=m)")
    gw3 = element_access("gw", Row("rows"), 96, (4, 8), (1, C))
    assert print_stmt(Store(gw3, "acc")) == "gw[rows, 104 + tile_c.index] = acc"
    assert print_stmt(AtomicAdd(element_access("out", Row("d_idx", True), 8, (3, 4), (2, C)), "acc")) == (
        "hl.atomic_add(out, [d_idx, 16 + tile_c.index], acc)")
    assert print_stmt(Assign("z", Zeros("[tile_b]", "gw"))) == "z = hl.zeros([tile_b], dtype=gw.dtype)"


def test_rows_that_are_not_tiles_keep_their_index():
    """The convolution's gathered ``s_idx`` / ``srows``, a segment's ``node``, a partial-sum
    row ``tile_p.id``: the row index as given, the columns folded as for a tile."""
    s_idx, node = Row("s_idx", True), Row("node")
    assert print_stmt(Assign("a", Read(element_access("x", s_idx, 0, (1, 32), (0, C))))) == "a = x[s_idx, tile_c.index]"
    assert print_stmt(Assign("b", Read(element_access("x", node, 64, (32, 3), (5, 1))))) == "b = x[node, 80]"
    assert print_stmt(Assign("c", MaskedLoad(element_access("x", Row("srows", True), 0, (1, 32), (0, C)), "okc"))) == (
        "c = hl.load(x, [srows, tile_c.index], extra_mask=okc)")
    assert print_stmt(Store(element_access("gw", Row("tile_p.id"), 96, (4, 8), (R, C)), "acc3")) == (
        "gw[tile_p.id, 96 + tile_r.index[:, None] * 8 + tile_c.index[None, :]] = acc3")


def test_gathered_row_broadcasts_against_a_multi_axis_column():
    """Against a column of two axes Helion broadcasts the tensor indexers together, so a
    gathered 1-D row gets its own leading dimension; a tile row stays as it is."""
    eid = Row("eid", True)
    w5 = lambda row, *ix: print_stmt(Assign("w", Read(element_access("weights", row, 10, (2, 4, 3), ix))))  # noqa: E731
    assert w5(eid, S, R, 0) == (
        "w = weights[eid[:, None, None], 10 + tile_s.index[None, :, None] * 12 + tile_r.index[None, None, :] * 3]")
    assert w5(TILE_B, S, R, 0) == "w = weights[tile_b, 10 + tile_s.index[:, None] * 12 + tile_r.index[None, :] * 3]"
    assert w5(eid, 1, R, 0) == "w = weights[eid, 22 + tile_r.index * 3]"
    # a gathered row is what the convolution passes; the same access with a tile row is the plain TP's
    assert w5(Row("eid"), S, R, 0) == "w = weights[eid, 10 + tile_s.index[:, None] * 12 + tile_r.index[None, :] * 3]"


def test_partial_sum_slot_and_loop():
    """A program's partial-sum column (``tile_c.id``) keeps its base even when 0; a ``Loop``
    prints its body indented once."""
    slot = Access("gx2p", TILE_B, 0, ((TileId("tile_c"), 16),))
    assert print_stmt(Store(slot, "p.sum(1)")) == "gx2p[tile_b, 0 + tile_c.id * 16] = p.sum(1)"
    loop = Loop("tile_s in hl.tile(8, block_size=4)", (Assign("a", "b"), Loop("i in x", (Assign("c", "d"),))))
    assert print_stmt(loop) == "for tile_s in hl.tile(8, block_size=4):\n    a = b\n    for i in x:\n        c = d"


def _whole_row_params(text: str) -> set[str]:
    return {a.arg for fn in ast.parse(text).body if isinstance(fn, ast.FunctionDef) for a in fn.args.args}


@pytest.mark.parametrize("spec_path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_plain_tp_kernels_take_whole_rows(spec_path, tmp_path):
    """No per-block view is left in the plain tensor product's kernels or launchers, nor
    in the fused convolution's (specs with ``conv = true``)."""
    files = generate_files(spec_path, tmp_path / "gen", triton=False)
    for rel, text in files.items():
        if rel.endswith("/helion_kernels.py"):
            params = _whole_row_params(text)
            assert params <= {"x1", "x2", "weights", "g", "out", "gx1", "gx2", "gx2p", "gw"}, (rel, params)
        if rel.endswith("/helion_conv_kernels.py"):
            params = _whole_row_params(text)
            assert params <= {"src", "dst", "order", "ptr", "x", "y", "weights", "g", "out", "gx", "gy", "gyp", "gw",
                              "radial_features", "radial_weight"}, (rel, params)  # conv_radial's whole rows
        if rel.endswith(("/torch_ops.py", "/torch_conv.py")):
            assert "unflatten" not in text, rel


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_every_conv_variant_takes_whole_rows(deterministic, shared, tmp_path):
    """Every mode in the fused convolution (atomic and segment scatters, per-edge and shared
    weights): whole-row kernel parameters, no host views, only accumulators carried."""
    spec = tmp_path / "conv_modes.toml"
    spec.write_text(
        "[[tensor_product]]\n"
        'name = "conv_modes"\n'
        'irreps_in1 = "2x0e+1x1o"\n'
        'irreps_in2 = "3x0e+1x1o"\n'
        'irreps_out = "1x0e+1x1o+1x1o+1x1e+2x1e"\n'
        f"instructions = {MODES}\n"
        f"shared_weights = {'true' if shared else 'false'}\n"
        'layout = "mul_ir"\n'
        "conv = true\n"
        f"deterministic = {'true' if deterministic else 'false'}\n"
    )
    files = generate_files(spec, tmp_path / "gen", triton=False)
    conv = {rel: text for rel, text in files.items() if rel.endswith("/helion_conv_kernels.py")}
    _check(conv)
    graph = {"src", "dst"} | ({"order", "ptr"} if deterministic else set())
    for rel, text in conv.items():
        assert _whole_row_params(text) <= graph | {"x", "y", "weights", "g", "out", "gx", "gy", "gw"}, rel
    assert "unflatten" not in next(t for r, t in files.items() if r.endswith("/torch_conv.py"))


@pytest.mark.parametrize("tuning, segment_fwd, small", [
    ("", False, False),
    ("[tensor_product.tuning.conv_fwd]\nsegment = 1\n", True, True),
    ("[tensor_product.tuning.conv_fwd]\nsegment = 1\nsegment_min_edges = 0\n", True, False),
])
def test_segment_tuning_chooses_the_forward_scatter(tuning, segment_fwd, small, tmp_path):
    """``segment = 1`` in ``conv_fwd`` (``deterministic = false``): the forward's kernels are
    segment reductions stepping one edge at a time over ``order`` / ``ptr``, the node
    gradient keeps its atomics, the graph gains ``dst_order`` / ``dst_ptr`` only, and
    atomic ``*_small`` copies of the forward serve graphs under ``SEGMENT_MIN_EDGES``
    (none with ``segment_min_edges = 0``)."""
    spec = tmp_path / "conv_seg.toml"
    spec.write_text(
        "[[tensor_product]]\n"
        'name = "conv_seg"\n'
        'irreps_in1 = "2x0e+1x1o"\n'
        'irreps_in2 = "3x0e+1x1o"\n'
        'irreps_out = "1x0e+1x1o+1x1o+1x1e+2x1e"\n'
        f"instructions = {MODES}\n"
        "shared_weights = false\n"
        "conv = true\n" + tuning
    )
    files = generate_files(spec, tmp_path / "gen", triton=False)
    kernels = next(t for r, t in files.items() if r.endswith("/helion_conv_kernels.py"))
    ops = next(t for r, t in files.items() if r.endswith("/torch_conv.py"))
    bodies = dict(chunk.split("(", 1) for chunk in kernels.split("\ndef ")[1:])
    fwd = [b for n, b in bodies.items() if n.startswith("conv_fwd_") and not n.endswith("_small")]
    assert fwd and all(("hl.tile(start, end, block_size=1)" in b) == segment_fwd for b in fwd)
    assert all("hl.atomic_add" in b for n, b in bodies.items() if n.startswith("conv_bwd_x1_"))
    assert any(n.endswith("_small") for n in bodies) == small
    assert all("hl.atomic_add" in b for n, b in bodies.items() if n.endswith("_small"))
    parsed = parse_spec(spec.read_text(), "conv_seg.toml")[0]
    graph = ("src", "dst", "dst_order", "dst_ptr") if segment_fwd else ("src", "dst")
    assert graph_names(lower(parsed), parsed.tuning) == graph and "src_order" not in ops
    assert ("SEGMENT_MIN_EDGES = 8192" in ops) == small


@pytest.mark.parametrize("grid_c", [None, 0, 1])
def test_grid_c_decides_the_channel_grid_axis(grid_c, tmp_path):
    """mace_large's spec: by default (and with ``grid_c = 1``) every kernel whose outputs
    have 128 channels in tiles of 32 or 64 (the spec's tuned ``block_c``; a tile of 128 is
    the only one, so nothing is spread) takes the channel tiles as a grid axis, in the
    plain TP and the conv; ``bwd_x2`` (edge attributes: one channel per block, a reduction
    over the node channels) keeps its 1-D grid; ``grid_c = 0`` gives every kernel the 1-D
    grid and its channel loop. Only accumulators are carried in either form."""
    text = (ROOT / "examples" / "specs" / "mace_large.toml").read_text()
    if grid_c is not None:
        pairs = dict(parse_spec(text)[0].tuning) | {"grid_c": grid_c}
        text = with_tuning(text, tuple(sorted(pairs.items())))
    spec = tmp_path / "mace_large.toml"
    spec.write_text(text)
    files = _kernel_sources(spec, tmp_path / "gen")
    _check(files)
    on = grid_c != 0
    for rel, text in files.items():
        kernels = dict(chunk.split("(", 1) for chunk in text.split("\ndef ")[1:])
        for name, body in kernels.items():
            # block_b and block_c are the spec's tuned values per op: the channel count is fixed
            # (edge tiles, or one node per program where conv_fwd is a segment scatter: tile_n)
            two_d = re.search(r"for tile_c, tile_[bn] in hl\.tile\(\[128, \w+\.size\(0\)\], block_size=\[(32|64), \d+\]\):", body) is not None
            # a 128-channel tile is the only one: nothing to spread over the grid
            single = "for tile_c in hl.tile(128, block_size=128):" in body
            expect = on and "bwd_x2" not in name and not single
            assert two_d == expect, (rel, name)
            loop = re.search(r"for tile_c in hl\.tile\(128, block_size=(32|64)\):", body) is not None
            assert loop == (not expect and "bwd_x2" not in name and not single)


def test_the_convolution_is_a_parameter_of_the_kernels():
    """The same builders with the convolution's ``Operands``: node rows gathered per edge
    (``x`` at ``s_idx``, ``g`` at ``d_idx``), node outputs scattered atomically or, as a
    segment, summed per node (edge rows at the sorted ``eid``); the tensor product's
    operands are rows of the batch tile, stored in place."""
    from eqdsl.backends.helion.conv import conv_operands
    from eqdsl.backends.helion.kernels import kernel_context

    text = ('[[tensor_product]]\nname = "c"\nirreps_in1 = "4x0e+4x1o"\nirreps_in2 = "0e+1o"\n'
            'irreps_out = "0e+1o"\nmode = "uvu"\nshared_weights = false\nlayout = "ir_mul"\n')
    ir = lower(parse_spec(text)[0])

    def body(ctx: dict, family: str) -> str:
        g = ctx[family][0]["channel_groups"][0]
        return "\n".join(ctx[family][0]["scalars"] + g["loads"] + [s for oc in g["outs"] for s in oc["updates"] + oc["stores"]]
                         + g["deferred_stores"] + [r for red in g["reductions"] for r in red["loads"] + red["updates"]])

    tp = kernel_context(ir)
    assert "x1[tile_b, " in body(tp, "fwd") and "out[tile_b, tile_c.index] = acc0_0" in body(tp, "fwd")
    atomic = kernel_context(ir, operands=lambda f: conv_operands({"fwd": "dst", "bwd_x1": "src"}.get(f, "edge"), False),
                            prefix="conv")
    fwd = body(atomic, "fwd")
    assert "x[s_idx, " in fwd and "y[tile_b, " in fwd and "weights[tile_b, " in fwd
    assert "hl.atomic_add(out, [d_idx, tile_c.index], acc0_0)" in fwd and "x1[" not in fwd
    assert "hl.atomic_add(gx, [s_idx, " in body(atomic, "bwd_x1") and "g[d_idx, " in body(atomic, "bwd_x1")
    assert "gy[tile_b, " in body(atomic, "bwd_x2")  # edge rows: stored, not scattered
    assert atomic["fwd"][0]["name"] == "conv_fwd_0" and {"s_idx", "d_idx"} <= atomic["fwd"][0]["rows_used"]
    segment = kernel_context(ir, operands=lambda f: conv_operands("dst", f == "fwd"), prefix="conv")
    fwd = body(segment, "fwd")
    assert "y[eid, " in fwd and "weights[eid, " in fwd and "tot0_0 = tot0_0 + torch.where(ok, acc0_0, 0).sum(0)" in fwd
    finals = segment["fwd"][0]["channel_groups"][0]["finals"]
    assert finals[0] == {"init": "tot0_0 = hl.zeros([tile_c], dtype=out.dtype)", "store": "out[node, tile_c.index] = tot0_0"}
