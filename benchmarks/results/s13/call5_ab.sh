#!/usr/bin/env bash
# Device A/B (s13): nequip_toluene's fused TP backward, HEAD's tuning (old) against per-dtype tuning (new).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
. benchmarks/tools/oeq_env.sh > /dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
ROOT=$PWD
run() {  # $1 tree, $2 label, $3 impls
  (cd $1 && PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache_$2 timeout 200 python3 benchmarks/bench_tp.py --problems nequip_toluene \
     --batch 20000 --impls $3 --directions fwd,fwd+bwd --dtypes float32,float64 --time-budget 150 --json $OUT/$2.json > $OUT/$2.log 2>&1)
  echo "$2 done $(( $(date +%s) - T0 )) s"
}
run $ROOT new eqdsl_torch,oeq
run $ROOT/exp/ab/old old eqdsl_torch
run $ROOT new2 eqdsl_torch
for f in new old new2; do echo "== $f"; grep -E "^ *nequip_toluene +f(32|64)" $OUT/$f.log; done
