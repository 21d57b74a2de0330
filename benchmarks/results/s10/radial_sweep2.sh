#!/usr/bin/env bash
# conv_radial (issue 26), second call (2026-11-27): edges per step and tf32x3 dots with the segment
# forward, and the fused radial backward without spills, against rf @ wr + conv in the same run.
#   bash benchmarks/results/s10/radial_sweep2.sh     (carry .whl)
set -u
if [ ! -f /tmp/site/.eqdsl_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  touch /tmp/site/.eqdsl_installed
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 570 python3 benchmarks/tools/radial_torch_check.py --sweep-budget-s 470 \
  --sweep 16:32:4:sbm64,32:32:8:sbm64,16:32:4:sdbm64,32:32:8:sdbm64,16:16:8:sm64 > "$OUT/radial_sweep2.log" 2>&1
echo "sweep rc $?"
grep -v "^\s*$" "$OUT/radial_sweep2.log" | grep -v "Warning\|warn(" | tail -n 22
