#!/usr/bin/env bash
# Issue 22, device call 1: build cubins on the host CPU (GPU hidden), first calls with them,
# no-compile check, CPU-vs-GPU lowering check, GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); S() { echo "== $1 rc $2 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/summary.log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; nproc
  python3 -c "import sys,triton,torch;print(sys.version.split()[0], 'triton', triton.__version__, 'torch', torch.__version__)"; } | tee $OUT/summary.log
export TRITON_CACHE_DIR=/tmp/tc_build
( time CUDA_VISIBLE_DEVICES= python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 ) > $OUT/build.log 2>&1; S build $?
unset TRITON_CACHE_DIR
timeout 100 python3 benchmarks/bench_startup.py --steps torch_cubins --timeout 90 --json $OUT/startup_cubins.json > $OUT/startup_cubins.log 2>&1; S cubins $?
timeout 150 python3 benchmarks/tools/check_cubins.py generated/mace_large > $OUT/check_cubins.log 2>&1; S check_cubins $?
export TRITON_CACHE_DIR=/tmp/tc EQDSL_CACHE_DIR=/tmp/eqc
(timeout 240 python3 benchmarks/tools/check_lowering.py mace_large --dtypes float32 > $OUT/lowering.log 2>&1; S lowering $?) &
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA -m gpu tests/test_cuda_graphs.py tests/test_triton_launch.py > $OUT/gputests.log 2>&1; S gputests $?
wait
echo; tail -n 15 $OUT/build.log; tail -n 12 $OUT/startup_cubins.log; tail -n 25 $OUT/check_cubins.log; tail -n 15 $OUT/lowering.log; tail -n 30 $OUT/gputests.log; cat $OUT/summary.log
