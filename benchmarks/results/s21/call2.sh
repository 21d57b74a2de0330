#!/usr/bin/env bash
# Session of 2026-12-07 (s21, 16:47 UTC on), device call 2, on call 1's machine (harness.sh conv64): the
# small-graph torch conv's host time layer by layer (the latency table's fwd+bwd row that
# OpenEquivariance wins, unprofiled in s20), then Nsight Compute of every lost row, the
# explained ones too (NCU_ALL=1), on the current kernels. Same carry as the harness.
T0=$(date +%s)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
timeout 70 python3 benchmarks/tools/host_breakdown.py --problem mace_large > "$OUT/host_breakdown.log" 2>&1
echo "host_breakdown rc $? at $(( $(date +%s) - T0 )) s"
timeout 50 python3 benchmarks/tools/profile_small.py --problems mace_large --cprofile 12 > "$OUT/profile_small.log" 2>&1
echo "profile_small rc $? at $(( $(date +%s) - T0 )) s"
EQDSL_DEADLINE=$(( 580 - ($(date +%s) - T0) )) NCU_ALL=1 bash benchmarks/tools/ncu_missing.sh > "$OUT/ncu_call.log" 2>&1
tail -n 30 "$OUT/run.log"; tail -n 25 "$OUT/host_breakdown.log"
echo "call2: $(( $(date +%s) - T0 )) s"
