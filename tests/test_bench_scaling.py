"""``benchmarks/bench_scaling.py``'s host-side pieces, without running a kernel: the bulk Si
graphs every device trains on, the JAX padding to common sizes, the gradient check's
comparison and the JSON/table merge of the two frameworks' runs. (The whole script runs
end to end on the CPU with ``--quick``, about 2.5 minutes here: too long for CI;
``bash benchmarks/run_multi_gpu.sh --dry-run`` runs it.)"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("ase")
from benchmarks import bench_scaling as bs  # noqa: E402


def test_supercell_factorizations():
    assert bs.supercell(2048) == (8, 8, 4)
    assert bs.supercell(4096) == (8, 8, 8)
    assert bs.supercell(8) == (1, 1, 1)
    for atoms in (8, 16, 48, 1000 * 8, 2048):
        a, b, c = bs.supercell(atoms)
        assert 8 * a * b * c == atoms and a >= b >= c >= 1


def test_default_graph_is_bulk_si_with_28_neighbours():
    """2,048 atoms at 5 Å: the 4 + 12 + 12 neighbours of diamond Si (2.35, 3.84, 4.50 Å;
    the next shell is at 5.43 Å), periodic images included, every edge present both ways."""
    g = bs.si_graph(2048, 5.0, seed=3)
    n, e = len(g["pos"]), len(g["src"])
    assert n == 2048 and e == 2048 * 28 == 57344
    assert np.all(np.bincount(g["dst"], minlength=n) == 28)
    assert np.all(np.diff(g["dst"]) >= 0)  # sorted by dst
    vec = g["pos"][g["dst"]] - g["pos"][g["src"]] + g["shift"]
    r = np.linalg.norm(vec, axis=1)
    assert r.max() < 5.0 and r.min() > 2.0
    # the shells, within the 0.05 Å rattle
    counts = [np.sum(np.abs(r - d) < 0.3) for d in (2.351, 3.840, 4.502)]
    assert counts == [4 * n, 12 * n, 12 * n]
    # j -> i with the opposite vector for every i -> j
    fwd = {(s, d, *np.round(v, 6)) for s, d, v in zip(g["src"], g["dst"], vec)}
    assert all((d, s, *np.round(-v, 6)) in fwd for s, d, v in zip(g["src"][:500], g["dst"][:500], vec[:500]))
    # another seed: another rattle and other labels, the same sizes
    h = bs.si_graph(2048, 5.0, seed=4)
    assert len(h["src"]) == e and not np.allclose(h["pos"], g["pos"]) and not np.allclose(h["forces"], g["forces"])


def test_pad_graphs_common_sizes_and_masks():
    jax_ops = pytest.importorskip("generated.nequip_water.jax_ops")
    graphs = [bs.si_graph(8, 3.0, 0), bs.si_graph(16, 3.0, 1)]
    batch, n_pad = bs.pad_graphs(jax_ops, graphs)
    assert n_pad == 32  # 16 atoms + 1 dummy, rounded up to 16
    assert batch["src"].shape == (2, 64)  # 64 edges (16 atoms x 4), already a multiple of 64
    for k, g in enumerate(graphs):
        n, e = len(g["pos"]), len(g["src"])
        assert batch["node_mask"][k].sum() == n and batch["node_mask"][k][:n].all()
        assert batch["edge_mask"][k].sum() == e and batch["edge_mask"][k][:e].all()
        np.testing.assert_array_equal(batch["src"][k][:e], g["src"])
        np.testing.assert_array_equal(batch["dst"][k][:e], g["dst"])
        assert np.all(batch["src"][k][e:] == n_pad - 1) and np.all(batch["dst"][k][e:] == n_pad - 1)
        np.testing.assert_allclose(batch["pos"][k][:n], g["pos"], rtol=1e-6)
        assert batch["pos"].dtype == np.float32 and batch["src"].dtype == np.int32


def test_compare_finds_the_worst_parameter():
    want = {"a": np.ones(4), "b": np.array([1e-3, 2e-3])}
    assert bs._compare(dict(want), want, 1e-4, 2)["ok"]
    got = {"a": np.ones(4), "b": np.array([1e-3, 2e-3 * (1 + 1e-3)])}
    res = bs._compare(got, want, 1e-4, 2)
    assert not res["ok"] and res["parameter"] == "b" and res["max_rel"] == pytest.approx(1e-3, rel=1e-6)
    assert not bs._compare({"a": np.full(4, np.nan), "b": want["b"]}, want, 1e-4, 2)["ok"]


def _entry(step_ms: dict, interpreted: bool) -> dict:
    e = {"device": "dev", "interpreted": interpreted, "versions": {},
         "check": {"max_rel": 1e-7, "ok": True, "parameter": "w", "tol": 1e-4, "what": "x"},
         "runs": {k: {"devices": int(k), "step_ms": v, "step_ms_all": [v], "edges_per_device": 1000, "graph": "g"}
                  for k, v in step_ms.items()}}
    bs._finish_entry(e)
    return e


def test_json_merge_and_table(tmp_path):
    args = argparse.Namespace(quick=False, package_name="mace_large", atoms=2048, cutoff=5.0, reps=50, warmup=2,
                              lr=1e-5, seed=0)
    path = tmp_path / "bench_scaling.json"
    torch_e = _entry({"1": 10.0, "2": 10.4}, interpreted=False)
    assert torch_e["runs"]["2"]["speedup"] == pytest.approx(2 * 10.0 / 10.4)
    assert torch_e["runs"]["2"]["edges_per_s"] == pytest.approx(2 * 1000 / 10.4e-3)
    bs.write_json(path, "torch", torch_e, args)
    doc = bs.write_json(path, "jax", _entry({"1": 10.0, "2": 11.0}, interpreted=False), args)
    assert set(doc["frameworks"]) == {"torch", "jax"}
    text = bs.table(doc)
    assert "torch: 1.92x on 2 devices: target >= 1.9x met" in text
    assert "jax: 1.82x on 2 devices: target >= 1.9x MISSED" in text
    # an interpreted (CPU --quick) run replaces its framework's entry and is judged against nothing
    doc = bs.write_json(path, "jax", _entry({"1": 5.0, "2": 5.0}, interpreted=True), args)
    text = bs.table(doc)
    assert "jax: 2.00x" not in text and "INTERPRETED" in text and "torch: 1.92x" in text
