#!/usr/bin/env bash
# s16 call 4: ncu of nequip_toluene's conv kernels (114,688 random edges), float64 torch and JAX (the new
# float64 family, 48 terms per kernel), then float32 JAX (140 terms).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
NCU_TIMEOUT=170 DTYPE=float64 OUT=$OUT/f64 bash benchmarks/tools/ncu_conv.sh nequip_toluene
NCU_TIMEOUT=120 DTYPE=float32 FRAMEWORKS=jax OUT=$OUT/f32 bash benchmarks/tools/ncu_conv.sh nequip_toluene
tail -3 $OUT/f64/*.err $OUT/f32/*.err | grep -iv warn | tail -8
