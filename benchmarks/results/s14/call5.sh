#!/usr/bin/env bash
# s14 call 5: ncu of diffdock_l2's split uvw fused backward (registers, spills, DRAM bytes, stalls).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
OUT=$OUT/ops timeout 200 bash benchmarks/tools/ncu_ops.sh diffdock_l2 20000 > $OUT/ncu_ops.log 2>&1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tcache
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cat > /tmp/one.py <<'PY'
import torch, importlib
ops = importlib.import_module("generated.diffdock_l2.torch_ops")
n = 20000
x1, x2, g = (torch.randn(n, d, device="cuda") for d in (ops.DIM_IN1, ops.DIM_IN2, ops.DIM_OUT))
w = torch.randn(n, ops.WEIGHT_NUMEL, device="cuda")
ops.bwd_op(x1, x2, w, g); torch.cuda.synchronize()
torch.cuda.profiler.start(); ops.bwd_op(x1, x2, w, g); torch.cuda.synchronize(); torch.cuda.profiler.stop()
PY
timeout 200 "$NCU" --profile-from-start off -k regex:fused --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section LaunchStats --section Occupancy python3 /tmp/one.py > $OUT/ncu_fused.txt 2>&1
echo "ncu rc=$?"
tail -n 14 $OUT/ncu_ops.log
grep -E "^  [a-z_]+fused|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Stall|L1/TEX Hit|Mem Busy|Max Bandwidth|Local" $OUT/ncu_fused.txt | head -60
