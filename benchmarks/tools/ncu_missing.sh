#!/usr/bin/env bash
# Nsight Compute on the rows of a harness run that an anchor wins with no measured reason yet
# (issue 28's done-when): the device call after `harness.sh conv` / `radial`, with the same carry.
# Its JSON: this machine's /tmp/harness/{tp1,tp2,conv,conv64} if the machine is still the harness's,
# else the copies carried in $NCU_JSON_DIR (default benchmarks/results/s20: tp1_bench_tp.json,
# tp2_bench_tp.json, conv_bench_conv.json, conv64_bench_conv.json, as harness.sh names them), since a
# machine goes back after 30 minutes held and the four harness calls take about that long. It merges
# the TP parts and the conv parts, lists the cases (ncu_missing.py against benchmarks/results/reasons.json;
# NCU_ALL=1: the explained rows too, after the others, to measure their reasons on the current kernels,
# but not those whose reason begins with $NCU_CURRENT, e.g. NCU_CURRENT="ncu (s21,")
# and runs ncu_rows.py on each, in that order, until its deadline (EQDSL_DEADLINE, default 570 s). On a fresh machine it installs the carried
# wheels and builds OpenEquivariance's extension first (kernels compile inside each profiled process,
# outside the profiled range). Results: $OUT/ncu.tar.xz (ncu_<i>.json, ncu.log, cases.txt, run.log).
set -u
T0=$(date +%s)
DEADLINE=${EQDSL_DEADLINE:-570}
L=/tmp/harness/ncu; mkdir -p "$L"
RESULTS=${OUT:-/tmp/out}; mkdir -p "$RESULTS"
if [ -f generated_twins.tar.xz ] && [ ! -d generated_twins ]; then tar -xJf generated_twins.tar.xz; fi
[ -f /tmp/site/.eqdsl_installed ] || OUT=$L bash benchmarks/run_device.sh report=5 > "$L/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
if [ -d .whl_oeq ]; then
  . benchmarks/tools/oeq_env.sh > "$L/oeq_env.log" 2>&1
  python3 -c "import openequivariance, torch; print('oeq ready', torch.ops.libtorch_tp_jit)" >> "$L/oeq_env.log" 2>&1
fi
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
read -ra DIRS <<< "${NCU_JSON_DIR:-benchmarks/results/s21 benchmarks/results/s20}"
pick() {  # $1: this machine's file, $2: the carried copy's name in one of DIRS
  local d
  if [ -f "$1" ]; then echo "$1"; return; fi
  for d in "${DIRS[@]}"; do [ -f "$d/$2" ] && { echo "$d/$2"; return; }; done
}
tps=()
for c in tp1 tp2; do f=$(pick /tmp/harness/$c/bench_tp.json "${c}_bench_tp.json"); [ -n "$f" ] && tps+=("$f"); done
args=()
if [ ${#tps[@]} -gt 0 ]; then
  python3 benchmarks/merge_json.py "$L/bench_tp.json" "${tps[@]}" > /dev/null && args+=(--tp "$L/bench_tp.json")
fi
convs=()
for c in conv conv64; do f=$(pick /tmp/harness/$c/bench_conv.json "${c}_bench_conv.json"); [ -n "$f" ] && convs+=("$f"); done
if [ ${#convs[@]} -gt 0 ]; then
  python3 benchmarks/merge_json.py "$L/bench_conv.json" "${convs[@]}" > /dev/null && args+=(--conv "$L/bench_conv.json")
fi
python3 benchmarks/tools/ncu_missing.py "${args[@]}" --reasons benchmarks/results/reasons.json \
  ${NCU_ALL:+--all} ${NCU_CURRENT:+--current "$NCU_CURRENT"} > "$L/cases.txt"
echo "setup $(( $(date +%s) - T0 )) s; $(wc -l < "$L/cases.txt") cases from ${tps[*]} ${convs[*]} ${args[*]}" >> "$L/run.log"
i=0
while IFS= read -r c; do
  i=$((i + 1)); left=$(( DEADLINE - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "case $i $c: no time" >> "$L/run.log"; continue; }
  graph=${c%%:*}; case_=${c#*:}
  timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$case_" ${graph:+--conv $graph} --json "$L/ncu_$i.json" >> "$L/ncu.log" 2>&1
  echo "case $i $c rc $? at $(( $(date +%s) - T0 )) s" >> "$L/run.log"
done < "$L/cases.txt"
tar -C /tmp/harness -cJf "$RESULTS/ncu.tar.xz" ncu
cp "$L/run.log" "$L/ncu.log" "$L/cases.txt" "$RESULTS/" 2>/dev/null
tail -n 40 "$L/ncu.log"; cat "$L/run.log"
