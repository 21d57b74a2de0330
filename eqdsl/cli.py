"""Command line: ``eqdsl inspect | generate | check | build | tune``. Logic lives in the library."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import SpecError

DEFAULT_SPECS = Path("examples/specs")
DEFAULT_OUT = Path("generated")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="eqdsl", description="Generate O(3)-equivariant tensor-product kernels from TOML specs.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="print the paths, weights, CG nonzeros and costs of a spec")
    p.add_argument("spec", type=Path)
    p = sub.add_parser("generate", help="write the generated packages of a spec into a directory")
    p.add_argument("spec", type=Path)
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="output directory (default: generated)")
    p.add_argument("--no-triton", action="store_true",
                   help="skip the kernels' Triton code (triton_kernels/): the torch runtime then runs them through Helion")
    p = sub.add_parser("check", help="fail if generated packages are stale")
    p.add_argument("specs", type=Path, nargs="*", help=f"spec files (default: {DEFAULT_SPECS}/*.toml)")
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="generated directory (default: generated)")
    p.add_argument("--full", action="store_true",
                   help="also lower the Helion kernels to Triton again and compare (seconds per kernel)")
    p.add_argument("--no-triton", action="store_true", help="the packages were generated with --no-triton")
    p = sub.add_parser("build", help="compile packages' Triton kernels to cubins for GPU archs (no GPU needed)")
    p.add_argument("path", type=Path, help="a generated package, a generated directory (every package), or a spec .toml with -o")
    p.add_argument("-o", "--out", type=Path, default=None, help="with a spec: the directory it was generated into")
    p.add_argument("--arch", default="sm_90", help="GPU archs, comma-separated (default sm_90; e.g. sm_90,sm_80,sm_100)")
    p.add_argument("--dtype", default=None, help="dtypes, comma-separated (default: each package's dtypes)")
    p.add_argument("--jobs", type=int, default=None, help="compiling processes per package (default: CPUs)")
    p.add_argument("--keep-ir", action="store_true", help="also keep Triton's IR stages (ttir, ttgir, llir, ptx)")
    p = sub.add_parser("tune", help="time Helion and Pallas kernel parameters on a GPU; --write puts the best into the spec")
    p.add_argument("spec", type=Path)
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="regenerate here after --write (default: generated)")
    p.add_argument("--batch", type=int, default=20000, help="rows to time at (default 20000)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="the dtype to time (default float32); on a spec of both dtypes the candidates set that "
                        "dtype's own keys (block_b_float64, num_warps_float64, num_stages_float64, "
                        "pallas_block_batch_float64, pallas_num_warps_float64, pallas_segment_edges_float64, "
                        "pallas_conv_max_terms_float64), "
                        "so the other dtype's kernels keep theirs")
    p.add_argument("--grid", action="append", default=None, metavar="KEY=V1,V2",
                   help="a tuning key and its values to try (repeatable; default num_warps=4,8 block_b=2,4,8,16 "
                        "block_c=32,64,128 for the Helion ops, pallas_block_batch=1,2,4,8,16,32,64 pallas_num_warps=2,4,8 "
                        "for pallas, and pallas_unroll=1,2,4 where its kernels loop over a channel (uvw products); "
                        "pallas_segment_edges=1,2,4,8 pallas_conv_max_terms=48,72,140,1200 for pallas_conv; "
                        "pallas_segment_edges, pallas_conv_max_terms, pallas_conv_fused_max_terms and pallas_conv_fuse_bwd "
                        "tune pallas_conv only, the other pallas_* keys pallas only, the rest the Helion ops only)")
    p.add_argument("--ops", default=None, metavar="OP,OP",
                   help="kernel ops to tune (default fwd,bwd_x1,bwd_x2,bwd_w, and bwd where the product has a fused backward (per-row weights, uvu or uvw paths, one-channel x2 blocks); "
                        "and pallas (the JAX kernels, forward + backward) where jax sees a GPU, with pallas_conv (the JAX "
                        "conv, forward + backward on a graph of BATCH edges) for a conv spec; "
                        "conv specs also conv_fwd,conv_bwd_x,conv_bwd_y,conv_bwd_w)")
    p.add_argument("--workers", type=int, default=None, help="compiling processes (default: CPUs - 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job (generate, compile, time) may take (default 900)")
    p.add_argument("--write", action="store_true", help="write the best [tensor_product.tuning] into the spec and regenerate")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.command == "inspect":
        from .lower import lower
        from .spec import load_spec
        from .summary import summarize

        print("\n".join(summarize(s, lower(s)) for s in load_spec(args.spec)), end="")
        return 0
    if args.command == "build":
        from .build import BuildError, build

        try:
            build(args.path, [a for a in args.arch.split(",") if a.strip()],
                  [d.strip() for d in args.dtype.split(",") if d.strip()] if args.dtype else None, args.out,
                  jobs=args.jobs, keep_ir=args.keep_ir, log=lambda r: print(r.line(), flush=True))
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == "tune":
        from .tune import TuneError, format_results, parse_grid, tune, tuning_sections

        try:
            grid = parse_grid(args.grid) if args.grid else None
            ops = tuple(o.strip() for o in args.ops.split(",") if o.strip()) if args.ops else None
            table, results = tune(args.spec, args.out, batch=args.batch, dtype=args.dtype, grid=grid, ops=ops,
                                  workers=args.workers, write=args.write, timeout=args.timeout)
        except TuneError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(format_results(results))
        where = f"written to {args.spec} and regenerated into {args.out}" if args.write else "not written (--write)"
        print(f"\nbest ({where}):\n{tuning_sections(table)}", end="")
        return 0
    from .codegen.generate import GenerateError, check, generate

    if args.command == "generate":
        try:
            for path in generate(args.spec, args.out, triton=not args.no_triton):
                print(f"wrote {path}")
        except GenerateError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    specs = args.specs or sorted(DEFAULT_SPECS.glob("*.toml"))
    if not specs:
        print(f"error: no spec files given and none in {DEFAULT_SPECS}", file=sys.stderr)
        return 2
    problems = check(specs, args.out, full=args.full, triton=not args.no_triton)
    if problems:
        sys.stdout.write("".join(problems))
        cmds = "; ".join(f"eqdsl generate {s.as_posix()} -o {args.out.as_posix()}" for s in specs)
        print(f"\nerror: {len(problems)} generated file(s) are stale. Fix: {cmds}", file=sys.stderr)
        return 1
    print(f"{args.out}: fresh ({len(specs)} spec files)")
    return 0
