#!/usr/bin/env bash
# Issue 22, device call 4: CPU-built (Python 3.11) cubins on the GPU (Python 3.12); first calls with
# warm Python bytecode; then built on the GPU host (launchers shipped); small graph with the fused variant.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); S() { echo "== $1 rc $2 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/summary.log; }
date -u | tee $OUT/summary.log; python3 -c "import json;m=json.load(open('generated/mace_large/cubins/manifest.json'));print('manifest', m['triton'], m['archs'], len(m['groups']['sm_90']), 'variants')" | tee -a $OUT/summary.log
timeout 150 python3 benchmarks/tools/check_cubins.py generated/mace_large > $OUT/check_cubins_cpu.log 2>&1; S check_cubins_cpu_built $?
for i in 1 2; do timeout 100 python3 benchmarks/bench_startup.py --steps torch_cubins --timeout 90 --json $OUT/startup_cubins_cpu_$i.json > $OUT/startup_cubins_cpu_$i.log 2>&1; S cubins_cpu_$i $?; done
mv generated/mace_large/cubins /tmp/cubins_cpu
( time CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 ) > $OUT/build_gpuhost.log 2>&1; S build_gpuhost $?
timeout 100 python3 benchmarks/bench_startup.py --steps torch_cubins --timeout 90 --json $OUT/startup_cubins_gpuhost.json > $OUT/startup_cubins_gpuhost.log 2>&1; S cubins_gpuhost $?
TRITON_CACHE_DIR=/tmp/tc_sg timeout 200 python3 benchmarks/bench_small_graph.py --json $OUT/bench_small_graph.json > $OUT/small_graph.log 2>&1; S small $?
tail -n 8 $OUT/check_cubins_cpu.log; for f in $OUT/startup_cubins_*.log; do echo "-- $f"; tail -n 3 $f; done; tail -n 4 $OUT/build_gpuhost.log; tail -n 28 $OUT/small_graph.log; cat $OUT/summary.log
