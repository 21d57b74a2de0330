#!/usr/bin/env bash
# Plain-TP table, quiet: eqdsl jax and the three anchors for every problem with nothing else running
# (call 2 timed them while 11 torch compile jobs ran: host-bound times came out slower), added to
# call 3's eqdsl torch measurements (timed after its compile, quiet).
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
bash benchmarks/run_device.sh > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/call4
timeout 500 python3 benchmarks/bench_tp.py --batch 20000 --impls eqdsl_jax,e3nn,cueq,e3nn_jax --time-budget 440 \
  --with-results exp/call3_bench_tp.json --json $OUT/call4/bench_tp.json > $OUT/call4/tp.log 2>&1
echo "== tp rc $? t=$(( $(date +%s) - T0 ))"
tail -34 $OUT/call4/tp.log
cd $OUT && tar czf r.tgz call4; echo "total $(( $(date +%s) - T0 )) s"
