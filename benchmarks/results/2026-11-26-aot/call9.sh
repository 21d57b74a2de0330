#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
date -u
A="--impls torch_graph,torch_compile_graph --steps 20 --warmup 3 --no-host"
echo "== old tree (custom_op)"; (cd exp/old && PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tc_o timeout 150 python3 benchmarks/bench_small_graph.py $A --json /tmp/o.json 2>&1 | grep -v "Assertion\|warn" | tail -n 8)
echo "== new tree, blocking"; PYTHONPATH=/tmp/site:$PWD CUDA_LAUNCH_BLOCKING=1 TRITON_CACHE_DIR=/tmp/tc_n timeout 200 python3 benchmarks/bench_small_graph.py $A --json /tmp/n.json > /tmp/n.log 2>&1; echo rc $?; grep -v "Assertion" /tmp/n.log | grep -B2 -A40 "Traceback" | head -80
echo "== new tree, eager first"; PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tc_n timeout 150 python3 benchmarks/bench_small_graph.py --impls torch_eager,torch_graph,torch_compile_graph --steps 20 --warmup 3 --no-host --json /tmp/n2.json 2>&1 | grep -v "Assertion\|warn" | tail -n 8
