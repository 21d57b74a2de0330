#!/usr/bin/env bash
# s11's last device call: Nsight Compute on eqdsl JAX's float64 conv rows of conv64 that an anchor
# wins with no reason yet (the kernels only: the budget left no time for the anchors' side), on a
# fresh machine, most costly row first, until a 280 s deadline.
set -u
T0=$(date +%s); L=/tmp/ncu64; mkdir -p "$L" "${OUT:-/tmp/out}"
[ -d generated_twins ] || tar -xJf generated_twins.tar.xz
OUT=$L bash benchmarks/run_device.sh report=5 > "$L/install.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
for c in bulk:nequip_toluene:float64:fwd+bwd:eqdsl_jax rand4096x32:mace_large:float64:fwd:eqdsl_jax_irmul \
         bulk:nequip_toluene:float64:fwd:eqdsl_jax_irmul rand4096x32:mace_large:float64:fwd+bwd:eqdsl_jax_irmul; do
  left=$(( 280 - ($(date +%s) - T0) )); [ $left -lt 30 ] && { echo "$c: no time" >> "$L/run.log"; continue; }
  graph=${c%%:*}
  timeout $left python3 benchmarks/tools/ncu_rows.py --cases "${c#*:}" --conv "$graph" >> "$L/ncu.log" 2>&1
  echo "$c rc $? at $(( $(date +%s) - T0 )) s" >> "$L/run.log"
done
cp "$L/ncu.log" "$L/run.log" "${OUT:-/tmp/out}/"; grep -v "^ *[0-9.]* us .*\(Radix\|elementwise\|Fill\|fill_\|searchsorted\)" "$L/ncu.log" | tail -30; cat "$L/run.log"
