#!/usr/bin/env bash
# Profile the generated torch kernel ops with Nsight Compute, in one device call:
#   bash benchmarks/tools/ncu_ops.sh PROBLEMS [BATCH]      e.g. mace_large,nequip_toluene 20000
# 1. profile_ops.py times each op (CUDA events) while nvidia-smi samples the SM clock,
#    memory clock, power and throttle reasons once a second (clocks.csv): a slow run on a
#    throttled GPU shows there.
# 2. The same ops run once more under ncu: time, SM clock, DRAM bytes read/written (to set
#    against the bytes the op must move), registers per thread, achieved occupancy and
#    local-memory (spill) instructions.
# Logs go to $OUT (ncu.csv, profile.log, clocks.csv).
set -u
PROBLEMS=${1:-mace_large}
BATCH=${2:-20000}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -l 1 > "$OUT/clocks.csv" 2>&1 &
SMI=$!
python3 benchmarks/tools/profile_ops.py --problems "$PROBLEMS" --batch "$BATCH" 2>&1 | tee "$OUT/profile.log"
kill $SMI
echo "SM clock MHz during profile_ops (min/median/max):"
awk -F', ' 'NR>1 && $2+0>0 {print $2+0}' "$OUT/clocks.csv" | sort -n | awk '{a[NR]=$1} END {print a[1], a[int((NR+1)/2)], a[NR]}'
echo "throttle reasons seen:"; awk -F', ' 'NR>1 {print $6}' "$OUT/clocks.csv" | sort | uniq -c

METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum
METRICS=$METRICS,launch__registers_per_thread,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,launch__grid_size,launch__block_size
"$NCU" --profile-from-start off --metrics "$METRICS" --csv --page raw \
  python3 benchmarks/tools/profile_ops.py --problems "$PROBLEMS" --batch "$BATCH" --ncu > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"
python3 - "$OUT/ncu.csv" <<'EOF'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))
keys = ["Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "dram__bytes_read.sum",
        "dram__bytes_write.sum", "launch__registers_per_thread", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "smsp__sass_inst_executed_op_local_ld.sum", "smsp__sass_inst_executed_op_local_st.sum", "launch__grid_size"]
short = ["kernel", "time", "SM clk", "DRAM rd", "DRAM wr", "regs", "occup %", "local ld", "local st", "grid"]
units = rows[0] if rows else {}
print("  ".join(f"{s}[{units.get(k, '')}]" for s, k in zip(short, keys)))
for r in rows[1:]:
    print("  ".join(str(r.get(k, "?"))[:40] for k in keys))
EOF
