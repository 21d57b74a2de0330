# Session of 2026-11-26 21:20-00:20 UTC (RUN_radial.md): the device calls, run from the repository root with
# carry .whl_bench .whl_cueq_xz: bash <this file> checks | radial | sym (radial: IMPLS=eqdsl_torch,eqdsl_torch_unfused,cueq_irmul,eqdsl_jax,eqdsl_jax_unfused).
# The ncu2 call is the 'ncu2' case of device_calls.sh.
#!/usr/bin/env bash
# Session 4 device calls: bash exp/s4/device.sh CALL (checks | radial | sym). Runs in the copied working tree.
set -u
CALL=$1
T0=$(date +%s)
L=/tmp/out4/$CALL; mkdir -p $L
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
  checks)
    step radial_torch 230 python3 benchmarks/tools/radial_torch_check.py --package generated
    step sym_torch 150 python3 benchmarks/tools/symmetric_torch_bench.py --dtypes float32
    step radial_jax 120 python3 benchmarks/tools/radial_jax_check.py --package generated
    step sym_jax 100 python3 benchmarks/tools/symmetric_jax_bench.py --dtypes float32
    ;;
  radial)
    step bench_radial 570 python3 benchmarks/bench_conv.py --radial --problems mace_large,nequip_toluene \
      --graphs bulk,rand4096x32 --impls ${IMPLS:-eqdsl_torch,eqdsl_torch_unfused,cueq_irmul,cueq,eqdsl_jax,eqdsl_jax_unfused} \
      --dtypes ${DTYPES:-float32,float64} --time-budget 480 --target-ms 60 --json $L/bench_radial.json
    ;;
  sym)
    step sym_jax 560 python3 benchmarks/tools/symmetric_jax_bench.py --dtypes float32 --layouts mul_ir
    ;;
esac
cd /tmp/out4 && tar -czf $OUT/$CALL.tgz $CALL; cp $CALL/*.json $OUT/ 2>/dev/null
cat $L/run.log; for f in $L/*.log; do echo "== $f"; tail -n 25 $f; done 2>/dev/null | tail -n 150
