#!/usr/bin/env bash
# ncu warp-state (stall reasons) and instruction stats: mace_large's JAX fused conv backward kernel 2,
# the JAX forward kernel 0, and torch's fused conv backward, one launch each.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
R=$OUT/r; mkdir -p $R
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
S="--section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis"
timeout 200 $NCU -k regex:'conv_conv_bwd_fused_kernel_2|conv_conv_fwd_kernel_0' -c 2 $S python3 benchmarks/profile_conv.py mace_large jax > $R/ncu_jax_details.txt 2> $R/ncu_jax.err
echo "== jax rc $? t=$(( $(date +%s) - T0 ))"
timeout 250 $NCU -k regex:'conv_bwd_fused' -c 1 $S python3 benchmarks/profile_conv.py mace_large torch > $R/ncu_torch_details.txt 2> $R/ncu_torch.err
echo "== torch rc $? t=$(( $(date +%s) - T0 ))"
for f in $R/ncu_jax_details.txt $R/ncu_torch_details.txt; do
  echo "### $f"; grep -E "^  [a-z_]+.*\(|Stall|Warp Cycles|Issue|Registers|Achieved Occupancy|Executed Ipc|Duration|Memory Throughput|L1/TEX Hit|L2 Hit|Local|Theoretical Occ|Block Limit|One or More|No Eligible|Active Warps" $f | head -60
done
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
