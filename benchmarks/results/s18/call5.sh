#!/usr/bin/env bash
# s18 call 5: call 4's A/B with the column permutation as fused block transposes (was a column gather),
# nequip_toluene at 2 float64 edges per step (spec)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
export AB_CASES='[["nto","bulk","float64"],["nt","bulk","float64"],["mlo","bulk","float64"],["ml","bulk","float64"],
["nto","tiny","float32"],["nt","tiny","float32"],["nto","bulk","float32"],["nt","bulk","float32"]]'
AB_BUDGET=150 timeout 190 python3 exp/s18/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -3
