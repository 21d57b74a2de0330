#!/usr/bin/env bash
# s15 call 5: A/B of the fused uvw backward's x1-side form (one lane sum per x1 component where a path has fewer
# than output components) against the committed kernels (one per output component), per op, both dtypes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv,e3tools_conv_x1,diffdock_l2,diffdock_l2_x1 \
  --dtypes float32,float64 > $OUT/ops.log 2>&1
grep "^| .*fused\|^| .*forward" $OUT/ops.log
