#!/usr/bin/env bash
# s16 call 2: JAX conv A/B, finer splits (pallas_conv_max_terms 70 / 48), num_warps 2 in float64, mace_large
# parts (one (node, kernel) grid launch) against the series of launches.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD AB_PKG=$PWD/exp/s16/abpkgs
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
AB_BUDGET=510 timeout 570 python3 exp/s16/conv_ab.py time > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -5
