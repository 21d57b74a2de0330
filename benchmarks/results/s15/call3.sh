#!/usr/bin/env bash
# s15 call 3: eqdsl tune --ops pallas with pallas_unroll (1, 2, 4, 8) x block_batch, float32, then float64 blocks;
# per-op times with the written tuning; same-call rows against HEAD (b561884), e3nn-jax and OEQ.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
. benchmarks/tools/oeq_env.sh > /dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
ROOT=$PWD
export PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache
for p in e3tools_conv diffdock_l2; do
  timeout 110 python3 -m eqdsl tune examples/specs/$p.toml --dtype float32 --ops pallas --grid pallas_unroll=1,2,4,8 \
    --grid pallas_block_batch=4,8,16 --grid pallas_num_warps=4 --workers 15 --timeout 100 --write > $OUT/tune_${p}_f32.log 2>&1
  echo "tune $p f32 $(( $(date +%s) - T0 )) s"
  timeout 60 python3 -m eqdsl tune examples/specs/$p.toml --dtype float64 --ops pallas \
    --grid pallas_block_batch=2,4,8,16 --grid pallas_num_warps=4 --workers 15 --timeout 50 --write > $OUT/tune_${p}_f64.log 2>&1
  echo "tune $p f64 $(( $(date +%s) - T0 )) s"
  cp examples/specs/$p.toml $OUT/spec_$p.txt
done
timeout 90 python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv,diffdock_l2 --dtypes float32,float64 > $OUT/ops.log 2>&1
echo "ops $(( $(date +%s) - T0 )) s"
run() {  # $1 tree, $2 label, $3 impls, $4 timeout
  (cd $1 && PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache_$2 timeout $4 python3 benchmarks/bench_tp.py --problems diffdock_l2,e3tools_conv \
     --batch 20000 --impls $3 --directions fwd,fwd+bwd --dtypes float32,float64 --time-budget $(( $4 - 20 )) --json $OUT/$2.json > $OUT/$2.log 2>&1)
  echo "$2 done $(( $(date +%s) - T0 )) s"
}
left=$(( 585 - ($(date +%s) - T0) ))
run $ROOT new eqdsl_jax,e3nn_jax,oeq $(( left * 6 / 10 ))
left=$(( 585 - ($(date +%s) - T0) ))
run $ROOT/exp/ab/old old eqdsl_jax $left
for f in new old; do echo "== $f"; grep -E "^ *(diffdock_l2|e3tools_conv) +f(32|64)" $OUT/$f.log; done
grep "^| " $OUT/ops.log
for f in $OUT/tune_*.log; do echo "== $f"; grep -A4 "^pallas:" $f; done
for p in e3tools_conv diffdock_l2; do echo "== $p"; grep -n "pallas" $OUT/spec_$p.txt; done
