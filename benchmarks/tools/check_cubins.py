#!/usr/bin/env python3
"""Does a package's ``eqdsl build`` output load without compiling? Fails loudly if not.

Builds nothing. Starts from an empty Triton cache (a fresh ``$TRITON_CACHE_DIR``), installs
the package's cubins (``eqdsl.runtime.cubins.install``, as the runtime does: each kernel's
entries are written right before its first compilation; exit 1 if they do not apply to
this GPU), then makes the launches ``eqdsl build`` compiled (``eqdsl.build.exercise``:
every op, every dtype of the manifest, the same sizes) and records every compilation
Triton does through its public listener ``triton.knobs.compilation.listener``
(``cache_hit`` tells a loaded binary from a compiled one). Prints one row per kernel
module: variants built, loaded from the cache, compiled; then the wall time of the
first (loading) pass. Exit status 1 when any variant was compiled (the key Triton
computed here differs from the build's, or the ops launched a variant the build did not
make), 2 on usage errors. Triton's launchers (C extensions, one per argument signature)
are not part of a build: the first pass includes compiling them::

    python benchmarks/tools/check_cubins.py generated/mace_large           # on a GPU
    python benchmarks/tools/check_cubins.py /tmp/pkg/bt --stand-in sm_90   # CPU: no GPU,
        # Triton told a sm_90 device is active (as the build is): checks the install and
        # that Triton finds every entry under its own key, not the GPU's key

``EQDSL_KERNELS`` and ``TRITON_INTERPRET`` are ignored (unset here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", type=Path, help="a generated package directory holding cubins/")
    ap.add_argument("--stand-in", metavar="ARCH", help="no GPU: warm up for ARCH with a stand-in driver (CPU check)")
    ap.add_argument("--cache-dir", type=Path, help="Triton cache directory to use, empty or absent (default: a fresh temporary one)")
    args = ap.parse_args(argv)
    manifest_path = args.package / "cubins" / "manifest.json"
    if not manifest_path.is_file():
        print(f"error: {manifest_path} missing: run eqdsl build {args.package} first", file=sys.stderr)
        return 2
    manifest = json.loads(manifest_path.read_text())
    # a fresh, empty Triton cache: only the installed entries can be hits
    if args.cache_dir is not None and args.cache_dir.exists() and any(args.cache_dir.iterdir()):
        print(f"error: --cache-dir {args.cache_dir} is not empty", file=sys.stderr)
        return 2
    cache_dir = str(args.cache_dir) if args.cache_dir else tempfile.mkdtemp(prefix="eqdsl-check-cubins-")
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.pop("EQDSL_KERNELS", None)  # the Triton code (EQDSL_KERNELS=helion would launch Helion's)
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    from eqdsl import build
    from eqdsl.runtime import cubins

    if args.stand_in:
        capability = cubins.parse_arch(args.stand_in)
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device (use --stand-in ARCH for the CPU check)", file=sys.stderr)
            return 2
        major, minor = torch.cuda.get_device_capability()
        capability = major * 10 + minor
    arch = cubins.arch_name(capability)
    if not cubins.install(args.package, capability):
        print(f"FAIL: the cubins of {args.package} do not apply to {arch} / triton {triton.__version__} "
              "(the warning above says why)")
        return 1
    built = Counter(e["module"] for e in manifest["groups"][arch].values())

    events = []  # (module path in the package, cache hit)

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        module = sys.modules.get(getattr(src.fn, "module", ""), None)
        path = getattr(module, "__file__", None)
        rel = Path(path).resolve().relative_to(args.package.resolve()).as_posix() if path else str(src.name)
        events.append((rel, cache_hit))

    triton.knobs.compilation.listener = listener
    package = build.import_package(args.package)
    t0 = time.perf_counter()
    if args.stand_in:
        launches = build.record_launches(package, manifest["dtypes"])
        build.compile_launches(launches, capability, Path(cache_dir))
    else:
        for dtype in manifest["dtypes"]:
            build.exercise(package, dtype, device="cuda")
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0

    hits = Counter(m for m, hit in events if hit)
    compiled = Counter(m for m, hit in events if not hit)
    modules = sorted(set(built) | set(hits) | set(compiled))
    width = max(len(m) for m in modules) if modules else 10
    print(f"{'module':<{width}}  built  loaded  compiled")
    for m in modules:
        flag = "  <-- compiled" if compiled[m] else ""
        print(f"{m:<{width}}  {built[m]:5d}  {hits[m]:6d}  {compiled[m]:8d}{flag}")
    where = f"stand-in {arch}" if args.stand_in else torch.cuda.get_device_name()
    print(f"{args.package.name} on {where}: {sum(hits.values())} variants loaded, {sum(compiled.values())} compiled, "
          f"first pass {seconds:.2f} s (triton {triton.__version__})")
    if compiled:
        print(f"FAIL: {sum(compiled.values())} variant(s) compiled although the package was built for {arch}")
        return 1
    if not hits:
        print("FAIL: no kernel was launched")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
