#!/usr/bin/env bash
# s15 call 2: per-op times of the Pallas kernels (fused uvw backward against the three it replaces), ncu of them,
# and the fused kernel with its channel loops unrolled by 4 (an experiment: the generated file edited on the device).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv,diffdock_l2 --dtypes float32 \
  --block-batch 8,16 --num-warps 4 > $OUT/ops_f32.log 2>&1
echo "ops f32 $(( $(date +%s) - T0 )) s"
timeout 100 python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv,diffdock_l2 --dtypes float64 \
  --block-batch 8 --num-warps 4 > $OUT/ops_f64.log 2>&1
echo "ops f64 $(( $(date +%s) - T0 )) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 "$NCU" -k regex:e3tools --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section LaunchStats --section Occupancy \
  python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv --dtypes float32 --block-batch 16 --num-warps 4 --ncu \
  > $OUT/ncu_e3tools.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s"
sed -i 's/^\(.*lax\.fori_loop(0, [0-9]*, _block_[0-9]*, .*)\))$/\1, unroll=4)/' generated/e3tools_conv/pallas_kernels.py
grep -c "unroll=4)" generated/e3tools_conv/pallas_kernels.py
left=$(( 580 - ($(date +%s) - T0) ))
timeout $left python3 benchmarks/tools/profile_jax_ops.py --problems e3tools_conv --dtypes float32 \
  --block-batch 8,16 --num-warps 4 > $OUT/ops_unroll.log 2>&1
echo "unroll $(( $(date +%s) - T0 )) s"
for f in ops_f32 ops_f64 ops_unroll; do echo "== $f"; grep "^| e3\|^| diff" $OUT/$f.log; done
grep -E "_tp_|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Local|Warp Cycles Per Issued|Block Limit Reg|Theoretical Occ" $OUT/ncu_e3tools.txt | head -80
