#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); S() { echo "== $1 rc $2 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/summary.log; }
date -u | tee $OUT/summary.log
if [ ! -f generated/mace_large/cubins/manifest.json ]; then CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 > $OUT/build.log 2>&1; S build $?; fi
TRITON_CACHE_DIR=/tmp/tc_prof2 timeout 100 python3 exp/aot/profile_first.py > $OUT/profile_first.log 2>&1; S profile_first $?
TRITON_CACHE_DIR=/tmp/tc3 timeout 200 python3 exp/aot/profile_host.py > $OUT/profile_host.log 2>&1; S profile_host $?
head -n 70 $OUT/profile_first.log | cut -c1-180; cat $OUT/profile_host.log | cut -c1-200; cat $OUT/summary.log
