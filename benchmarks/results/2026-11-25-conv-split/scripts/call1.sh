#!/usr/bin/env bash
# JAX conv: pallas_max_terms variants x segment warps, bulk Si graph (H100).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl .whl/e3nn_jax-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
run() {  # label problem dir
  timeout 170 python3 benchmarks/gpu_jax_conv_blocks.py --problems $2 --graphs bulk --blocks 2 --warps 8 --generated $3 > $R/$1.log 2>&1
  echo "== $1 rc $? t=$(( $(date +%s) - T0 ))"; grep -E "seg_block=" $R/$1.log | sed 's/^/   /'
  tail -2 $R/$1.log | grep -i error
}
run mace_base mace_large generated
run mace_mt72 mace_large exp/mt72
run mace_mt36 mace_large exp/mt36
run tol_base nequip_toluene generated
run tol_mt46 nequip_toluene exp/mt46
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
