#!/usr/bin/env bash
# Device probe (s13): fused TP backward configs for the spilling rows, against OEQ in the same call.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
. benchmarks/tools/oeq_env.sh > /dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
# OEQ + eqdsl reference rows (OEQ's extension builds here, ~30-60 s)
[ -n "${REF:-}" ] && timeout 220 python3 benchmarks/bench_tp.py --problems nequip_toluene,nequix_main --batch 20000 --impls eqdsl_torch,oeq \
    --directions fwd+bwd --dtypes float32,float64 --time-budget 170 --json $OUT/ref.json > $OUT/ref.log 2>&1; echo "ref done $(( $(date +%s) - T0 )) s"
G="--grid block_b=2,4,8 --grid block_c=16,32,64 --grid num_warps=2,4,8"
timeout 250 python3 -m eqdsl tune examples/specs/nequip_toluene.toml --dtype float64 --ops bwd $G --workers 14 --timeout 240 > $OUT/tune_tol64.log 2>&1
echo "tol64 $(( $(date +%s) - T0 )) s"
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m eqdsl tune examples/specs/nequix_main.toml --dtype float32 --ops bwd --grid block_b=4,8,16 --grid block_c=16,32,64 --grid num_warps=4,8 --workers 15 --timeout 200 > $OUT/tune_nqx.log 2>&1
echo "nqx $(( $(date +%s) - T0 )) s"
tail -n 40 $OUT/tune_tol64.log; tail -n 30 $OUT/tune_nqx.log; grep -E "nequip_toluene|nequix_main" $OUT/ref.log | tail -8
