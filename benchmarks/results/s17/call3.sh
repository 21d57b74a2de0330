#!/usr/bin/env bash
# s17 call 3: (a) more segment-kernel configs (float64 nequip_toluene, three graphs); (b) bench_conv, nequip_toluene
# float64 with the spec's pallas_segment_edges_float64 = 4 against cuEquivariance (both layouts), same run
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_cueq_xz/*.whl > /dev/null 2>&1
python3 -c "import tarfile; tarfile.open('.whl_cueq_xz/cueq_ops-0.13.0.tar.xz').extractall('/tmp/site', filter='fully_trusted')"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
AB_BUDGET=150 AB_CASES='[["nt","bulk","float64",1,4,4],["nt","bulk","float64",1,4,8],["nt","rand512x64","float64",1,2,2],["nt","rand512x64","float64",1,4,8],["nt","rand4096x32","float64",1,4,1],["nt","rand4096x32","float64",1,4,4]]' \
  timeout 200 python3 exp/s17/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -3
date -u
timeout 330 python3 benchmarks/bench_conv.py --problems nequip_toluene --dtypes float64 --graphs bulk,rand512x64,rand4096x32 \
  --impls eqdsl_jax,eqdsl_torch,cueq,cueq_irmul --no-latency --time-budget 300 --json $OUT/bench_conv.json > $OUT/bench.log 2>&1
tail -n 40 $OUT/bench.log
