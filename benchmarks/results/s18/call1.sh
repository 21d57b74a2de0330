#!/usr/bin/env bash
# s18 call 1: Triton num_stages of the JAX conv's segment kernels (software pipelining of the edge loop's
# gathers); then eqdsl tune --ops pallas_conv on the GPU (its first run there)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
export AB_CASES='[["nt","bulk","float64",1,4,4,false,1],["nt","bulk","float64",1,4,4,false,2],["nt","bulk","float64",1,4,4,false,3],
["nt","bulk","float32",1,4,null,false,1],["nt","bulk","float32",1,4,null,false,2],["nt","bulk","float32",1,4,null,false,3],
["ml","bulk","float64",1,4,null,false,1],["ml","bulk","float64",1,4,null,false,2],
["ml","bulk","float32",1,4,null,false,1],["ml","bulk","float32",1,4,null,false,2],
["nt","rand4096x32","float64",1,4,4,false,1],["nt","rand4096x32","float64",1,4,4,false,3]]'
AB_BUDGET=270 timeout 300 python3 exp/s18/conv_ab.py > $OUT/time.log 2>&1
grep "^|" $OUT/time.log; grep -v "^|\|^{" $OUT/time.log | tail -5
date -u
timeout 250 python3 -m eqdsl tune examples/specs/nequip_toluene.toml --ops pallas_conv --dtype float64 --batch 114688 \
  --grid pallas_segment_edges=2,4 --grid pallas_conv_max_terms=48,72 --workers 4 --timeout 200 > $OUT/tune.log 2>&1
tail -n 20 $OUT/tune.log; date -u
