#!/usr/bin/env bash
# Issue 22, call 6: the first-call split: torch's first custom-op call vs eqdsl's kernels (cubins built on the GPU host's CPU)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
[ -f generated/mace_large/cubins/manifest.json ] || CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 > $OUT/build.log 2>&1
for i in 1 2; do
  TRITON_CACHE_DIR=/tmp/tc_a$i timeout 100 python3 exp/aot/profile_first.py > $OUT/first_plain_$i.log 2>&1; head -n 1 $OUT/first_plain_$i.log
  PREIMPORT=1 TRITON_CACHE_DIR=/tmp/tc_b$i timeout 100 python3 exp/aot/profile_first.py > $OUT/first_preimport_$i.log 2>&1; head -n 1 $OUT/first_preimport_$i.log
done
grep -m 30 "triton_launch\|jit.py\|build.py\|cubins" $OUT/first_preimport_2.log | cut -c1-170
