#!/usr/bin/env bash
# s18 call 2: Nsight Compute, full set, of the float64 conv forward: JAX (one launch of the 6 segment
# kernels, 4 edges per step) against torch (one Helion kernel), 114,688 random edges on 1,792 nodes
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 $NCU -k "regex:conv_float64_fwd" -c 1 --set full --import-source no \
  python3 benchmarks/tools/profile_conv.py nequip_toluene jax --dtype float64 > $OUT/ncu_jax.txt 2> $OUT/ncu_jax.err
echo "jax rc=$?"; date -u
timeout 200 $NCU -k "regex:_helion_conv_fwd" -c 1 --set full \
  python3 benchmarks/tools/profile_conv.py nequip_toluene torch --dtype float64 > $OUT/ncu_torch.txt 2> $OUT/ncu_torch.err
echo "torch rc=$?"; date -u
for f in jax torch; do echo "== $f"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|L1/TEX Hit|L2 Hit|Executed Instructions  |Block Limit Reg" $OUT/ncu_$f.txt | head -30; done
