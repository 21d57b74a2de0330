#!/usr/bin/env bash
# s16 call 1: JAX conv A/B: kernel sets split (pallas_conv_max_terms) and run as one (node, kernel) grid launch
# (launch.SEGMENT_PARTS) or in series; nequip_toluene and mace_large, float32/float64, rand512x64 and bulk Si.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false AB_PKG=$PWD/exp/s16/abpkgs
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
python3 -c "import jax; print(jax.__version__, jax.devices())"
t0=$(date +%s)
for i in 0 1 2 3 4 5 6 7; do timeout 260 python3 exp/s16/conv_ab.py compile $i 8 > $OUT/compile_$i.log 2>&1 & done; wait
echo "compile phase $(( $(date +%s) - t0 )) s"; cat $OUT/compile_*.log | grep -v "^compiled" | head -20; cat $OUT/compile_*.log | grep -c "^compiled"
AB_BUDGET=230 timeout 300 python3 exp/s16/conv_ab.py time > $OUT/time.log 2>&1
tail -60 $OUT/time.log
