#!/usr/bin/env bash
# JAX: fused conv backward split per x1 block (pallas_max_terms), TP timings of the variants, latency parts.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl .whl/e3nn_jax-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
conv() {  # label problem dir
  timeout 150 python3 benchmarks/gpu_jax_conv_blocks.py --problems $2 --graphs bulk --blocks 4 --generated $3 > $R/$1.log 2>&1
  echo "== $1 rc $? t=$(( $(date +%s) - T0 ))"; grep -E "seg_block=" $R/$1.log | sed 's/^/   /'
  tail -2 $R/$1.log | grep -i error
}
tp() {  # label problem dir
  timeout 120 python3 benchmarks/bench_tp.py --problems $2 --impls eqdsl_jax --batch 20000 --dtypes float32 --generated $3 --json $R/tp_$1.json > $R/tp_$1.log 2>&1
  echo "== tp $1 rc $? t=$(( $(date +%s) - T0 ))"; grep -E "eqdsl_jax" $R/tp_$1.log | head -4 | sed 's/^/   /'
}
conv mace_mt72f mace_large exp/mt72f
conv tol_mt46f nequip_toluene exp/mt46
conv tol_mt140 nequip_toluene exp/mt140
tp mace_base mace_large generated
tp mace_mt72 mace_large exp/mt72
tp mace_mt72f mace_large exp/mt72f
tp tol_base nequip_toluene generated
tp tol_mt46 nequip_toluene exp/mt46
timeout 60 python3 benchmarks/gpu_jax_conv_parts.py --problems mace_large --graphs latency > $R/parts_latency.log 2>&1
echo "== parts rc $?"; tail -25 $R/parts_latency.log
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
