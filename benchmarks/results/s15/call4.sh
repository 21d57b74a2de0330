#!/usr/bin/env bash
# s15 call 4: the committed tuning (e3tools_conv unroll 4, diffdock_l2 unroll 2 at 16 rows): per-op times (fused
# backward against the three, all unrolled), then same-call rows against HEAD (b561884), e3nn-jax and OEQ.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
. benchmarks/tools/oeq_env.sh > /dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
ROOT=$PWD
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv,diffdock_l2 --dtypes float32,float64 > $OUT/ops.log 2>&1
echo "ops $(( $(date +%s) - T0 )) s"
run() {  # $1 tree, $2 label, $3 impls, $4 timeout
  (cd $1 && PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache_$2 timeout $4 python3 benchmarks/bench_tp.py --problems diffdock_l2,e3tools_conv \
     --batch 20000 --impls $3 --directions fwd,fwd+bwd --dtypes float32,float64 --time-budget $(( $4 - 20 )) --json $OUT/$2.json > $OUT/$2.log 2>&1)
  echo "$2 done $(( $(date +%s) - T0 )) s"
}
left=$(( 560 - ($(date +%s) - T0) ))
run $ROOT new eqdsl_jax,e3nn_jax,oeq $(( left * 6 / 10 ))
left=$(( 560 - ($(date +%s) - T0) ))
run $ROOT/exp/ab/old old eqdsl_jax $left
for f in new old; do echo "== $f"; grep -E "^ *(diffdock_l2|e3tools_conv) +f(32|64)" $OUT/$f.log; done
grep "^| " $OUT/ops.log
