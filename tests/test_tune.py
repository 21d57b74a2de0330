"""``eqdsl tune``: the candidate grid, the spec rewrite and the selection, with a stand-in for
the GPU worker that reads each candidate's generated kernels (the GPU timing itself runs on
the device machine only)."""

import itertools
import re
from pathlib import Path

import pytest

from eqdsl import cli
from eqdsl.spec import load_spec, parse_spec
from eqdsl.tune import (
    DEFAULT_GRID, TuneError, candidates, for_dtype, format_results, override, parse_grid, tune, with_tuning,
)

SPEC = """[[tensor_product]]
name = "tune_demo"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
"""


@pytest.fixture(autouse=True)
def _regenerate_without_triton_code(monkeypatch):
    """``tune(write=True, out_dir=...)`` regenerates the package as ``eqdsl generate`` does,
    Triton code included (Helion's code generation: seconds per kernel and dtype on the CPU,
    50 s of this file's minute). These tests read only the regenerated Pallas and Helion
    sources; the Triton lowering has tests of its own (test_triton_launch, test_dtype_tuning)."""
    import functools

    import eqdsl.codegen.generate as generate_module

    monkeypatch.setattr(generate_module, "generate", functools.partial(generate_module.generate, triton=False))


def test_parse_grid():
    assert parse_grid(["num_warps=4,8", "block_b=16"]) == {"num_warps": (4, 8), "block_b": (16,)}
    for bad, words in [
        ("warps=4", "KEY=V1"),
        ("num_warps", "KEY=V1"),
        ("num_warps=four", "integers"),
        ("num_warps=3", "one of 1, 2, 4, 8, 16"),
        ("block_b=24", "power of two"),
        ("block_b=", "power of two"),
    ]:
        with pytest.raises(TuneError, match=words):
            parse_grid([bad])


def test_candidates_start_from_the_spec_table():
    table = (("fwd.num_warps", 8), ("max_terms", 512), ("num_warps", 4))
    cands = candidates(DEFAULT_GRID, table, "bwd_x1")
    assert cands[0] == ()
    # block_b=16, block_c=32, num_warps=4 are bwd_x1's tuning already: that combination is ()
    assert len(cands) == 2 * 4 * 3 and len(set(cands)) == len(cands)
    assert (("block_b", 16), ("block_c", 32), ("num_warps", 4)) not in cands
    # fwd has num_warps=8 in its sub-table: the combination with 8 is its current tuning instead
    fwd = candidates(DEFAULT_GRID, table, "fwd")
    assert (("block_b", 16), ("block_c", 32), ("num_warps", 8)) not in fwd
    assert (("block_b", 16), ("block_c", 32), ("num_warps", 4)) in fwd
    assert candidates({"num_warps": (4, 8)}, (), "fwd") == [(), (("num_warps", 8),)]
    assert override(table, "fwd", (("block_b", 8), ("num_warps", 4))) == (
        ("fwd.block_b", 8), ("fwd.num_warps", 4), ("max_terms", 512), ("num_warps", 4))


def test_with_tuning_appends_and_replaces():
    t1 = with_tuning(SPEC, (("block_b", 32), ("num_warps", 8)))
    assert parse_spec(t1)[0].tuning == (("block_b", 32), ("num_warps", 8))
    t2 = with_tuning(t1, (("block_c", 64), ("bwd_x2.num_warps", 8), ("fwd.block_b", 8)))
    assert parse_spec(t2)[0].tuning == (("block_c", 64), ("bwd_x2.num_warps", 8), ("fwd.block_b", 8))
    assert t2.count("[tensor_product.tuning]") == 1 and "[tensor_product.tuning.fwd]" in t2
    # sub-tables only: no empty top-level section
    t3 = with_tuning(t2, (("fwd.block_b", 8),))
    assert "[tensor_product.tuning]" not in t3 and parse_spec(t3)[0].tuning == (("fwd.block_b", 8),)
    assert parse_spec(with_tuning(t2, ()))[0].tuning == ()
    assert with_tuning(t1, (("block_b", 32), ("num_warps", 8))) == t1
    with pytest.raises(TuneError, match="exactly one \\[\\[tensor_product\\]\\]"):
        with_tuning(t1 + '\n[[tensor_product]]\nname = "b"\n', ())


def test_with_tuning_keeps_the_sections_comments():
    """A reason written in a tuning section (mace_large's ``pallas_fuse_bwd = 0``) survives a
    rewrite of that section's values."""
    text = with_tuning(SPEC, (("pallas_fuse_bwd", 0), ("fwd.block_b", 8)))
    text = text.replace("[tensor_product.tuning]\n", "[tensor_product.tuning]\n# slower here\n")
    text = text.replace("[tensor_product.tuning.fwd]\n", "[tensor_product.tuning.fwd]\n  # measured\n")
    text = text.replace("pallas_fuse_bwd = 0\n", "pallas_fuse_bwd = 0  # see below\n# after the value\n")
    out = with_tuning(text, (("pallas_fuse_bwd", 0), ("fwd.block_b", 2), ("fwd.block_c", 64)))
    assert "[tensor_product.tuning]\n# slower here\npallas_fuse_bwd = 0  # see below\n# after the value\n" in out
    assert "[tensor_product.tuning.fwd]\n  # measured\nblock_b = 2\nblock_c = 64\n" in out
    assert dict(parse_spec(out)[0].tuning) == {"pallas_fuse_bwd": 0, "fwd.block_b": 2, "fwd.block_c": 64}
    # everything but the changed values is kept byte for byte
    assert with_tuning(out, (("pallas_fuse_bwd", 0), ("fwd.block_b", 8))) == text


def test_with_tuning_keeps_an_example_spec_as_written():
    """A real spec's tuning (mace_large: comments between the keys of its sections) round-trips
    unchanged, and changing one value changes that line only."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "examples" / "specs" / "mace_large.toml").read_text()
    table = parse_spec(text)[0].tuning
    assert with_tuning(text, table) == text
    new = dict(table) | {"conv_bwd.block_b": 2}
    out = with_tuning(text, tuple(sorted(new.items())))
    changed = [(a, b) for a, b in zip(text.splitlines(), out.splitlines()) if a != b]
    assert len(out.splitlines()) == len(text.splitlines()) and len(changed) == 1
    assert parse_spec(out)[0].tuning == tuple(sorted(new.items()))



def test_with_tuning_other_toml_forms():
    """An inline ``tuning = {...}`` table is rewritten in its own form; any form the rewrite
    cannot edit is refused with a TuneError, never written wrong (dotted keys: tomlkit cannot
    delete a dotted sub-table)."""
    inline = with_tuning(SPEC + "tuning = { block_b = 8, fwd = { num_warps = 4 } }\n", (("block_b", 16), ("fwd.num_warps", 8)))
    assert inline.endswith("tuning = { block_b = 16, fwd = { num_warps = 8 } }\n")
    assert parse_spec(inline)[0].tuning == (("block_b", 16), ("fwd.num_warps", 8))
    dotted = SPEC + "tuning.block_b = 8\ntuning.fwd.num_warps = 4\n"
    for table in ((("block_b", 16), ("fwd.num_warps", 8)), (("bwd_x1.block_b", 4),), ()):
        try:
            out = with_tuning(dotted, table)
        except TuneError as e:
            assert "[tensor_product.tuning]" in str(e)
        else:
            assert parse_spec(out)[0].tuning == table


def _fake_worker(calls):
    """Times from the job's generated kernels of its op: fewer warps and bigger batch tiles are
    'faster' for fwd, the other way round for bwd_x1; fwd with num_warps=8 and block_b=32
    fails to build."""

    def run(spec_file, package_dir, op, batch, dtype, timeout):
        from eqdsl.codegen.generate import generate_files

        calls.append(op)
        files = generate_files(spec_file, package_dir, triton=False)
        src = files["tune_demo/helion_kernels.py"]
        kernel = src[src.index(f"def tp_{op}_0("):]
        config = src[: src.index(f"def tp_{op}_0(")].rsplit("helion.Config(", 1)[1]
        warps = int(re.search(r"num_warps=(\d+)", config).group(1))
        block_b = int(re.search(r"hl\.tile\(\w+\.size\(0\), block_size=(\d+)\)", kernel).group(1))
        if op == "fwd" and warps == 8 and block_b == 32:
            return {"error": "OutOfResources: shared memory"}
        t = 10.0 * warps + 100.0 / block_b
        return {"us": t if op == "fwd" else 1000.0 - t}

    return run


def test_tune_picks_the_fastest_per_op_and_writes_it_back(tmp_path):
    spec = tmp_path / "tune_demo.toml"
    spec.write_text(SPEC + 'dtypes = ["float32"]\n')  # one dtype: the shared keys (two: test below)
    calls, lines = [], []
    table, results = tune(spec, tmp_path / "gen", batch=64, grid={"num_warps": (4, 8), "block_b": (8, 32)},
                          ops=("fwd", "bwd_x1"), workers=2, write=True, run_worker=_fake_worker(calls),
                          require_cuda=False, report=lines.append)
    assert table == (("bwd_x1.block_b", 8), ("bwd_x1.num_warps", 8), ("fwd.block_b", 32), ("fwd.num_warps", 4))
    assert [len(results[op]) for op in ("fwd", "bwd_x1")] == [5, 5]  # the spec's own, then the 4 combinations
    assert sorted(calls) == ["bwd_x1"] * 5 + ["fwd"] * 5
    assert any("OutOfResources" in line for line in lines) and len(lines) == 10
    assert load_spec(spec)[0].tuning == table
    kernels = (tmp_path / "gen" / "tune_demo" / "helion_kernels.py").read_text()
    fwd, bwd_x1 = kernels[kernels.index("def tp_fwd_0("):], kernels[kernels.index("def tp_bwd_x1_0("):]
    assert "block_size=32)" in fwd.split("def ")[1] and "block_size=8)" in bwd_x1.split("def ")[1]
    text = format_results(results)
    assert "<- best" in text.splitlines()[1] and "failed: OutOfResources" in text


def test_tune_refuses_bad_ops(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    for ops in (("conv_fwd",), ("forward",), ()):
        with pytest.raises(TuneError, match="ops"):
            tune(spec, ops=ops, run_worker=_fake_worker([]), require_cuda=False)


def test_tune_refuses_without_a_gpu_and_multi_table_specs(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    assert cli.main(["tune", str(spec)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    spec.write_text(SPEC + SPEC.replace("tune_demo", "other"))
    with pytest.raises(TuneError, match="2 \\[\\[tensor_product\\]\\] tables"):
        tune(spec, run_worker=_fake_worker([]), require_cuda=False)


def test_current_tuning_stays_within_noise():
    from eqdsl.tune.choose import MIN_GAIN, winner

    cand = (("num_warps", 8),)
    near = 100.0 / (1 + MIN_GAIN / 2)
    assert winner("fwd", [((), {"us": 100.0}), (cand, {"us": near})]) == ()
    assert winner("fwd", [((), {"us": 100.0}), (cand, {"us": 100.0 / (1 + 2 * MIN_GAIN)})]) == cand
    assert winner("fwd", [((), {"error": "OutOfResources"}), (cand, {"us": 120.0})]) == cand
    with pytest.raises(TuneError, match="fwd: no candidate ran"):
        winner("fwd", [((), {"error": "x"})])


def test_fused_ops_are_tuned_where_the_package_has_them(tmp_path):
    """The default ops add the fused backward (``bwd``) for a channelwise product only;
    asking for it (or the conv's ``conv_bwd``) elsewhere is refused."""
    channelwise = tmp_path / "cw.toml"
    channelwise.write_text(
        '[[tensor_product]]\nname = "cw"\nirreps_in1 = "4x0e+4x1o"\nirreps_in2 = "0e+1o"\n'
        'irreps_out = "0e+1o"\nmode = "uvu"\nshared_weights = false\n'
    )
    seen = []

    def worker(spec_file, package_dir, op, batch, dtype, timeout):
        seen.append(op)
        return {"us": 1.0}

    tune(channelwise, grid={"block_b": (8,)}, run_worker=worker, require_cuda=False, report=lambda _: None)
    assert sorted(set(seen)) == ["bwd", "bwd_w", "bwd_x1", "bwd_x2", "fwd"]
    with pytest.raises(TuneError, match="conv_bwd"):
        tune(channelwise, ops=("conv_bwd",), run_worker=worker, require_cuda=False)
    other = tmp_path / "s.toml"
    other.write_text(SPEC.replace("shared_weights = false", "shared_weights = true"))
    seen.clear()
    tune(other, grid={"block_b": (8,)}, run_worker=worker, require_cuda=False, report=lambda _: None)
    assert "bwd" not in seen
    with pytest.raises(TuneError, match="this product has no fused backward"):
        tune(other, ops=("bwd",), run_worker=worker, require_cuda=False)
    # each fused op by its own fuse_bwd: the conv's fused backward off, the plain one on
    conv = tmp_path / "cv.toml"
    conv.write_text(channelwise.read_text().replace('name = "cw"', 'name = "cv"') + "conv = true\n"
                    "\n[tensor_product.tuning.conv_bwd]\nfuse_bwd = 0\n")
    seen.clear()
    tune(conv, ops=("bwd",), grid={"block_b": (8,)}, run_worker=worker, require_cuda=False, report=lambda _: None)
    assert seen and set(seen) == {"bwd"}
    with pytest.raises(TuneError, match="conv_bwd"):
        tune(conv, ops=("conv_bwd",), run_worker=worker, require_cuda=False)
    conv.write_text(conv.read_text().replace("[tensor_product.tuning.conv_bwd]", "[tensor_product.tuning.bwd]"))
    seen.clear()
    tune(conv, ops=("conv_bwd",), grid={"block_b": (8,)}, run_worker=worker, require_cuda=False, report=lambda _: None)
    assert seen and set(seen) == {"conv_bwd"}


def test_pallas_op_tunes_the_top_level_pallas_keys(tmp_path):
    """``pallas``: candidates over the ``pallas_*`` keys only (the Helion keys of the grid
    tune the Helion ops), written to the top-level section; the Helion sub-tables stay."""
    from eqdsl.tune import PALLAS_GRID, PALLAS_UNROLL, op_grid

    grid = {"block_b": (8, 16), "pallas_block_batch": (16, 64)}
    assert op_grid(grid, "pallas") == {"pallas_block_batch": (16, 64)}
    assert op_grid(grid, "fwd") == {"block_b": (8, 16)}
    assert op_grid(None, "pallas") == PALLAS_GRID and op_grid({"block_b": (8,)}, "pallas") == PALLAS_GRID
    # kernels that loop over a channel (uvw): the default grid also tries pallas_unroll; a grid naming pallas keys wins
    assert op_grid(None, "pallas", loops=True) == {**PALLAS_GRID, "pallas_unroll": PALLAS_UNROLL}
    assert op_grid(grid, "pallas", loops=True) == {"pallas_block_batch": (16, 64)}
    assert op_grid(None, "fwd", loops=True) == DEFAULT_GRID
    from eqdsl.backends.pallas.plan import has_channel_loops
    from eqdsl.lower import lower
    from eqdsl.spec import load_spec

    specs = Path(__file__).resolve().parents[1] / "examples" / "specs"
    loops = {n: has_channel_loops(lower(load_spec(specs / f"{n}.toml")[0]))
             for n in ("e3tools_conv", "diffdock_l2", "mace_large", "nequip_toluene")}
    assert loops["e3tools_conv"] and loops["diffdock_l2"] and not loops["mace_large"] and not loops["nequip_toluene"]
    table = (("fwd.block_b", 16), ("pallas_block_batch", 16))
    assert candidates({"pallas_block_batch": (16, 64), "pallas_num_warps": (4,)}, table, "pallas") == [
        (), (("pallas_block_batch", 16), ("pallas_num_warps", 4)), (("pallas_block_batch", 64), ("pallas_num_warps", 4))]
    assert candidates({"pallas_block_batch": (16, 64)}, table, "pallas") == [(), (("pallas_block_batch", 64),)]

    # one dtype: the shared key; both dtypes: the tuned dtype's own key, the other dtype's blocks untouched
    for dtypes, dtype, key, const in [
        ('["float32"]', "float32", "pallas_block_batch", "\nBLOCK_BATCH = 64\n"),
        ('["float32", "float64"]', "float64", "pallas_block_batch_float64", '\nBLOCK_BATCH_BY_DTYPE = {"float64": 64}\n'),
    ]:
        spec = tmp_path / dtype / "tune_demo.toml"
        spec.parent.mkdir()
        spec.write_text(SPEC + f"dtypes = {dtypes}\n")
        times = {16: 50.0, 64: 20.0, 128: 30.0}

        def worker(spec_file, package_dir, op, batch, dtype, timeout, key=key):
            if op != "pallas":
                return {"us": 10.0}
            return {"us": times[dict(load_spec(spec_file)[0].tuning).get(key, 16)]}

        table, results = tune(spec, grid={"block_b": (8,), "pallas_block_batch": (16, 64, 128)}, ops=("fwd", "pallas"),
                              dtype=dtype, workers=2, write=True, out_dir=tmp_path / dtype / "gen", run_worker=worker,
                              require_cuda=False, report=lambda _: None)
        assert [c for c, _ in results["pallas"]] == [(), *(((key, b),) for b in (16, 64, 128))]
        assert dict(table)[key] == 64 and f"fwd.{key}" not in dict(table)
        assert "pallas_block_batch" not in dict(table) or key == "pallas_block_batch"
        text = spec.read_text()
        top = text[text.index("[tensor_product.tuning]"):]
        assert top.split("\n[", 1)[0].count(f"{key} = 64") == 1
        assert load_spec(spec)[0].tuning == table
        pallas = (tmp_path / dtype / "gen" / "tune_demo" / "pallas_kernels.py").read_text()
        assert const in pallas
    assert for_dtype({"pallas_num_warps": (4,), "block_b": (8,)}, "pallas", "float64", ("float32", "float64")) == {
        "pallas_num_warps_float64": (4,), "block_b": (8,)}
    assert for_dtype({"pallas_block_batch": (8,)}, "fwd", "float64", ("float32", "float64")) == {"pallas_block_batch": (8,)}
    # one dtype: the shared key, unless the spec already sets the dtype's own (it would win over every candidate)
    assert for_dtype({"pallas_block_batch": (8,)}, "pallas", "float32", ("float32",)) == {"pallas_block_batch": (8,)}
    assert for_dtype({"pallas_block_batch": (8,)}, "pallas", "float32", ("float32",),
                     (("pallas_block_batch_float32", 2),)) == {"pallas_block_batch_float32": (8,)}


def test_pallas_measure_runs_the_jitted_forward_and_backward(tmp_path):
    """The ``pallas`` worker's timing path, on the CPU (Pallas interpret mode, tiny batch):
    generates the candidate's package, jits forward + VJP, returns a positive median."""
    pytest.importorskip("jax")
    from eqdsl.tune import measure

    spec = tmp_path / "tune_pallas_cpu.toml"
    spec.write_text(SPEC.replace("tune_demo", "tune_pallas_cpu"))
    us = measure(str(spec), str(tmp_path / "pkg"), "pallas", 4, "float32", str(tmp_path / "lock"))
    assert us > 0


def test_helion_ops_tune_a_dtype_apart_where_the_spec_has_several(tmp_path):
    """A float64 tune of a two-dtype spec writes ``block_b_float64`` / ``num_warps_float64``
    into the op's sub-table (the float32 kernels keep their blocks); keys without a
    per-dtype form stay shared, and one-dtype specs tune the shared keys."""
    both = ("float32", "float64")
    assert for_dtype({"block_b": (2, 4), "num_warps": (2,), "block_c": (32,)}, "bwd", "float64", both) == {
        "block_b_float64": (2, 4), "num_warps_float64": (2,), "block_c": (32,)}
    assert for_dtype({"block_b": (2,)}, "bwd", "float32", ("float32",)) == {"block_b": (2,)}
    assert for_dtype({"block_b": (2,)}, "bwd", "float32", ("float32",), (("bwd.block_b_float32", 8),)) == {
        "block_b_float32": (2,)}
    # candidates that differ in one dtype's blocks only are distinct
    assert candidates({"block_b_float64": (8, 16)}, (), "fwd") == [(), (("block_b_float64", 8),)]
    spec = tmp_path / "tune_demo.toml"
    spec.write_text(SPEC + 'dtypes = ["float32", "float64"]\n')

    def worker(spec_file, package_dir, op, batch, dtype, timeout):
        kernels = {k: v for k, v in load_spec(spec_file)[0].tuning}
        return {"us": {2: 5.0, 4: 7.0}.get(kernels.get("fwd.block_b_float64"), 9.0)}

    table, _ = tune(spec, grid={"block_b": (2, 4)}, ops=("fwd",), dtype="float64", workers=2, write=True,
                    run_worker=worker, require_cuda=False, report=lambda _: None)
    assert table == (("fwd.block_b_float64", 2),)
    assert load_spec(spec)[0].tuning == table and "block_b_float64 = 2" in spec.read_text()


def test_pallas_conv_op_tunes_the_conv_keys_per_dtype(tmp_path):
    """``pallas_conv`` (conv specs): candidates over the keys that shape only the JAX conv's
    kernels, edges per segment step jointly with CG terms per conv kernel; the ``pallas`` op
    keeps the other ``pallas_*`` keys. Candidates whose generated Pallas source is the same
    (a term budget that splits nothing further) are timed once; a float64 tune of a
    two-dtype spec writes the float64 keys only."""
    from eqdsl.backends.pallas.assemble import render_files
    from eqdsl.lower import lower
    from eqdsl.tune import PALLAS_CONV_GRID, PALLAS_GRID, op_grid

    grid = {"pallas_block_batch": (4,), "pallas_segment_edges_float64": (2, 4), "pallas_conv_max_terms": (8,),
            "block_b": (8,)}
    assert op_grid(grid, "pallas") == {"pallas_block_batch": (4,)}
    assert op_grid(grid, "pallas_conv") == {"pallas_segment_edges_float64": (2, 4), "pallas_conv_max_terms": (8,)}
    assert op_grid(grid, "fwd") == {"block_b": (8,)}
    assert op_grid(None, "pallas_conv") == PALLAS_CONV_GRID and op_grid({"pallas_block_batch": (4,)}, "pallas_conv") == \
        PALLAS_CONV_GRID and op_grid({"pallas_segment_edges": (4,)}, "pallas") == PALLAS_GRID
    spec = tmp_path / "tune_conv.toml"
    spec.write_text(SPEC.replace("tune_demo", "tune_conv") + 'dtypes = ["float32", "float64"]\nconv = true\n')
    sp = load_spec(spec)[0]
    ir = lower(sp)
    g = for_dtype({"pallas_segment_edges": (1, 4), "pallas_conv_max_terms": (4, 8, 600, 1200)}, "pallas_conv",
                  "float64", sp.dtypes, sp.tuning)
    assert g == {"pallas_segment_edges_float64": (1, 4), "pallas_conv_max_terms_float64": (4, 8, 600, 1200)}
    assert for_dtype({"pallas_conv_fused_max_terms": (1, 8)}, "pallas_conv", "float64", sp.dtypes, sp.tuning) == \
        {"pallas_conv_fused_max_terms_float64": (1, 8)}
    cands = candidates(g, sp.tuning, "pallas_conv", ir)
    sources = [tuple(sorted(render_files(ir, "", tuning=override(sp.tuning, "pallas_conv", c)).items())) for c in cands]
    assert len(set(sources)) == len(sources)  # each candidate other kernels ...
    every = [override(sp.tuning, "pallas_conv", tuple(zip(sorted(g), v))) for v in itertools.product(*(g[k] for k in sorted(g)))]
    assert {tuple(sorted(render_files(ir, "", tuning=t).items())) for t in every} <= set(sources)  # ... and none lost
    assert len(cands) < 1 + len(every)  # 600 and 1200 terms split this small product alike

    def worker(spec_file, package_dir, op, batch, dtype, timeout):
        t = dict(load_spec(spec_file)[0].tuning)
        assert op == "pallas_conv" and dtype == "float64" and not any(k.endswith("float32") for k in t)
        return {"us": 100.0 / t.get("pallas_segment_edges_float64", 1) + t.get("pallas_conv_max_terms_float64", 0) / 100}

    table, results = tune(spec, grid={"pallas_segment_edges": (1, 4), "pallas_conv_max_terms": (4, 1200)},
                          ops=("pallas_conv",), dtype="float64", workers=2, write=True, out_dir=tmp_path / "gen",
                          run_worker=worker, require_cuda=False, report=lambda _: None)
    assert dict(table) == {"pallas_segment_edges_float64": 4, "pallas_conv_max_terms_float64": 4}
    assert load_spec(spec)[0].tuning == table
    pallas = (tmp_path / "gen" / "tune_conv" / "pallas_kernels.py").read_text()
    assert 'SEGMENT_EDGES_BY_DTYPE = {"float64": 4}' in pallas and "CONV_FLOAT64_FWD_KERNELS" in pallas
    with pytest.raises(TuneError, match="conv ops need conv = true"):
        tune(_plain(tmp_path), ops=("pallas_conv",), run_worker=worker, require_cuda=False)


def _plain(tmp_path):
    p = tmp_path / "plain.toml"
    p.write_text(SPEC)
    return p


def test_pallas_conv_measure_runs_the_jitted_conv(tmp_path):
    """The ``pallas_conv`` worker's timing path on the CPU (Pallas interpret mode, a graph of
    128 edges on 2 nodes): generates the candidate's package, jits the conv's forward + VJP,
    returns a positive median."""
    pytest.importorskip("jax")
    from eqdsl.tune import measure

    spec = tmp_path / "tune_conv_cpu.toml"
    spec.write_text(SPEC.replace("tune_demo", "tune_conv_cpu") + "conv = true\n")
    assert measure(str(spec), str(tmp_path / "pkg"), "pallas_conv", 128, "float32", str(tmp_path / "lock")) > 0
