#!/usr/bin/env bash
# mace_large conv rows (all anchors, same call) with the split JAX conv kernels; JAX small-graph kernel times.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
EQDSL_PRECOMPILE_ARGS="--problems mace_large --dtypes float32 --conv-only" bash benchmarks/run_device.sh precompile=150
mkdir -p $OUT/bench
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
timeout 280 python3 benchmarks/bench_conv.py --problems mace_large --graphs rand512x64,bulk,rand4096x32 --no-latency --time-budget 240 --json $OUT/bench/bench_conv.json > $OUT/bench/conv.log 2>&1
echo "== bench rc $? t=$(( $(date +%s) - T0 ))"; tail -22 $OUT/bench/conv.log
timeout 100 python3 benchmarks/profile_small.py --problems mace_large,nequip_water --jax-only > $OUT/profile_small_jax.log 2>&1
echo "== profile rc $? t=$(( $(date +%s) - T0 ))"; grep -v Warning $OUT/profile_small_jax.log | tail -60
cd $OUT && tar czf r.tgz bench profile_small_jax.log *.log 2>/dev/null; echo "total $(( $(date +%s) - T0 )) s"
