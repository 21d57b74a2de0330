"""``eqdsl tune``: the candidate grid, the spec rewrite and the selection, with a stand-in for
the GPU worker that reads each candidate's generated kernels (the GPU timing itself runs on
the device machine only)."""

import re

import pytest

from eqdsl import cli
from eqdsl.spec import load_spec, parse_spec
from eqdsl.tune import DEFAULT_GRID, TuneError, candidates, format_results, parse_grid, tune, with_tuning

SPEC = """[[tensor_product]]
name = "tune_demo"
irreps_in1 = "4x0e+4x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
"""


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
    cands = candidates(DEFAULT_GRID, (("max_terms", 512), ("num_warps", 4)))
    assert cands[0] == (("max_terms", 512), ("num_warps", 4))
    # block_b=16, block_c=32, num_warps=4 are the defaults: that combination is the spec's own
    assert len(cands) == 2 * 3 * 2 and len(set(cands)) == len(cands)
    assert (("block_b", 16), ("block_c", 32), ("max_terms", 512), ("num_warps", 4)) not in cands
    assert all(dict(c)["max_terms"] == 512 for c in cands)
    assert candidates({"num_warps": (4, 8)}, ()) == [(), (("num_warps", 8),)]


def test_with_tuning_appends_and_replaces():
    t1 = with_tuning(SPEC, (("block_b", 32), ("num_warps", 8)))
    assert parse_spec(t1)[0].tuning == (("block_b", 32), ("num_warps", 8))
    t2 = with_tuning(t1, (("block_c", 64),))
    assert parse_spec(t2)[0].tuning == (("block_c", 64),) and t2.count("[tensor_product.tuning]") == 1
    assert parse_spec(with_tuning(t2, ()))[0].tuning == ()
    assert with_tuning(t1, (("block_b", 32), ("num_warps", 8))) == t1
    with pytest.raises(TuneError, match="last section"):
        with_tuning(t1 + '\n[[tensor_product]]\nname = "b"\n', ())


def _fake_worker(calls):
    """Times from the candidate's generated kernels: fewer warps and bigger batch tiles are
    'faster'; num_warps=8 with block_b=32 fails to build."""

    def run(package_dir, name, batch, dtype, compile_only, timeout):
        calls.append((compile_only, package_dir))
        src = open(f"{package_dir}/{name}/helion_kernels.py").read()
        warps = int(re.search(r"num_warps=(\d+)", src).group(1))
        block_b = int(re.search(r"hl\.tile\(\w+\.size\(0\), block_size=(\d+)\)", src).group(1))
        if warps == 8 and block_b == 32:
            return {"error": "OutOfResources: shared memory"}
        if compile_only:
            return {}
        t = 10.0 * warps + 100.0 / block_b
        return {"fwd": t, "bwd_x1": t, "bwd_x2": t, "bwd_w": t}

    return run


def test_tune_picks_the_fastest_and_writes_it_back(tmp_path):
    spec = tmp_path / "tune_demo.toml"
    spec.write_text(SPEC)
    calls, lines = [], []
    best, results = tune(spec, tmp_path / "gen", batch=64, grid={"num_warps": (4, 8), "block_b": (8, 32)},
                         workers=2, write=True, run_worker=_fake_worker(calls), require_cuda=False,
                         report=lines.append)
    assert best == (("block_b", 32), ("num_warps", 4))
    assert len(results) == 5  # the spec's own (empty) table, then the 4 combinations
    assert sum(1 for c, _ in calls if c) == 5 and sum(1 for c, _ in calls if not c) == 4  # failed one not timed
    assert any("OutOfResources" in line for line in lines) and len(lines) == 10
    assert load_spec(spec)[0].tuning == best
    kernels = (tmp_path / "gen" / "tune_demo" / "helion_kernels.py").read_text()
    assert "num_warps=4" in kernels and "block_size=32)" in kernels
    table = format_results(best, results)
    assert "<- best" in table.splitlines()[1] and "failed: OutOfResources" in table


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
