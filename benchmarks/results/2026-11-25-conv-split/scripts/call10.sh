#!/usr/bin/env bash
# pallas_fma = 1 (the kernels' sums as inline-PTX fma.rn chains) against the committed kernels.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
for p in mace_large nequip_toluene; do
  timeout 120 python3 exp/fmab.py $p generated base 2>&1 | grep -v -i warn | tee -a $R/fmab.log | grep -E "TP20000|rel err|Error"
  timeout 150 python3 exp/fmab.py $p exp/fma1 fma 2>&1 | grep -v -i warn | tee -a $R/fmab.log | grep -E "TP20000|rel err|Error|error"
  echo "  t=$(( $(date +%s) - T0 ))"
done
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
