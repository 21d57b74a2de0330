#!/usr/bin/env bash
# s14 call 2: eqdsl tune --write of the uvw fused backward (op bwd): float32 (tiles, stages), then float64's own keys.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
tune() {  # $1 problem, $2 dtype, $3 timeout, rest: grid
  local p=$1 d=$2 t=$3; shift 3
  left=$(( 585 - ($(date +%s) - T0) )); [ $t -gt $left ] && t=$left
  timeout $t python3 -m eqdsl tune examples/specs/$p.toml --dtype $d --ops bwd "$@" --workers 15 --timeout $(( t - 10 )) --write > $OUT/tune_${p}_$d.log 2>&1
  echo "tune $p $d rc=$? $(( $(date +%s) - T0 )) s"
  cp examples/specs/$p.toml $OUT/${p}_$d.toml
}
tune diffdock_l2 float32 170 --grid block_b=2,4 --grid block_c=32,64 --grid block_r=16,32,64 --grid num_stages=1,2 --grid num_warps=4
tune diffdock_l2 float64 110 --grid block_b=1,2,4 --grid num_warps=2,4 --grid num_stages=1,2
tune e3tools_conv float32 130 --grid block_b=2,4 --grid block_c=64 --grid block_r=32,64 --grid num_stages=1,2 --grid num_warps=4,8
tune e3tools_conv float64 110 --grid block_b=1,2,4 --grid num_warps=2,4 --grid num_stages=1,2
for f in $OUT/tune_*.log; do echo "== $f"; grep -B2 -A14 "<- best" $f | head -14; done
for p in diffdock_l2 e3tools_conv; do echo "== $p"; sed -n '/tuning.bwd\]/,$p' examples/specs/$p.toml; done
