#!/usr/bin/env bash
# Session of 2026-12-07 (s20), device call 1: harness.sh conv64 (the float64 conv table), then the
# A/B of pallas_gather_slices (results/s19/tp_ab.py) on the problems its static counts were taken on
# and a memory-bound float32 one. Carry .whl .whl_cueq_xz .whl_oeq generated_twins.tar.xz.
T0=$(date +%s)
EQDSL_DEADLINE=${CONV64_DEADLINE:-400} bash benchmarks/harness.sh conv64
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
AB_PROBLEMS=${AB_PROBLEMS:-mace_large,nequip_toluene,nequip_benzene} AB_THREADS=14 OUT=$OUT \
  timeout $(( 585 - ($(date +%s) - T0) )) python3 benchmarks/results/s19/tp_ab.py > "$OUT/tp_ab.log" 2>&1
tail -n 8 "$OUT/tp_ab.log"
echo "call1: $(( $(date +%s) - T0 )) s"
