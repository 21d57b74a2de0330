"""``eqdsl build`` and ``eqdsl.runtime.cubins``: cubins compiled on a CPU, installed into Triton's cache.

One tiny package (float64, sm_90) is built once. That a GPU's ``JITFunction.run`` then loads
the cubins without compiling is checked on the GPU by ``benchmarks/tools/check_cubins.py``;
here the same script's CPU mode checks that Triton finds every installed entry under the
key it computes itself for a (stand-in) sm_90 device.
"""

import ast
import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import triton

from eqdsl import build
from eqdsl.cli import main
from eqdsl.runtime import cubins
from genutil import build_package

ROOT = Path(__file__).resolve().parents[1]

# one channelwise (uvu) path, so the package has the fused backward kernel too: 5 kernels
# (the smallest package: lowering and compiling cost seconds per kernel here)
SPEC = """
[[tensor_product]]
name = "bt_build"
irreps_in1 = "2x0e"
irreps_in2 = "1x0e"
irreps_out = "2x0e"
instructions = [[0, 0, 0, "uvu", true]]
shared_weights = false
dtypes = ["float64"]
"""


@pytest.fixture(scope="module")
def pkg_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    pkg = build_package(root, "bt_build", SPEC, triton=True)
    d = Path(pkg.__file__).parent
    result = build.build_package(d, ["sm_90"], jobs=1)
    assert result.archs == ("sm_90",) and result.kernels == 5
    return d


def _manifest(d: Path) -> dict:
    return json.loads((d / "cubins" / "manifest.json").read_text())


def _kernel_modules(d: Path) -> set[str]:
    """The package's Triton modules, from its index (contract A), not from the build."""
    ns: dict = {}
    exec((d / "triton_kernels" / "__init__.py").read_text(), ns)
    return {f"triton_kernels/{m}.py" for (_, dtype), m in ns["KERNELS"].items() if dtype == "float64"}


def test_every_kernel_module_has_its_cubins(pkg_dir):
    groups = _manifest(pkg_dir)["groups"]["sm_90"]
    modules = [e["module"] for e in groups.values()]
    assert set(modules) == _kernel_modules(pkg_dir) and len(set(modules)) == 5
    # rows 37 and 64: the batch-size argument is, and is not, divisible by 16
    assert all(modules.count(m) == 2 for m in set(modules))
    for key, entry in groups.items():
        jitted = [f.name for f in ast.parse((pkg_dir / entry["module"]).read_text()).body if isinstance(f, ast.FunctionDef)
                  and any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)]
        assert jitted == [entry["function"]]  # the module's one @triton.jit function
        assert set(entry["options"]) >= {"num_warps", "num_stages"}
        assert set(entry["specialization"]) == {"signature", "constant_keys", "constant_vals", "attrs_keys",
                                                "attrs_vals"}
        d = pkg_dir / "cubins" / "sm_90" / key
        stem = entry["metadata"].removesuffix(".json")
        assert (d / f"{stem}.cubin").read_bytes()[:4] == b"\x7fELF"
        meta = json.loads((d / entry["metadata"]).read_text())
        assert meta["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
        assert meta["triton_version"] == triton.__version__
        names = json.loads((d / f"__grp__{entry['metadata']}").read_text())["child_paths"]
        assert names == {n: n for n in names}  # no build-machine path
        assert set(names) == {p.name for p in d.iterdir()} - {f"__grp__{entry['metadata']}"}
        assert sorted(names) == sorted([f"{stem}.cubin", entry["metadata"]])  # binary only without --keep-ir
    assert sorted(p.name for p in (pkg_dir / "cubins" / "sm_90").iterdir()) == sorted(groups)


def test_manifest(pkg_dir, tmp_path):
    m = _manifest(pkg_dir)
    assert (m["format"], m["triton"], m["archs"], m["dtypes"]) == (1, triton.__version__, ["sm_90"], ["float64"])
    files = sorted((pkg_dir / "triton_kernels").glob("*.py"))
    assert m["modules"] == {f"triton_kernels/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    assert m["toolchain"] == {"sm_90": cubins.toolchain_fingerprint(90)}
    # each entry's directory is Triton's cache directory of its hash
    from triton.runtime.cache import get_cache_manager

    with triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(tmp_path)
        for key, entry in m["groups"]["sm_90"].items():
            assert Path(get_cache_manager(entry["hash"]).cache_dir).name == key


def test_build_again_same_keys_and_binaries(pkg_dir, capsys):
    before = _manifest(pkg_dir)
    cubin = {k: (pkg_dir / "cubins" / "sm_90" / k / e["metadata"].replace(".json", ".cubin")).read_bytes()
             for k, e in before["groups"]["sm_90"].items()}
    assert main(["build", str(pkg_dir), "--arch", "sm_90", "--jobs", "1"]) == 0
    assert capsys.readouterr().out.startswith("bt_build: 5 kernels, 10 variants (sm_90), ")
    after = _manifest(pkg_dir)
    assert after == before
    for k, e in after["groups"]["sm_90"].items():
        assert (pkg_dir / "cubins" / "sm_90" / k / e["metadata"].replace(".json", ".cubin")).read_bytes() == cubin[k]
    assert not [p for p in pkg_dir.iterdir() if p.name.startswith(".cubins")]  # no temporary left


def _clean_env() -> dict:
    """Triton's compiler, not its interpreter (conftest sets TRITON_INTERPRET=1 for this process)."""
    return {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EQDSL_KERNELS")}


INSTALL_CHECK = """
import os, sys, warnings
from pathlib import Path
import triton
from triton.runtime.cache import get_cache_manager
from eqdsl.runtime import cubins

warnings.simplefilter("error", cubins.CubinNotice)
pkg, cache, groups = Path(sys.argv[1]), Path(sys.argv[2]), eval(sys.argv[3])
triton.knobs.cache.dir = str(cache)
assert cubins.install(pkg, 90, eager=True)
stamps = {}
for key, (h, metadata) in groups.items():
    found = get_cache_manager(h).get_group(metadata)
    src = pkg / "cubins" / "sm_90" / key
    assert set(found) == {p.name for p in src.iterdir()} - {"__grp__" + metadata}, found
    for name, path in found.items():
        assert Path(path).parent == cache / key, path  # same Triton here: the build's key
        assert Path(path).read_bytes() == (src / name).read_bytes()
        stamps[path] = os.stat(path).st_mtime_ns
assert cubins.install(pkg, 90, eager=True)  # idempotent: nothing rewritten
assert {p: os.stat(p).st_mtime_ns for p in stamps} == stamps
assert sorted(p.name for p in cache.iterdir()) == sorted(groups)
print("install ok")
"""


def test_install_copies_into_triton_cache_once(pkg_dir, tmp_path):
    entries = _manifest(pkg_dir)["groups"]["sm_90"]
    groups = {k: (e["hash"], e["metadata"]) for k, e in entries.items()}
    r = subprocess.run([sys.executable, "-c", INSTALL_CHECK, str(pkg_dir), str(tmp_path / "triton"), repr(groups)],
                       capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "install ok", r.stdout + r.stderr


ANOTHER_WHEEL = """
import runpy, sys
import triton
import triton.runtime.cache as cache

key = cache.triton_key()
cache.triton_key = lambda: key + "-another-wheel"  # what another Python version's triton wheel changes
calls = []  # a jit_cache_hook set before eqdsl's: still called, before each compilation
triton.knobs.runtime.jit_cache_hook = lambda **kw: calls.append(kw["fn"].name) and None
sys.argv = ["check_cubins.py"] + sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    print("previous hook calls:", len(calls))
    raise
"""


def test_installed_cubins_are_found_by_triton(pkg_dir, tmp_path):
    """CPU mode of the GPU check: Triton, told a sm_90 device is active, finds every variant the
    package's ops launch in a fresh cache, each installed (lazily, by Triton's jit_cache_hook)
    right before Triton would have compiled it: no compilation. Under another ``triton_key``
    (Triton's hash of its own install, which differs between the wheels of one release for two
    Python versions), so the keys differ from the build's and install must compute them."""
    script = ROOT / "benchmarks" / "tools" / "check_cubins.py"
    r = subprocess.run([sys.executable, "-c", ANOTHER_WHEEL.replace("sys.argv[0]", repr(str(script))), str(pkg_dir),
                        "--stand-in", "sm_90", "--cache-dir", str(tmp_path / "triton")],
                       capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bt_build on stand-in sm_90: 10 variants loaded, 0 compiled" in r.stdout
    assert "previous hook calls: 10" in r.stdout
    groups = _manifest(pkg_dir)["groups"]["sm_90"]
    kernels = {p.parent.name for p in (tmp_path / "triton").glob("*/__grp__*")}
    assert len(kernels) == len(groups) and not kernels & set(groups)  # the keys of this "install"


def _fake_package(root: Path, name: str, pkg_dir: Path, manifest: dict | str | None) -> Path:
    """A package directory with ``pkg_dir``'s Triton modules and the given manifest (text as is)."""
    d = root / name
    (d / "triton_kernels").mkdir(parents=True)
    for p in (pkg_dir / "triton_kernels").glob("*.py"):
        (d / "triton_kernels" / p.name).write_bytes(p.read_bytes())
    if manifest is not None:
        (d / "cubins").mkdir()
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (d / "cubins" / "manifest.json").write_text(text)
    return d


def test_mismatch_warns_once_and_returns_false(pkg_dir, tmp_path):
    m = _manifest(pkg_dir)
    stale = json.loads(json.dumps(m))
    stale["modules"]["triton_kernels/tp_fwd_0_float64.py"] = "0" * 64
    other_triton = dict(m, triton="3.5.0")
    cases = {
        "bt_sm80": (dict(m, archs=["sm_80"], groups={"sm_80": {}}), r"\(built for sm_80\)"),
        "bt_none": (None, r"\(not built\)"),
        "bt_corrupt": ("{not json", r"\(unreadable cubins/manifest.json: "),
        "bt_stale": (stale, r"\(kernel sources changed since the build\)"),
        "bt_triton": (other_triton, r"\(built with triton 3.5.0\)"),
        "bt_ptxas": (dict(m, toolchain={"sm_90": "0" * 64}), r"\(built with another ptxas\)"),
    }
    with triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(tmp_path / "triton")
        for name, (manifest, reason) in cases.items():
            d = _fake_package(tmp_path, name, pkg_dir, manifest)
            with pytest.warns(cubins.CubinNotice) as record:
                assert cubins.install(d, 90) is False
            assert len(record) == 1
            msg = str(record[0].message)
            assert "\n" not in msg
            assert msg.startswith(f"eqdsl: {name} has no cubins for sm_90 / triton {triton.__version__} ")
            assert msg.endswith(f"its kernels compile on first use (eqdsl build {d} --arch sm_90)")
            import re

            assert re.search(reason, msg), msg
            with warnings.catch_warnings(record=True) as again:
                warnings.simplefilter("always")
                assert cubins.install(d, 90) is False
            assert not again  # one notice per package and process
        assert not (tmp_path / "triton").exists() or not any((tmp_path / "triton").iterdir())


def test_sizes_cover_both_divisibilities():
    assert build._sizes(2, None) == [37, 64]
    assert build._sizes(2, 48) == [37, 16]  # atomic conv kernels below SEGMENT_MIN_EDGES = 48
    assert build._sizes(48, None) == [49, 64]
    assert build._sizes(8192, None) == [8193, 8192]
    assert build._sizes(2, 16) == [2]  # no size divisible by 16 fits
    assert build._sizes(0, 2) == []  # 1 is never built (Triton specializes == 1)


def test_errors(pkg_dir, tmp_path, capsys):
    with pytest.raises(build.BuildError, match="bad GPU arch 'sm9x'"):
        build.build_package(pkg_dir, ["sm9x"])
    with pytest.raises(build.BuildError, match="a spec needs -o DIR"):
        build.package_dirs(tmp_path / "x.toml")
    (tmp_path / "s.toml").write_text(SPEC)
    with pytest.raises(build.BuildError, match="not generated; run: eqdsl generate"):
        build.package_dirs(tmp_path / "s.toml", tmp_path)
    assert build.package_dirs(tmp_path / "s.toml", pkg_dir.parent) == [pkg_dir]
    assert build.package_dirs(pkg_dir.parent) == [pkg_dir]
    assert main(["build", str(tmp_path), "--arch", "sm_90"]) == 2
    assert "not a generated package" in capsys.readouterr().err


def test_load_time_build_once_per_arch(pkg_dir, monkeypatch):
    """``eqdsl.load``'s build (``build_for_current_gpu``): nothing for an arch the manifest has;
    a failed build warns once, is remembered, and is not retried."""
    import torch

    calls = []

    def failing_build(d, archs, *a, **k):
        calls.append((Path(d).name, tuple(archs)))
        raise build.BuildError(f"{Path(d).name}: build failed: stand-in failure")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(build, "build_package", failing_build)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert build.build_for_current_gpu(pkg_dir.parent) == [] and calls == []  # built for sm_90 already
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.warns(cubins.CubinNotice, match="building bt_build for sm_80 failed, its kernels compile on first use"):
        assert build.build_for_current_gpu(pkg_dir.parent) == []
    assert calls == [("bt_build", ("sm_80",))]
    assert "stand-in failure" in (pkg_dir / ".cubins-sm_80.failed").read_text()
    assert build.build_for_current_gpu(pkg_dir.parent) == [] and len(calls) == 1  # not retried
    monkeypatch.setenv("EQDSL_BUILD", "0")
    (pkg_dir / ".cubins-sm_80.failed").unlink()
    assert build.build_for_current_gpu(pkg_dir.parent) == [] and len(calls) == 1  # switched off
