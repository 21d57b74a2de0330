#!/usr/bin/env bash
# s18 call 3: the JAX conv on ir_mul rows (benchmarks/layout_twins.py packages of the same specs) against
# mul_ir: the mul_ir kernels split each x1 tile on chip (84 layout conversions per loop step, float64 fwd)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
export AB_CASES='[["nt","bulk","float64",1,4,4],["nti","bulk","float64",1,4,4],["nti","bulk","float64",1,4,2],["nti","bulk","float64",1,4,8],
["nt","bulk","float32"],["nti","bulk","float32"],
["ml","bulk","float64"],["mli","bulk","float64"],["ml","bulk","float32"],["mli","bulk","float32"],
["nt","rand512x64","float64",1,4,4],["nti","rand512x64","float64",1,4,4],["nt","rand4096x32","float64",1,4,4],["nti","rand4096x32","float64",1,4,4],
["nt","tiny","float32"],["nti","tiny","float32"]]'
AB_BUDGET=450 timeout 500 python3 exp/s18/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -5
