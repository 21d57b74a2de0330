#!/usr/bin/env bash
# s14 call 1: the uvw fused backward (diffdock_l2, e3tools_conv): same-call A/B against HEAD and OEQ, then eqdsl tune of op bwd.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
. benchmarks/tools/oeq_env.sh > /dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
ROOT=$PWD
P=diffdock_l2,e3tools_conv
run() {  # $1 tree, $2 label, $3 impls, $4 timeout
  (cd $1 && PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache_$2 timeout $4 python3 benchmarks/bench_tp.py --problems $P \
     --batch 20000 --impls $3 --directions fwd,fwd+bwd --dtypes float32,float64 --time-budget $(( $4 - 20 )) --json $OUT/$2.json > $OUT/$2.log 2>&1)
  echo "$2 done $(( $(date +%s) - T0 )) s"
}
run $ROOT new eqdsl_torch,oeq 200
run $ROOT/exp/ab/old old eqdsl_torch 90
export PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache
G="--grid block_b=2,4,8 --grid block_c=16,32,64 --grid block_r=16,32 --grid num_warps=4,8"
for p in diffdock_l2 e3tools_conv; do
  left=$(( 570 - ($(date +%s) - T0) )); [ $left -lt 60 ] && break
  t=$(( left / 2 )); [ $p = e3tools_conv ] && t=$left
  timeout $t python3 -m eqdsl tune examples/specs/$p.toml --dtype float32 --ops bwd $G --workers 15 --timeout $(( t - 10 )) > $OUT/tune_$p.log 2>&1
  echo "tune $p $(( $(date +%s) - T0 )) s"
done
for f in new old; do echo "== $f"; grep -E "^ *(diffdock_l2|e3tools_conv) +f(32|64)" $OUT/$f.log; done
for p in diffdock_l2 e3tools_conv; do echo "== tune $p"; tail -n 25 $OUT/tune_$p.log; done
