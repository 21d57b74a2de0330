#!/usr/bin/env bash
# Nsight Compute on the rows of this machine's harness run that an anchor wins with no measured
# reason yet (issue 28's done-when): run it as the device call right after `harness.sh conv` (and
# `radial`) on the same warm machine, with the same carry. It merges /tmp/harness/{tp1,tp2}'s
# bench_tp.json, lists the cases (ncu_missing.py against benchmarks/results/reasons.json) and runs
# ncu_rows.py on each, in table order, until its deadline (EQDSL_DEADLINE, default 570 s).
# Results: $OUT/ncu.tar.xz (ncu_<i>.json, ncu.log, cases.txt, run.log); the log's tail is printed.
set -u
T0=$(date +%s)
DEADLINE=${EQDSL_DEADLINE:-570}
L=/tmp/harness/ncu; mkdir -p "$L"
RESULTS=${OUT:-/tmp/out}; mkdir -p "$RESULTS"
if [ -f generated_twins.tar.xz ] && [ ! -d generated_twins ]; then tar -xJf generated_twins.tar.xz; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
[ -d .whl_oeq ] && . benchmarks/tools/oeq_env.sh > "$L/oeq_env.log" 2>&1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
if [ ! -f /tmp/site/.eqdsl_installed ]; then
  echo "no harness run on this machine (/tmp/site empty): run harness.sh first, on the same warm machine" | tee "$L/run.log"
  exit 1
fi
tps=(); for c in tp1 tp2; do [ -f /tmp/harness/$c/bench_tp.json ] && tps+=(/tmp/harness/$c/bench_tp.json); done
args=()
if [ ${#tps[@]} -gt 0 ]; then
  python3 benchmarks/merge_json.py "$L/bench_tp.json" "${tps[@]}" && args+=(--tp "$L/bench_tp.json")
fi
[ -f /tmp/harness/conv/bench_conv.json ] && args+=(--conv /tmp/harness/conv/bench_conv.json)
python3 benchmarks/tools/ncu_missing.py "${args[@]}" --reasons benchmarks/results/reasons.json > "$L/cases.txt"
echo "$(wc -l < "$L/cases.txt") cases from ${args[*]}" >> "$L/run.log"
i=0
while IFS= read -r c; do
  i=$((i + 1)); left=$(( DEADLINE - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "case $i $c: no time" >> "$L/run.log"; continue; }
  graph=${c%%:*}; case_=${c#*:}
  timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$case_" ${graph:+--conv $graph} --json "$L/ncu_$i.json" >> "$L/ncu.log" 2>&1
  echo "case $i $c rc $? at $(( $(date +%s) - T0 )) s" >> "$L/run.log"
done < "$L/cases.txt"
tar -C /tmp/harness -cJf "$RESULTS/ncu.tar.xz" ncu
cp "$L/run.log" "$L/ncu.log" "$RESULTS/" 2>/dev/null
tail -n 40 "$L/ncu.log"; cat "$L/run.log"
