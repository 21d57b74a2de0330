#!/usr/bin/env bash
# Device probe (s13, call 3): nequip_toluene's fused TP backward at block_c 32, both dtypes, one call.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
G="--grid block_b=2,4,8 --grid block_c=32 --grid num_warps=2,4"
for dt in float32 float64; do
  timeout 200 python3 -m eqdsl tune examples/specs/nequip_toluene.toml --dtype $dt --ops bwd $G --workers 7 --timeout 180 > $OUT/tune_tol_$dt.log 2>&1 &
done
wait
echo "done $(( $(date +%s) - T0 )) s"
for dt in float32 float64; do echo "== $dt"; grep -v "^\[" $OUT/tune_tol_$dt.log | head -14; done
