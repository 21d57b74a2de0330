#!/usr/bin/env bash
# Diagnostics: JAX persistent-cache hits across processes; mace_large's fused Pallas backward (q_j form); ncu of JAX TP kernels.
set -u
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}
bash benchmarks/run_device.sh report=1 > /dev/null 2>&1   # installs the wheels
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jcdiag \
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== A: toluene alone; B: mace_large then toluene (cache from A)"
timeout 150 python3 exp/cachediag.py A nequip_toluene 2>&1 | grep -v -i "warn\|return rule" | tee $OUT/cachediag.log
timeout 150 python3 exp/cachediag.py B mace_large,nequip_toluene 2>&1 | grep -v -i "warn\|return rule" | tee -a $OUT/cachediag.log
echo "== t=$(( $(date +%s) - T0 ))"
unset JAX_COMPILATION_CACHE_DIR
echo "== fused backward variant"
for v in "generated base" "exp/fused fused"; do timeout 150 python3 exp/fmab.py mace_large $v 2>&1 | grep -E "TP20000|rel err|Error" | tee -a $OUT/fused.log; done
echo "== t=$(( $(date +%s) - T0 ))"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum,launch__grid_size,launch__block_size,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
for p in mace_large e3tools_conv nequip_benzene; do
  [ $(( $(date +%s) - T0 )) -gt 480 ] && break
  timeout 100 "$NCU" -k "regex:$p" --metrics "$M" --csv --page raw python3 exp/ncu_tp.py $p > $OUT/ncu_$p.csv 2> $OUT/ncu_$p.err
  echo "ncu $p rc=$? t=$(( $(date +%s) - T0 ))"
done
echo "total $(( $(date +%s) - T0 )) s"
