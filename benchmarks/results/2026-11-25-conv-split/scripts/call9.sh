#!/usr/bin/env bash
# FMA contraction in the Pallas kernels: time with and without (PTX .rn dropped from mul/add/sub).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
for p in mace_large; do
  for m in "" --fma; do
    timeout 120 python3 exp/fma.py $p $m 2>&1 | grep -v -i warn | tee -a $R/fma.log | grep -E "fma=|rel err|Error|error|handlers|patched|NO pcr|def |triton"
    echo "  t=$(( $(date +%s) - T0 ))"
  done
done
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
