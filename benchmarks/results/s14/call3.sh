#!/usr/bin/env bash
# s14 call 3: the uvw fused backward with its tuned specs: same-call A/B against HEAD (d922ef0) and OEQ;
# then ncu_ops.sh (per-op times, DRAM bytes, registers, occupancy, spills) of both problems, fused op included.
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
run $ROOT new2 eqdsl_torch 90
OUT=$OUT/ncu timeout $(( 580 - ($(date +%s) - T0) )) bash benchmarks/tools/ncu_ops.sh $P 20000 > $OUT/ncu_ops.log 2>&1
echo "ncu done $(( $(date +%s) - T0 )) s"
for f in new old new2; do echo "== $f"; grep -E "^ *(diffdock_l2|e3tools_conv) +f(32|64)" $OUT/$f.log; done
tail -n 30 $OUT/ncu_ops.log
