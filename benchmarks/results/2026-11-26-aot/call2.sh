#!/usr/bin/env bash
# Issue 22, device call 2: profile of the first calls with cubins; start-up JIT / family / JAX; small graph.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); S() { echo "== $1 rc $2 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/summary.log; }
date -u | tee $OUT/summary.log; ls generated/mace_large/cubins/ >> $OUT/summary.log 2>&1
if [ ! -d generated/mace_large/cubins ]; then CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 > $OUT/build.log 2>&1; S build $?; fi
TRITON_CACHE_DIR=/tmp/tc_prof EQDSL_CACHE_DIR=/tmp/eq_prof timeout 100 python3 -X importtime exp/aot/profile_first.py > $OUT/profile_first.log 2> $OUT/importtime.log; S profile $?
export TRITON_CACHE_DIR=/tmp/tc EQDSL_CACHE_DIR=/tmp/eqc JAX_COMPILATION_CACHE_DIR=/tmp/jc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 290 python3 benchmarks/bench_startup.py --steps torch_jit,family,jax --jobs 3 --timeout 270 --json $OUT/startup.json > $OUT/startup.log 2>&1; S startup $?
timeout 140 python3 benchmarks/bench_small_graph.py > $OUT/small_graph.log 2>&1; S small $?
sort -t'|' -k2 -n $OUT/importtime.log 2>/dev/null | tail -n 25 > $OUT/importtime_top.log; rm -f $OUT/importtime.log
head -n 60 $OUT/profile_first.log; tail -n 14 $OUT/startup.log; tail -n 30 $OUT/small_graph.log; cat $OUT/summary.log
