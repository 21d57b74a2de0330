#!/usr/bin/env bash
# Nsight Compute on one problem's conv kernels, torch then jax, in one device call:
#   [FRAMEWORKS="torch jax"] [DTYPE=float64] bash benchmarks/tools/ncu_conv.sh PROBLEM [EDGES]
# Time, DRAM bytes, registers, achieved occupancy and local-memory (spill) instructions of
# every conv kernel launch of benchmarks/tools/profile_conv.py. Logs go to $OUT (ncu_conv_*.csv).
set -u
PROBLEM=${1:-mace_large}
EDGES=${2:-114688}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
METRICS=$METRICS,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,launch__grid_size,launch__block_size
for fw in ${FRAMEWORKS:-torch jax}; do
  # jax: <name>_conv_tp_* (the plain product's kernels), <name>_conv_conv_* (the conv's own), segment_rows
  regex='conv_'; [ $fw = jax ] && regex='conv_(tp|conv)_|segment_rows'
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${NCU_TIMEOUT:-240} "$NCU" -k "regex:$regex" --metrics "$METRICS" --csv --page raw \
    python3 benchmarks/tools/profile_conv.py "$PROBLEM" $fw --edges "$EDGES" --dtype "${DTYPE:-float32}" > "$OUT/ncu_conv_$fw.csv" 2> "$OUT/ncu_conv_$fw.err"
  echo "$fw: ncu rc=$?"
  python3 - "$OUT/ncu_conv_$fw.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = [r for r in csv.DictReader(lines) if r.get("ID", "").isdigit()]
keys = [("gpu__time_duration.sum", "us", 1e-3), ("dram__bytes_read.sum", "read MB", 1e-6),
        ("dram__bytes_write.sum", "write MB", 1e-6), ("lts__t_bytes.sum", "L2 MB", 1e-6),
        ("launch__registers_per_thread", "regs", 1), ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ %", 1),
        ("smsp__sass_inst_executed_op_local_ld.sum", "local ld", 1), ("smsp__sass_inst_executed_op_local_st.sum", "local st", 1)]
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return float("nan")
# the row after the header gives each metric's unit (ns or us, byte/Kbyte/...): normalised here
units = next(csv.DictReader(lines)) if lines else {}
mult = {"ns": 1, "usecond": 1e3, "msecond": 1e6, "nsecond": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
print(f"{'kernel':48s} " + " ".join(f"{h:>9s}" for _, h, _ in keys))
for r in rows:
    vals = []
    for k, h, f in keys:
        v = num(r.get(k, "nan")) * mult.get(units.get(k, ""), 1) * f
        vals.append(f"{v:9.1f}")
    print(f"{r['Kernel Name'][:48]:48s} " + " ".join(vals))
PY
done
