#!/usr/bin/env bash
# s17 call 4: call 3's bench_conv again with cuEquivariance's ops wheels carried whole (call 3's tar was
# still being written when carried: cuEquivariance ran without its CUDA ops there)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_cueq_xz/*.whl > /dev/null 2>&1
python3 -c "import tarfile; tarfile.open('.whl_cueq_xz/cueq_ops-0.13.0.tar.xz').extractall('/tmp/site', filter='fully_trusted')" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 200 python3 benchmarks/bench_conv.py --problems nequip_toluene --dtypes float64 --graphs bulk,rand4096x32 \
  --impls eqdsl_jax,eqdsl_torch,cueq,cueq_irmul --no-latency --time-budget 180 --json $OUT/bench_conv.json > $OUT/bench.log 2>&1
tail -n 14 $OUT/bench.log
