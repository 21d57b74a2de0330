"""eqdsl.load: cache layout and keys, the accepted spec forms, refusals, several processes at
once, and a JAX-only process that never imports torch. spec_to_toml round trips. Nothing here
runs a kernel (test_torch_modules does)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import eqdsl
from eqdsl import SpecError, load_spec, parse_spec
from eqdsl.loader import cache_root, generator_fingerprint, load, spec_to_toml

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
# a comment: not part of the cache key
[[tensor_product]]
name = "load_{tag}"
irreps_in1 = "2x0e+2x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
dtypes = ["float64"]
"""

TWO = """
[[tensor_product]]
name = "load_two_a"
irreps_in1 = "2x0e"
irreps_in2 = "0e"
irreps_out = "2x0e"
mode = "uvw"

[[tensor_product]]
name = "load_two_b"
irreps_in1 = "2x1o"
irreps_in2 = "1o"
irreps_out = "0e"
mode = "uvu"
"""


def _packages(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "packages").iterdir() if not p.name.startswith("."))


def test_load_text_path_and_spec_objects_share_one_package(tmp_path):
    cache = tmp_path / "cache"
    text = SPEC.format(tag="a")
    pkg = load(text, cache_dir=cache)
    assert (pkg.IRREPS_IN1, pkg.IRREPS_OUT, pkg.WEIGHT_NUMEL, pkg.SHARED_WEIGHTS) == (
        "2x0e+2x1o", "2x0e+2x1o+2x1o+2x0e", 8, False)
    assert pkg.DTYPES == ("float64",)
    # the same spec as a file written differently, and as a parsed object: the same module
    path = tmp_path / "spec.toml"
    path.write_text(text.replace("# a comment: not part of the cache key\n", "") + "\n\n")
    assert load(path, cache_dir=cache) is pkg
    assert load(str(path), cache_dir=cache) is pkg
    assert load(parse_spec(text)[0], cache_dir=cache) is pkg
    # layout: packages/<key>/{spec.toml, __init__.py, <name>/...}, the spec canonical
    (entry,) = _packages(cache)
    assert sorted(p.name for p in entry.iterdir()) == ["__init__.py", "load_a", "spec.toml"]
    assert pkg.SPEC_FILE == str(entry / "spec.toml")
    assert (entry / "spec.toml").read_text() == spec_to_toml(parse_spec(text))
    assert parse_spec((entry / "spec.toml").read_text()) == parse_spec(text)
    assert Path(pkg.__file__) == entry / "load_a" / "__init__.py"
    assert {"helion_kernels.py", "torch_ops.py", "jax_ops.py", "pallas_kernels.py"} <= {
        p.name for p in (entry / "load_a").iterdir()}
    assert not [p for p in (cache / "packages").iterdir() if p.name.endswith(".tmp")]


def test_key_follows_the_generator_fingerprint(tmp_path, monkeypatch):
    text = SPEC.format(tag="fp")
    load(text, cache_dir=tmp_path)
    assert len(_packages(tmp_path)) == 1
    assert len(generator_fingerprint()) == 64
    # another generator (another version or edited templates) must not reuse the package
    import eqdsl.loader as loader

    monkeypatch.setattr(loader, "generator_fingerprint", lambda: "0" * 64)
    monkeypatch.setattr(loader, "_loaded", {})
    load(text, cache_dir=tmp_path)
    assert len(_packages(tmp_path)) == 2


def test_several_tables_need_a_name(tmp_path):
    with pytest.raises(ValueError, match=r"2 tensor products \(load_two_a, load_two_b\); pass name="):
        load(TWO, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no tensor product named 'nope'"):
        load(TWO, name="nope", cache_dir=tmp_path)
    b = load(TWO, name="load_two_b", cache_dir=tmp_path)
    a = load(TWO, name="load_two_a", cache_dir=tmp_path)
    assert (a.IRREPS_OUT, b.IRREPS_OUT) == ("2x0e", "2x0e")
    assert Path(a.__file__).parents[1] == Path(b.__file__).parents[1]  # one cache entry for the file


def test_refusals(tmp_path):
    load(SPEC.format(tag="clash"), cache_dir=tmp_path)
    other = SPEC.format(tag="clash").replace('dtypes = ["float64"]', 'dtypes = ["float32"]')
    with pytest.raises(ValueError, match="another spec named 'load_clash' is already loaded .* eqdsl_load_clash::"):
        load(other, cache_dir=tmp_path)
    with pytest.raises(SpecError, match="cannot read file"):
        load(tmp_path / "missing.toml", cache_dir=tmp_path)
    with pytest.raises(SpecError, match="irreps_in1"):
        load(SPEC.format(tag="bad").replace('"2x0e+2x1o"', '"2x0q"'), cache_dir=tmp_path)
    with pytest.raises(TypeError, match="expected spec TOML text"):
        load(42, cache_dir=tmp_path)


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EQDSL_CACHE_DIR", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("EQDSL_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "eqdsl"
    monkeypatch.setenv("EQDSL_CACHE_DIR", "")  # off: a directory of this process
    private = cache_root()
    assert private.is_dir() and private != Path.home() / ".cache" / "eqdsl" and cache_root() == private


def test_spec_to_toml_round_trips_every_example():
    for path in [p for p in sorted((ROOT / "examples" / "specs").glob("*.toml")) if load_spec(p)]:  # tensor products
        specs = load_spec(path)
        text = spec_to_toml(specs)
        assert parse_spec(text) == specs, path.name
        assert spec_to_toml(parse_spec(text)) == text  # deterministic


_RACE = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from eqdsl.loader import load
    while time.time() < {start}:
        time.sleep(0.005)
    pkg = load({text!r}, cache_dir={cache!r})
    print(pkg.WEIGHT_NUMEL, pkg.__file__, "torch" in sys.modules)
""")


def test_processes_at_once_generate_one_package(tmp_path):
    """Four processes load one new spec into one cache at the same moment: one entry, all import it."""
    import time

    text = SPEC.format(tag="race")
    script = _RACE.format(root=str(ROOT), start=time.time() + 4.0, text=text, cache=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    lines = {out.strip() for out, _ in outs}
    (entry,) = _packages(tmp_path)
    assert lines == {f"8 {entry / 'load_race' / '__init__.py'} False"}
    assert not [p for p in (tmp_path / "packages").iterdir() if p.name.endswith(".tmp")]


def test_jax_only_process_never_imports_torch(tmp_path):
    pytest.importorskip("jax")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import eqdsl
        pkg = eqdsl.load({SPEC.format(tag="jaxonly")!r}, cache_dir={str(tmp_path)!r})
        ops = pkg.jax_ops
        assert callable(ops.tensor_product)
        assert "torch" not in sys.modules, "torch imported"
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_package_exports():
    assert eqdsl.load is load and eqdsl.spec_to_toml is spec_to_toml
    from eqdsl.from_e3nn import spec_from_e3nn, spec_from_e3nn_jax

    assert eqdsl.spec_from_e3nn is spec_from_e3nn and eqdsl.spec_from_e3nn_jax is spec_from_e3nn_jax
    with pytest.raises(AttributeError):
        eqdsl.no_such_name  # noqa: B018


def test_a_lost_rename_race_takes_the_winners_package(tmp_path, monkeypatch):
    """Without a lock (or with one the file system ignores) another process may rename its
    package into place first: this one's rename fails, and it takes the winner's."""
    import shutil
    from contextlib import nullcontext

    import eqdsl.codegen.generate as gen
    import eqdsl.loader as loader

    real_write = gen.write_package
    winner = {}

    def write_then_lose(out_dir, files):
        written = real_write(out_dir, files)
        final = Path(out_dir).parent / Path(out_dir).name.split(".")[1]
        shutil.copytree(out_dir, final)  # the other process's complete package
        winner["dir"] = final
        return written

    monkeypatch.setattr(gen, "write_package", write_then_lose)
    monkeypatch.setattr(loader, "FileLock", lambda path: nullcontext())
    pkg = load(SPEC.format(tag="lost"), cache_dir=tmp_path)
    assert Path(pkg.__file__).parents[1] == winner["dir"]
    assert [p.name for p in (tmp_path / "packages").iterdir()] == [winner["dir"].name]  # our temp dir is gone
