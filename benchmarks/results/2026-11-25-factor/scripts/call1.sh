#!/usr/bin/env bash
# Factored Pallas sums + exact coefficients (exp/new) and pallas_fma on every problem (exp/fma) against the committed kernels.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $R/gpu.txt
run() { # prob gen tag
  if [ $(( $(date +%s) - T0 )) -gt 545 ]; then echo "skip $1 $3"; return; fi
  timeout 110 python3 exp/fmab.py $1 $2 $3 2>&1 | grep -v -i warn | tee -a $R/fmab.log | grep -E "TP20000|rel err|Error|error"
}
for p in mace_large nequip_toluene; do run $p generated base; run $p exp/new new; done
for p in e3tools_conv nequip_water nequip_benzene sevennet_l3i5 nequix_main diffdock_l2 mace_medium nequip_aspirin tetris_poly_1; do
  run $p generated base; run $p exp/new new; run $p exp/fma fma
  echo "  t=$(( $(date +%s) - T0 ))"
done
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
