#!/usr/bin/env bash
# s18 call 4: same-call A/B of the JAX conv: HEAD's packages (old/: mul_ir conv kernels) against the
# working tree's (conv kernels on ir_mul rows, columns permuted by jax_ops.conv); err: new against old
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
export AB_CASES='[["nto","bulk","float64"],["nt","bulk","float64"],["nt","bulk","float64",1,4,2],
["nto","bulk","float32"],["nt","bulk","float32"],
["mlo","bulk","float64"],["ml","bulk","float64"],["ml","bulk","float64",1,4,4],["mlo","bulk","float32"],["ml","bulk","float32"],
["nto","rand512x64","float64"],["nt","rand512x64","float64"],["nt","rand512x64","float64",1,4,2],
["nto","tiny","float32"],["nt","tiny","float32"],["nt","bulk","float32",1,4,4]]'
AB_BUDGET=420 timeout 470 python3 exp/s18/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -5
