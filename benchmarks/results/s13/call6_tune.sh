#!/usr/bin/env bash
# Device probe (s13, call 6): mace_large's float64 fused TP backward at other rows / warps (per-dtype keys).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 -m eqdsl tune examples/specs/mace_large.toml --dtype float64 --ops bwd \
  --grid block_b=1,2,4 --grid num_warps=2,4,8 --workers 15 --timeout 300 > $OUT/tune_mace_large_bwd_float64.log 2>&1
echo "done $(( $(date +%s) - T0 )) s"
cat $OUT/tune_mace_large_bwd_float64.log | tail -25
