"""reasons.json entries for the radial rows of the s11 run: the same run's unfused rows and the conv table.

    python benchmarks/results/s11/radial_reasons.py > radial.json   # from the repository root, then merged by hand
"""
import argparse, json, sys
sys.path.insert(0, ".")
from benchmarks import report

RAD = "benchmarks/results/s11/bench_radial.json"
CONV = "benchmarks/results/s11/bench_conv.json"
data = report.load_inputs(argparse.Namespace(tp=None, conv=CONV, radial=RAD, latency=None, files=[]))
conv_t = {(m["problem"], m["dtype"], m["config"], m["direction"], m["impl"]): m["time_us"]
          for m in report.measurements(data, "conv")}
rad_t = {(m["problem"], m["dtype"], m["config"], m["direction"], m["impl"]): m["time_us"]
         for m in report.measurements(data, "radial")}
f = lambda v: f"{v:,.0f}"
out = {}
for r in report.slower_rows(report.measurements(data, "radial"), "radial"):
    p, dt, g, d = r["problem"], r["dtype"], r["config"], r["direction"]
    t = r["time_us"]
    tu, ju = rad_t[(p, dt, g, d, "eqdsl_torch_unfused")], rad_t[(p, dt, g, d, "eqdsl_jax_unfused")]
    head = "same run (H100, 2026-11-27, s11): "
    if r["impl"] == "eqdsl_torch":
        if d == "fwd":
            why = (f"conv_radial ran as rf @ wr + the conv op's kernels (materialize = 1 in every conv_radial op, "
                   f"set this session), the unfused row's kernels: {f(t)} against {f(tu)} us, the difference outside "
                   f"the kernels (not profiled); since this run conv_radial is the composition itself "
                   f"(RadialConvOps.composed), the unfused row's call")
        else:
            why = (f"conv_radial's backward formed W = rf @ wr again (one more matmul) where the unfused row keeps W "
                   f"from the forward: {f(t)} against {f(tu)} us; since this run conv_radial is the composition "
                   f"itself (RadialConvOps.composed: autograd keeps W), the unfused row's path")
    else:
        jc, tc = conv_t.get((p, dt, g, d, "eqdsl_jax")), conv_t.get((p, dt, g, d, "eqdsl_torch"))
        why = (f"jax_ops.conv_radial is rf @ wr + jax_ops.conv (pallas_radial_materialize = 1): {f(t)} us, the JAX "
               f"unfused row {f(ju)} (the same calls), the torch unfused row {f(tu)}. The conv alone, mul_ir (conv "
               f"table, same day, another machine): JAX {f(jc)} against torch {f(tc)} us, ")
        why += ("so the JAX conv is the larger part of the gap (its reasons: the conv table)" if jc > tc else
                "so the JAX conv is not what is slower here: the remainder, the matmul at Precision.HIGHEST and "
                "XLA's ops around the kernels, is (not profiled)")
        oc = conv_t.get((p, dt, g, d, "oeq"))
        if any(a[2] == "oeq" for a in r["anchors"]) and oc:
            why += f"; OEQ's conv alone took {f(oc)} us there"
    out[r["key"]] = head + why
json.dump({k: v.replace(" us", " µs") for k, v in out.items()}, sys.stdout, indent=1, ensure_ascii=False)
