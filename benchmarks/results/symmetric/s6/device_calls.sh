#!/usr/bin/env bash
# Session 6 device calls: bash exp/s6/device.sh CALL (sym | ...). Runs in the copied working tree.
set -u
CALL=$1
T0=$(date +%s)
L=/tmp/out6/$CALL; mkdir -p $L
[ -d .whl ] || { mkdir -p .whl && cp .whl_bench/*.whl .whl/; }
bash benchmarks/run_device.sh report=5 > $L/install.log 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
step() {  # step NAME SECONDS command...
  local name=$1 secs=$2; shift 2
  local left=$(( 585 - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "$name: no time" >> $L/run.log; return; }
  [ $secs -gt $left ] && secs=$left
  timeout $secs "$@" > $L/$name.log 2>&1; echo "$name rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
}
case $CALL in
  sym)
    step sym_e10 330 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32,float64 --layouts ${LAYOUTS:-mul_ir,ir_mul} --forces --per-op --elements 10 --reps 20
    step sym_e89 150 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32 --layouts mul_ir --forces --elements 89 --reps 20 --no-baselines
    ;;
  sweep)
    for cfg in ${CFGS:-4,32,4 16,32,4 32,32,4 32,32,8 64,32,8 16,64,4 8,128,4}; do
      IFS=, read bb bc nw ns <<< "$cfg"
      step sweep_${bb}_${bc}_${nw}_${ns:-1} 90 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32 --layouts ${LAYOUTS:-mul_ir,ir_mul} --forces --elements 10 --reps 10 --warmup 2 --no-baselines --block-b $bb --block-c $bc --num-warps $nw --num-stages ${ns:-1} ${SWEEP_ARGS:-}
    done
    ;;
  mace)
    [ -n "${CHECK_S:-}" ] && step mace_check ${CHECK_S:-150} python3 benchmarks/mace_products_check.py ${CHECK_ARGS:-}
    for dt in ${MACE_DTYPES:-float32 float64}; do
      step bench_mace_$dt ${MACE_S:-270} python3 benchmarks/bench_mace.py --impls $([ $dt = float32 ] && echo ${MACE_IMPLS:-e3nn,cueq,eqdsl_products} || echo ${MACE_IMPLS64:-cueq,eqdsl_products}) --dtypes $dt --json $L/bench_mace_products_$dt.json
    done
    ;;
  fold)
    step sym_e10 ${SYM_S:-240} python3 benchmarks/tools/symmetric_torch_bench.py --dtypes ${SYM_DTYPES:-float32} --layouts ${LAYOUTS:-ir_mul} --forces --per-op --elements 10 --reps 20
    for cfg in ${CFGS:-4,128,4 8,128,8 1,128,4}; do
      IFS=, read bb bc nw ns <<< "$cfg"
      step sweep_${bb}_${bc}_${nw}_${ns:-1} 90 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32 --layouts ${LAYOUTS:-ir_mul} --forces --per-op --elements 10 --reps 10 --warmup 2 --no-baselines --block-b $bb --block-c $bc --num-warps $nw --num-stages ${ns:-1}
    done
    ;;
  slot)
    for cfg in ${CFGS:-2,128,4 4,128,4 8,128,4 1,128,4 16,128,8 4,64,2}; do
      IFS=, read bb bc nw ns <<< "$cfg"
      step slot_${bb}_${bc}_${nw}_${ns:-1} 85 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32 --layouts ir_mul --forces --per-op --elements 10 --reps 10 --warmup 2 --no-baselines --slot-loop --block-b $bb --block-c $bc --num-warps $nw --num-stages ${ns:-1}
    done
    ;;
  final)
    step sym_ops ${SYM_S:-150} python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32,float64 --layouts ir_mul --forces --per-op --elements 10 --reps 20 --no-baselines
    for dt in ${MACE_DTYPES:-float64}; do
      step bench_mace_prof_$dt ${MACE_S:-420} python3 benchmarks/bench_mace.py --impls ${MACE_IMPLS:-cueq,eqdsl_products} --dtypes $dt --reps 5 --profile ${TOP:-12} --json $L/bench_mace_prof_$dt.json
    done
    ;;
  prof)
    for dt in ${MACE_DTYPES:-float32}; do
      step bench_mace_prof_$dt ${MACE_S:-420} python3 benchmarks/bench_mace.py --impls ${MACE_IMPLS:-cueq,eqdsl_products} --dtypes $dt --reps 5 --profile ${TOP:-40} --json $L/bench_mace_prof_$dt.json
    done
    [ -n "${JAX_S:-}" ] && step sym_jax ${JAX_S:-300} python3 benchmarks/symmetric_jax_check.py ${JAX_ARGS:-}
    ;;
  jax)
    [ -f benchmarks/symmetric_jax_check.py ] && step sym_jax ${JAX_S:-300} python3 benchmarks/symmetric_jax_check.py ${JAX_ARGS:-}
    ;;
  *) echo "unknown call $CALL"; exit 2;;
esac
cd /tmp/out6 && tar -czf $OUT/$CALL.tgz $CALL; cp $CALL/*.json $OUT/ 2>/dev/null
cat $L/run.log
if [ $CALL = sweep ] || [ $CALL = slot ]; then grep -H "RESULT\|FAILED\|Error" $L/s[wl]*_*.log | cut -c1-600; else for f in $L/*.log; do echo "== $f"; tail -n 25 $f; done 2>/dev/null | tail -n 150; fi
