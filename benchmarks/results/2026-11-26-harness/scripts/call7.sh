#!/usr/bin/env bash
# ncu of the JAX tensor-product kernels of diffdock_l2 and nequip_benzene (20,000 rows, fwd and fwd+bwd, two calls each).
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,launch__grid_size,launch__block_size,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
for p in diffdock_l2 nequip_benzene; do
  timeout 150 "$NCU" -k "regex:$p" --metrics "$M" --csv --page raw python3 exp/ncu_tp.py $p > $OUT/ncu_$p.csv 2> $OUT/ncu_$p.err
  echo "ncu $p rc=$? t=$(( $(date +%s) - T0 ))"
done
