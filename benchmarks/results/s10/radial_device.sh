#!/usr/bin/env bash
# conv_radial (issue 26) on the H100, one device call (2026-11-27): the committed mace_large
# package (atomic forward, fused radial backward) against rf @ wr + eqdsl conv and + cuEquivariance,
# then a sweep of the new options: segment = 1 (the forward's node scatter as a sorted segment
# reduction), materialize = 1 (the backward as the conv's fused backward at W = rf @ wr), max_terms.
#   bash benchmarks/results/s10/radial_device.sh     (carry .whl .whl_cueq_xz)
set -u
if [ ! -f /tmp/site/.eqdsl_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_cueq_xz/*.whl
  python3 -c "import tarfile; tarfile.open('.whl_cueq_xz/cueq_ops-0.13.0.tar.xz').extractall('/tmp/site', filter='fully_trusted')"
  touch /tmp/site/.eqdsl_installed
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
timeout 170 python3 benchmarks/tools/radial_torch_check.py --package generated > "$OUT/radial_base.log" 2>&1
echo "base rc $? $(( $(date +%s) - T0 )) s"
LEFT=$(( 560 - ($(date +%s) - T0) ))
timeout $LEFT python3 benchmarks/tools/radial_torch_check.py --sweep-budget-s $(( LEFT - 90 )) \
  --sweep 16:32:4:sbm64,16:16:8:sm64,16:16:8:sbm64,16:32:8:sdbm64,16:32:4:sm64 > "$OUT/radial_sweep.log" 2>&1
echo "sweep rc $? $(( $(date +%s) - T0 )) s"
grep -v "^\s*$" "$OUT/radial_base.log" | grep -iv "warn" | tail -n 25
tail -n 14 "$OUT/radial_sweep.log"
