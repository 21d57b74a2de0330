#!/usr/bin/env bash
# bash benchmarks/results/s10/radial_ncu.sh   (carry .whl)
set -u
if [ ! -f /tmp/site/.eqdsl_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  touch /tmp/site/.eqdsl_installed
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 330 "$NCU" -k "regex:conv_radial_fwd_0|conv_fwd_0" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  python3 benchmarks/results/s10/radial_ncu.py > "$OUT/radial_ncu.txt" 2>&1
echo "ncu rc $?"
grep -E "conv_|Duration|Throughput|Registers|Achieved Occupancy|Stall|Issued|Pipe|L2 Hit|Local|Block Size|Grid Size|Executed Ipc|Warp Cycles" "$OUT/radial_ncu.txt" | head -90
