#!/usr/bin/env bash
# Plain-TP table, part 2 (warm machine, right after call 2): eqdsl torch, added to call 2's
# measurements (bench_tp --with-results): every row's ratios within the two back-to-back calls.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
bash benchmarks/run_device.sh > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/call3
ls /tmp/bench/tpA.json || echo "NO tpA.json: the machine was not warm"
python3 benchmarks/precompile.py --workers 14 --no-conv > $OUT/call3/precompile.log 2>&1
echo "== precompile rc $? t=$(( $(date +%s) - T0 ))"; tail -3 $OUT/call3/precompile.log
timeout $(( 570 - ($(date +%s) - T0) )) python3 benchmarks/bench_tp.py --batch 20000 --impls eqdsl_torch \
  --with-results /tmp/bench/tpA.json --time-budget $(( 540 - ($(date +%s) - T0) )) \
  --json $OUT/call3/bench_tp.json > $OUT/call3/tp.log 2>&1
echo "== tp rc $? t=$(( $(date +%s) - T0 ))"
tail -45 $OUT/call3/tp.log
cd $OUT && tar czf r.tgz call3; echo "total $(( $(date +%s) - T0 )) s"
