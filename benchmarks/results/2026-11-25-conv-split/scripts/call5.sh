#!/usr/bin/env bash
# JAX conv on bulk Si: per-edge block sweep and pallas_conv_max_terms variants.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
b() { timeout 150 python3 exp/blocks2.py $1 $2 $3 2>&1 | grep -v -i warn | tee $R/$(basename $2)_$1.log | grep block_edges; echo "  t=$(( $(date +%s) - T0 ))"; }
b mace_large generated 4,2,8,16
b mace_large exp/cmt36 4,8
b mace_large exp/cmt144 4,8
b nequip_toluene generated 4,2,8,16
b nequip_toluene exp/cmt92 4,8
b nequip_toluene exp/cmt274 4,8
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
