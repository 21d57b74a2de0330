#!/usr/bin/env python3
"""The ``ir_mul`` twin of each channelwise example, so the benchmarks compare eqdsl in both layouts.

    python benchmarks/layout_twins.py [-o generated_twins] [--problems mace_large,...] [--no-triton]

For every ``examples/specs/*.toml`` whose product is channelwise (``mode = "uvu"``) and laid
out ``mul_ir``, writes ``<out>/<name>_irmul/``: the package ``eqdsl generate`` makes from the
same spec with ``layout = "ir_mul"`` (every block stored ``(2l+1, mul)`` instead of
``(mul, 2l+1)``, cuEquivariance's fast layout) and the name ``<name>_irmul``; float64 is kept
only for the problems the benchmarks time in float64 (``bench_tp.FLOAT64_PROBLEMS``), the
others are generated for float32 alone (half the lowering). The spec is changed as data
(``dataclasses.replace`` on the parsed spec), never as text; everything else (tuning,
instructions, normalization, conv) is the example's. ``bench_tp.py`` and ``bench_conv.py``
run these packages as ``eqdsl_torch_irmul`` / ``eqdsl_jax_irmul`` beside the ``mul_ir``
ones (``--twins <out>``), on the same inputs permuted to ``ir_mul``.

The output is a benchmark input, not committed: regenerate it when the examples change.
Lowering to Triton takes tens of seconds per kernel on a CPU (cached in
``$EQDSL_CACHE_DIR/lowered``); ``--no-triton`` skips it (the torch runtime then launches the
Helion kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root, when run as a script: eqdsl and the suite
from benchmarks.bench_tp import FLOAT64_PROBLEMS  # noqa: E402  (the problems timed in float64)
SUFFIX = "_irmul"


def twin_specs(spec_dir: Path, problems: list[str] | None):
    """(spec file, ir_mul twin spec) for every channelwise mul_ir example (or ``problems``)."""
    from eqdsl.spec import load_spec

    out = []
    for path in sorted(spec_dir.glob("*.toml")):
        for spec in load_spec(path):
            if problems is not None and spec.name not in problems:
                continue
            if spec.mode != "uvu" or spec.layout != "mul_ir":
                continue
            dtypes = spec.dtypes if spec.name in FLOAT64_PROBLEMS else tuple(d for d in spec.dtypes if d == "float32")
            out.append((path, dataclasses.replace(spec, name=spec.name + SUFFIX, layout="ir_mul", dtypes=dtypes)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", default="generated_twins", help="output directory (default generated_twins)")
    p.add_argument("--specs", default=str(ROOT / "examples" / "specs"))
    p.add_argument("--problems", help="comma-separated example names (default: every channelwise mul_ir example)")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton lowering")
    args = p.parse_args(argv)
    from eqdsl.codegen.generate import Header, package_files, write_package
    from eqdsl.lower import lower

    problems = [s.strip() for s in args.problems.split(",")] if args.problems else None
    twins = twin_specs(Path(args.specs), problems)
    if not twins:
        raise SystemExit("no channelwise mul_ir example matched")
    command = "python benchmarks/layout_twins.py -o " + args.out + (f" --problems {args.problems}" if args.problems else "")
    for path, spec in twins:
        header = Header(path.as_posix() + f" with layout = \"ir_mul\", name = \"{spec.name}\"",
                        hashlib.sha256(path.read_bytes()).hexdigest(), command).lines()
        files = {f"{spec.name}/{rel}": text
                 for rel, text in package_files(spec, lower(spec), header, triton=not args.no_triton).items()}
        write_package(args.out, files)
        print(f"{args.out}/{spec.name}: {len(files)} files ({', '.join(spec.dtypes)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
