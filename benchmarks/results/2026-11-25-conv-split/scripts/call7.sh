#!/usr/bin/env bash
# JAX conv, mace_large: the fused backward with x1 blocks split over kernels (pallas_conv_fused_max_terms).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ase-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
b() { timeout 170 python3 exp/blocks2.py mace_large $1 4 bulk,rand512x64,rand4096x32 2>&1 | grep -v -i warn | tee $R/$(basename $1).log | grep block_edges; echo "  t=$(( $(date +%s) - T0 ))"; }
b generated
b exp/fmt220
b exp/fmt130
b generated
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
