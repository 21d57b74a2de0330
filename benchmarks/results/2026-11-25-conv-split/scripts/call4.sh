#!/usr/bin/env bash
# nequip_toluene conv rows (all anchors) and the small-graph latency tables, with the split JAX conv
# kernels; the JAX dispatch floor of this host.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
EQDSL_PRECOMPILE_ARGS="--problems nequip_toluene,mace_large,nequip_water --dtypes float32 --conv-only" bash benchmarks/run_device.sh precompile=170
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
timeout 60 python3 benchmarks/profile_small.py --problems nequip_water --jax-only > $OUT/profile_small_jax.log 2>&1
echo "== profile rc $? t=$(( $(date +%s) - T0 ))"; grep -E "floor|host" $OUT/profile_small_jax.log
mkdir -p $OUT/bench $OUT/lat_mace_large $OUT/lat_nequip_water
timeout 250 python3 benchmarks/bench_conv.py --problems nequip_toluene --graphs rand512x64,bulk,rand4096x32 --no-latency --time-budget 210 --json $OUT/bench/bench_conv.json > $OUT/bench/conv.log 2>&1
echo "== bench rc $? t=$(( $(date +%s) - T0 ))"; tail -12 $OUT/bench/conv.log
for p in mace_large nequip_water; do
  timeout 80 python3 benchmarks/bench_conv.py --latency-only --latency-problem $p --latency-json $OUT/lat_$p/bench_latency.json > $OUT/lat_$p/conv.log 2>&1
  echo "== lat $p rc $? t=$(( $(date +%s) - T0 ))"; grep -E "eqdsl|cueq|e3nn" $OUT/lat_$p/conv.log | tail -12
done
cd $OUT && tar czf r.tgz bench lat_* *.log 2>/dev/null; echo "total $(( $(date +%s) - T0 )) s"
