#!/usr/bin/env bash
# Issue 22, call 8: the final tree (operators via torch.library.Library): GPU tests, first calls with cubins, host overhead.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); S() { echo "== $1 rc $2 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/summary.log; }
date -u | tee $OUT/summary.log
( CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 ) > $OUT/build.log 2>&1; S build $?
timeout 100 python3 benchmarks/bench_startup.py --steps torch_cubins --timeout 90 --json $OUT/startup_cubins.json > $OUT/startup_cubins.log 2>&1; S cubins $?
TRITON_CACHE_DIR=/tmp/tc_p timeout 100 python3 exp/aot/profile_first.py > $OUT/first_plain.log 2>&1; S first $?
TRITON_CACHE_DIR=/tmp/tc_sg timeout 150 python3 benchmarks/bench_small_graph.py --impls torch_graph,torch_compile_graph,torch_conv_fwd_bwd --json $OUT/bench_small_graph.json > $OUT/small_graph.log 2>&1; S small $?
export TRITON_CACHE_DIR=/tmp/tc EQDSL_CACHE_DIR=/tmp/eqc
timeout 200 python3 -m pytest -q -p no:cacheprovider -rA -m gpu tests/test_cuda_graphs.py tests/test_triton_launch.py > $OUT/gputests.log 2>&1; S gputests $?
tail -n 3 $OUT/startup_cubins.log; head -n 1 $OUT/first_plain.log; tail -n 22 $OUT/small_graph.log; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gputests.log | tail -12; cat $OUT/summary.log
