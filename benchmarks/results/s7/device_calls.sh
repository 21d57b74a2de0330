#!/usr/bin/env bash
# Session 7 device calls: bash exp/s7/device.sh CALL (f64 | f32). Runs in the copied working tree.
set -u
CALL=$1
T0=$(date +%s)
L=/tmp/out7/$CALL; mkdir -p $L
bash benchmarks/run_device.sh report=5 > $L/install.log 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
step() {  # step NAME SECONDS command...
  local name=$1 secs=$2; shift 2
  local left=$(( 585 - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "$name: no time" >> $L/run.log; return; }
  [ $secs -gt $left ] && secs=$left
  timeout $secs "$@" > $L/$name.log 2>&1; echo "$name rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
}
case $CALL in
  f64)  # the per-element sum of dA by matmul: per op, then MACE's training step in float64
    step sym_ops ${SYM_S:-150} python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32,float64 --layouts ir_mul --forces --per-op --elements 10 --reps 20 --no-baselines
    step bench_mace_prof_float64 ${MACE_S:-420} python3 benchmarks/bench_mace.py --impls cueq,eqdsl_products --dtypes float64 --reps 5 --profile ${TOP:-12} --json $L/bench_mace_prof_float64.json
    ;;
  f32)  # MACE float32, then start-up with cubins built here (Triton's launchers no longer shipped)
    step bench_mace_prof_float32 ${MACE_S:-400} python3 benchmarks/bench_mace.py --impls cueq,eqdsl_products --dtypes float32 --reps 5 --profile ${TOP:-12} --json $L/bench_mace_prof_float32.json
    step build 100 python3 -c "import sys; from eqdsl.cli import main; sys.exit(main(sys.argv[1:]))" build generated/mace_large --arch sm_90 --jobs 16
    step startup_cubins 80 python3 benchmarks/bench_startup.py --steps torch_cubins --timeout 70 --json $L/startup_cubins.json
    ;;
  *) echo "unknown call $CALL"; exit 2;;
esac
cd /tmp/out7 && tar -czf $OUT/$CALL.tgz $CALL; cp $CALL/*.json $OUT/ 2>/dev/null
cat $L/run.log
for f in $L/*.log; do echo "== $f"; tail -n 25 $f; done 2>/dev/null | tail -n 150
