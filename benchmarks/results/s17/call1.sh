#!/usr/bin/env bash
# s17 call 1: JAX conv segment loop: unroll / warps / edges per tile / step_sums
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
AB_BUDGET=${AB_BUDGET:-480} timeout 560 python3 exp/s17/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -5
