#!/usr/bin/env bash
# Plain-TP table, part 1: eqdsl jax and the three anchors for every problem (float32, and float64 for
# mace_large / nequip_toluene) while the float32 torch kernels compile in the background.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
bash benchmarks/run_device.sh > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/call2 /tmp/bench
python3 benchmarks/precompile.py --workers 11 --no-conv --dtypes float32 > $OUT/call2/precompile_f32.log 2>&1 &
PC=$!
timeout 420 python3 benchmarks/bench_tp.py --batch 20000 --impls eqdsl_jax,e3nn,cueq,e3nn_jax --time-budget 390 \
  --json /tmp/bench/tpA.json > $OUT/call2/tpA.log 2>&1
echo "== tpA rc $? t=$(( $(date +%s) - T0 ))"
cp /tmp/bench/tpA.json $OUT/call2/ 2>/dev/null
while kill -0 $PC 2>/dev/null && [ $(( $(date +%s) - T0 )) -lt 560 ]; do sleep 5; done
kill $PC 2>/dev/null
echo "== precompile t=$(( $(date +%s) - T0 ))"; tail -3 $OUT/call2/precompile_f32.log
tail -40 $OUT/call2/tpA.log
cd $OUT && tar czf r.tgz call2 install.log; echo "total $(( $(date +%s) - T0 )) s"
