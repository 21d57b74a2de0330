#!/usr/bin/env bash
# Session of 2026-12-07 (s21), device call 3, on calls 1-2's machine: Nsight Compute of the four
# float64 conv rows call 2 had no time for (its cases 22-25), until 190 s.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache XLA_PYTHON_CLIENT_PREALLOCATE=false
export NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); T0=$(date +%s); i=21
for c in "bulk:mace_large:float64:fwd+bwd:eqdsl_jax_irmul,cueq_irmul" "rand4096x32:mace_large:float64:fwd+bwd:eqdsl_jax_irmul,cueq_irmul" "rand4096x32:mace_large:float64:fwd:eqdsl_jax_irmul,oeq" "rand4096x32:nequip_toluene:float64:fwd:eqdsl_jax_irmul,oeq"; do
  i=$((i+1)); left=$((190 - ($(date +%s) - T0))); [ $left -lt 30 ] && break
  timeout $left python3 benchmarks/tools/ncu_rows.py --cases "${c#*:}" --conv "${c%%:*}" --json "$OUT/ncu_$i.json" >> "$OUT/ncu3.log" 2>&1
  echo "case $i $c rc $? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/run3.log"
done
tail -n 30 "$OUT/ncu3.log"
