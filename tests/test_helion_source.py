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

from eqdsl.codegen.generate import generate_files
from eqdsl.spec import parse_spec
from eqdsl.tune import with_tuning

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "specs").glob("*.toml"))
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


# ---------------------------------------------------------------- flat_access (whole-row kernels)

from eqdsl.codegen.flat_access import View, flat_params, flatten_kernels  # noqa: E402

VIEWS = {
    "x1_2": View("x1_2", "x1", 64, (32, 3), True),     # mul_ir block 32x1o at column 64
    "x1_0": View("x1_0", "x1", 0, (1, 32), True),      # ir_mul-shaped 32x0e
    "w3": View("w3", "weights", 96, (4, 8), False),     # shared weights, (u, w)
    "gw3": View("gw3", "gw", 96, (4, 8), True),
}


def test_flat_index_folds_literals_and_broadcasts_tiles():
    src = "a = x1_2[tile_b, 5, 1][:, None]\nb = x1_0[tile_b, 0, tile_c]\nc = w3[tile_r, tile_c][None, :, :]\n"
    assert flatten_kernels(src, VIEWS) == (
        "a = x1[tile_b, 80][:, None]\n"
        "b = x1[tile_b, tile_c.index]\n"
        "c = weights[96 + tile_r.index[:, None] * 8 + tile_c.index[None, :]][None, :, :]\n"
    )


def test_flat_load_store_size_and_dtype():
    src = ("n = x1_2.size(0)\nz = hl.zeros([tile_b], dtype=gw3.dtype)\n"
           "v = hl.load(x1_2, [tile_b, tile_c, hl.arange(4)], extra_mask=m)\n"
           "hl.store(gw3, [rows, 1, tile_c], v)\n")
    assert flatten_kernels(src, VIEWS) == (
        "n = x1.size(0)\nz = hl.zeros([tile_b], dtype=gw.dtype)\n"
        "v = hl.load(x1, [tile_b, 64 + tile_c.index[:, None] * 3 + hl.arange(4)[None, :]], extra_mask=m)\n"
        "hl.store(gw, [rows, 104 + tile_c.index], v)\n"
    )


def test_flat_params_dedupe_in_order_and_unknown_index_is_an_error():
    assert flat_params(["x1_2", "x1_0", "x2_0", "w3"], VIEWS) == ["x1", "x2_0", "weights"]
    with pytest.raises(ValueError, match="cannot fold"):
        flatten_kernels("a = x1_2[tile_b, k, 0]\n", VIEWS)
    with pytest.raises(ValueError, match="indices for shape"):
        flatten_kernels("a = x1_2[tile_b, 0]\n", VIEWS)


def test_flat_gathered_rows_keep_their_index():
    """Row indices that are not tiles (the convolution's gathered ``s_idx`` / ``eid``, a
    segment's ``node``, a partial-sum row ``tile_p.id``) stay the row index; the columns
    fold as for a tile."""
    gathered = frozenset({"s_idx", "eid", "srows"})
    views = dict(VIEWS, w5=View("w5", "weights", 10, (2, 4, 3), True))
    src = ("a = x1_0[s_idx, 0, tile_c]\n"
           "b = x1_2[node, 5, 1]\n"
           "hl.atomic_add(x1_0, [s_idx, 0, tile_c], acc)\n"
           "c = hl.load(x1_0, [srows, 0, tile_c], extra_mask=okc)\n"
           "gw3[tile_p.id, tile_r, tile_c] = acc3\n")
    assert flatten_kernels(src, views, gathered) == (
        "a = x1[s_idx, tile_c.index]\n"
        "b = x1[node, 80]\n"
        "hl.atomic_add(x1, [s_idx, tile_c.index], acc)\n"
        "c = hl.load(x1, [srows, tile_c.index], extra_mask=okc)\n"
        "gw[tile_p.id, 96 + tile_r.index[:, None] * 8 + tile_c.index[None, :]] = acc3\n"
    )


def test_flat_gathered_row_broadcasts_against_a_multi_axis_column():
    """Against a column of two axes Helion broadcasts the tensor indexers together, so a
    gathered 1-D row gets its own leading dimension; a tile row stays as it was."""
    views = {"w5": View("w5", "weights", 10, (2, 4, 3), True)}
    src = "ws0 = w5[eid, tile_s, tile_r, 0]\nwt0 = w5[tile_b, tile_s, tile_r, 0]\nw1 = w5[eid, 1, tile_r, 0]\n"
    assert flatten_kernels(src, views, frozenset({"eid"})) == (
        "ws0 = weights[eid[:, None, None], 10 + tile_s.index[None, :, None] * 12 + tile_r.index[None, None, :] * 3]\n"
        "wt0 = weights[tile_b, 10 + tile_s.index[:, None] * 12 + tile_r.index[None, :] * 3]\n"
        "w1 = weights[eid, 22 + tile_r.index * 3]\n"
    )
    # without naming it gathered, the row is kept as written (the plain tensor product's tiles)
    assert flatten_kernels("ws0 = w5[eid, tile_s, tile_r, 0]\n", views) == (
        "ws0 = weights[eid, 10 + tile_s.index[:, None] * 12 + tile_r.index[None, :] * 3]\n"
    )


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
            assert params <= {"src", "dst", "order", "ptr", "x", "y", "weights", "g", "out", "gx", "gy", "gyp", "gw"}, (rel, params)
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
    graph = "src, dst, dst_order, dst_ptr = graph" if segment_fwd else "src, dst = graph"
    assert graph in ops and "src_order" not in ops
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
