#!/usr/bin/env bash
# s14 call 4: diffdock_l2's fused backward spilled (ncu, call 3: 255 registers, 720 K local loads): split it by x1 block
# (max_terms; each path's weights still read once), eqdsl tune --write float32 then float64; then the rows.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
tune() {  # $1 dtype, $2 timeout, rest: grid
  local d=$1 t=$2; shift 2
  timeout $t python3 -m eqdsl tune examples/specs/diffdock_l2.toml --dtype $d --ops bwd "$@" --workers 15 --timeout $(( t - 10 )) --write > $OUT/tune_$d.log 2>&1
  echo "tune $d rc=$? $(( $(date +%s) - T0 )) s"
  cp examples/specs/diffdock_l2.toml $OUT/diffdock_l2_$d.toml
}
tune float32 190 --grid max_terms=16,70,140 --grid block_b=2,4 --grid block_c=32,64 --grid block_r=16,32 --grid num_warps=4
tune float64 100 --grid block_b=1,2 --grid num_warps=2,4
timeout 120 python3 benchmarks/bench_tp.py --problems diffdock_l2 --batch 20000 --impls eqdsl_torch --directions fwd,fwd+bwd \
  --dtypes float32,float64 --time-budget 100 --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "bench $(( $(date +%s) - T0 )) s"
for d in float32 float64; do echo "== $d"; grep -A10 "<- best" $OUT/tune_$d.log | head -10; done
sed -n '/tuning.bwd\]/,$p' examples/specs/diffdock_l2.toml
grep -E "^ *diffdock_l2 +f(32|64)" $OUT/bench.log
