#!/usr/bin/env bash
# s15 call 1: the Pallas uvw fused backward (diffdock_l2, e3tools_conv, JAX): same-call A/B against HEAD (b561884),
# e3nn-jax and OEQ beside; then eqdsl tune --ops pallas (block_batch x num_warps) float32 and float64, --write.
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
run $ROOT new eqdsl_jax,e3nn_jax,oeq 170
run $ROOT/exp/ab/old old eqdsl_jax 100
export PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache
G="--grid pallas_block_batch=2,4,8,16,32 --grid pallas_num_warps=4,8"
for d in float32 float64; do
  for p in e3tools_conv diffdock_l2; do
    left=$(( 575 - ($(date +%s) - T0) )); [ $left -lt 40 ] && break
    t=$(( left / 2 )); [ $d = float64 ] && [ $p = diffdock_l2 ] && t=$left
    [ $d = float32 ] && t=$(( left / 3 ))
    timeout $t python3 -m eqdsl tune examples/specs/$p.toml --dtype $d --ops pallas $G --workers 15 --timeout $(( t - 10 )) --write > $OUT/tune_${p}_$d.log 2>&1
    echo "tune $p $d $(( $(date +%s) - T0 )) s"
  done
done
mkdir -p $OUT/specs; cp examples/specs/diffdock_l2.toml examples/specs/e3tools_conv.toml $OUT/specs/
for f in new old; do echo "== $f"; grep -E "^ *(diffdock_l2|e3tools_conv) +f(32|64)" $OUT/$f.log; done
for f in $OUT/tune_*.log; do echo "== $f"; tail -n 16 $f; done
