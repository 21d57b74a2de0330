#!/usr/bin/env bash
# conv rows of mace_large and nequip_toluene (all anchors, same call) with pallas_fma = 1.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
EQDSL_PRECOMPILE_ARGS="--problems mace_large,nequip_toluene --dtypes float32 --conv-only" bash benchmarks/run_device.sh precompile=150
mkdir -p $OUT/bench
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
timeout 330 python3 benchmarks/bench_conv.py --problems mace_large,nequip_toluene --graphs rand512x64,bulk,rand4096x32 --no-latency --time-budget 300 --json $OUT/bench/bench_conv.json > $OUT/bench/conv.log 2>&1
echo "== bench rc $? t=$(( $(date +%s) - T0 ))"; tail -22 $OUT/bench/conv.log
cd $OUT && tar czf r.tgz bench *.log 2>/dev/null; echo "total $(( $(date +%s) - T0 )) s"
