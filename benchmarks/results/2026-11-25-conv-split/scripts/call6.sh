#!/usr/bin/env bash
# JAX fused conv backward: warps sweep; ncu of mace_large's JAX conv kernels; this host's torch floor.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
R=$OUT/r; mkdir -p $R
timeout 60 python3 benchmarks/host_overhead.py --floor-only > $R/host_floor.log 2>&1; echo "== floor rc $?"; grep floor $R/host_floor.log | head -2
for p in mace_large nequip_toluene; do
  timeout 120 python3 exp/warps.py $p 2,8 2>&1 | grep -v -i warn | tee $R/warps_$p.log | grep warps; echo "  t=$(( $(date +%s) - T0 ))"
done
FRAMEWORKS=jax NCU_TIMEOUT=200 OUT=$R bash benchmarks/ncu_conv.sh mace_large > $R/ncu_conv.log 2>&1; echo "== ncu t=$(( $(date +%s) - T0 ))"; cat $R/ncu_conv.log | cut -c1-150
tar czf $OUT/r.tgz -C $OUT r
echo "total $(( $(date +%s) - T0 )) s"
