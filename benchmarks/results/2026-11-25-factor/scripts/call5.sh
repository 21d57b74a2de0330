#!/usr/bin/env bash
# mace_large's conv rows with pallas_factor = 1 (every anchor in this call).
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
EQDSL_PRECOMPILE_ARGS="--problems mace_large --dtypes float32 --conv-only" bash benchmarks/run_device.sh precompile=150 > $OUT/install.log 2>&1
tail -3 $OUT/install.log
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/call5; cp $OUT/precompile.log $OUT/call5/ 2>/dev/null
timeout $(( 330 - ($(date +%s) - T0) )) python3 benchmarks/bench_conv.py --problems mace_large --graphs rand512x64,bulk,rand4096x32 \
  --no-latency --time-budget $(( 300 - ($(date +%s) - T0) )) --json $OUT/call5/bench_conv.json > $OUT/call5/conv.log 2>&1
echo "== conv rc $? t=$(( $(date +%s) - T0 ))"; tail -12 $OUT/call5/conv.log
cd $OUT && tar czf r.tgz call5; echo "total $(( $(date +%s) - T0 )) s"
