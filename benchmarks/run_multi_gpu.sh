#!/usr/bin/env bash
# The multi-GPU checks and the weak-scaling benchmark (bench_scaling.py) in one device call
# on a machine with 2 GPUs (nvidia-h100-x2):
#
#   bash benchmarks/run_multi_gpu.sh [--dry-run] [STEP...]      (default: prep torch jax)
#
#   prep   four jobs at once, none of them timed (all compile): precompile.py for mace_large
#          float32, every torch op (conv and tensor product, second order included: 11 jobs);
#          the GPU tests (pytest -m gpu tests/test_torch_device.py tests/test_jax_sharding.py;
#          the latter has no gpu-marked test: its checks run on forced CPU devices, hence
#          jaxcheck); jaxcheck, an inline check on 2 GPUs of generated/nequip_water float32:
#          jax.shard_map with the default check_vma=True of tensor_product and conv, forward and
#          gradients, against the unsharded op, and jax.jit on batch-sharded inputs with no
#          all-gather in the compiled HLO (OK/FAIL lines); jaxwarm, bench_scaling.py --framework
#          jax --warm-only, which compiles the timed run's JAX steps into JAX's persistent cache
#   torch  bench_scaling.py --framework torch (DDP, NCCL), nothing else running
#   jax    bench_scaling.py --framework jax (shard_map + pmean), nothing else running
#
# Each step runs under `timeout`, its limit what the call's deadline (EQDSL_DEADLINE, default
# 585 s from the start) leaves after the reserves of the steps after it (EQDSL_TORCH_RESERVE,
# default 230 s, kept by prep for torch and jax; EQDSL_JAX_RESERVE, default 100 s, kept by
# torch for jax). EQDSL_SCALING_ARGS adds arguments to every bench_scaling.py call (e.g.
# "--atoms 1024 --reps 30"). Logs go to $EQDSL_LOG_DIR (default /tmp/eqdsl_multi_gpu_logs),
# packed at the end into $OUT/multi_gpu_logs.tar.gz; $OUT also gets bench_scaling.json and
# summary.txt (three files: the device tool returns at most 8). The summary is printed last:
# each step's exit status and seconds, the checks' lines, the Markdown table.
#
# Installs the carried wheels (.whl: helion, e3nn-jax, ase, filecheck, ...) into /tmp/site
# once per machine, as run_device.sh does (cuEquivariance is not needed). Caches as there:
# Helion's modules in /tmp/eqcache, Triton's binaries in /tmp/tcache, JAX's executables in
# /tmp/jaxcache; they stay while the machine is warm. NCCL_* variables are left as the
# machine sets them.
#
# --dry-run: the same steps on this CPU machine with the current python3 (no install, caches
# and OUT in a temp dir unless OUT is set): precompile.py --list instead of compiling, the
# pytest line (its gpu tests skip), jaxcheck on 2 forced XLA host devices with
# check_vma=False (Pallas interpret mode cannot run under check_vma=True) and small sizes,
# bench_scaling.py --quick for jaxwarm, torch and jax. About 3 minutes on 2 cores.
set -u
T0=$(date +%s)
DRY=0
steps=()
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    prep|torch|jax) steps+=("$a") ;;
    *) echo "unknown argument $a (steps: prep torch jax; --dry-run)"; exit 2 ;;
  esac
done
[ ${#steps[@]} -eq 0 ] && steps=(prep torch jax)
cd "$(dirname "$0")/.." || exit 1

if [ $DRY = 0 ]; then
  if [ ! -f /tmp/site/.eqdsl_multi_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    touch /tmp/site/.eqdsl_multi_installed
  fi
  PY=python3
  export PYTHONPATH=/tmp/site:$PWD EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache \
    JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
  OUT=${OUT:-/tmp/out}
  QUICK=()
else
  PY=${PYTHON:-python3}
  tmp=$(mktemp -d /tmp/eqdsl_multi_gpu_dry.XXXXXX)
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} EQDSL_CACHE_DIR=$tmp/eqcache TRITON_CACHE_DIR=$tmp/tcache \
    JAX_COMPILATION_CACHE_DIR=$tmp/jaxcache
  OUT=${OUT:-$tmp/out}
  QUICK=(--quick)
fi
# JAX's persistent compilation cache keeps every executable (what jaxwarm compiles, the timed
# run loads); no GPU memory grabbed up front (several processes share the GPUs in prep)
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 \
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 OUT
LOGS=${EQDSL_LOG_DIR:-/tmp/eqdsl_multi_gpu_logs}
[ $DRY = 1 ] && LOGS=${EQDSL_LOG_DIR:-$tmp/logs}
mkdir -p "$OUT" "$LOGS"
read -ra SCALING <<< "${EQDSL_SCALING_ARGS:-}"
DEADLINE=${EQDSL_DEADLINE:-585}
TORCH_RESERVE=${EQDSL_TORCH_RESERVE:-230}
JAX_RESERVE=${EQDSL_JAX_RESERVE:-100}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
limit_for() { local l=$(( $(left) - $1 )); [ $l -lt 10 ] && l=10; echo $l; }
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | paste -sd, -)
echo "install/setup $(( $(date +%s) - T0 )) s; GPUs: ${gpus:-none}; dry run: $DRY; logs: $LOGS"
[ $DRY = 1 ] && echo "dry run: OUT=$OUT"

# job NAME LIMIT CMD...: run CMD under timeout (the whole process group: spawned ranks too),
# output into $LOGS/NAME.log, one status line into $LOGS/NAME.status
job() {
  local name=$1 limit=$2 t rc
  shift 2
  t=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "$name: rc $rc$([ $rc = 124 ] && echo " (killed at its ${limit} s limit)"), $(( $(date +%s) - t )) s" \
    > "$LOGS/$name.status"
}

# The inline JAX sharding check (2 devices, generated/nequip_water, float32)
cat > "$LOGS/jax_sharding_check.py" <<'EOF'
"""shard_map (default check_vma=True on GPU) and batch-sharded jit of the generated JAX ops on 2 devices."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from generated.nequip_water import jax_ops as op

jax.config.update("jax_default_matmul_precision", "highest")
cpu = jax.default_backend() == "cpu"
vma = not cpu  # CPU (dry run): Pallas interpret mode cannot run under check_vma=True
rows, nodes, edges = (16, 6, 16) if cpu else (4096, 512, 8192)
devs = jax.devices()[:2]
if len(devs) < 2:
    sys.exit(f"FAIL: 2 devices needed, jax sees {jax.devices()}")
print(f"devices {[d.device_kind for d in devs]}, check_vma={vma}, rows {rows}, graphs {nodes} nodes / {edges} edges")
mesh = Mesh(np.array(devs), ("b",))  # Auto axes
rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
fails = 0


def report(name, got, want, tol=1e-5):
    global fails
    rel = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()
                    / max(np.abs(np.asarray(b, np.float64)).max(), 1e-30))
              for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    fails += rel > tol
    print(f"{'OK' if rel <= tol else 'FAIL'} {name}: max relative difference {rel:.1e} (tolerance {tol:g})", flush=True)


def ok(name, cond, detail):
    global fails
    fails += not cond
    print(f"{'OK' if cond else 'FAIL'} {name}: {detail}", flush=True)


# tensor_product: per-row weights (nequip_water), shard_map over the rows
x1, x2, w, g = f32(rows, op.DIM_IN1), f32(rows, op.DIM_IN2), f32(rows, op.WEIGHT_NUMEL), f32(rows, op.DIM_OUT)
tp_map = jax.shard_map(op.tensor_product, mesh=mesh, in_specs=(P("b"),) * 3, out_specs=P("b"), check_vma=vma)
grads = lambda f: jax.jit(jax.grad(lambda a, b, c: jnp.sum(f(a, b, c) * g), argnums=(0, 1, 2)))  # noqa: E731
report("shard_map tensor_product forward", jax.jit(tp_map)(x1, x2, w), jax.jit(op.tensor_product)(x1, x2, w))
report("shard_map tensor_product gradients", grads(tp_map)(x1, x2, w), grads(op.tensor_product)(x1, x2, w))

# conv: one graph per device (leading device axis), against each graph alone
X, G = f32(2, nodes, op.DIM_IN1), f32(2, nodes, op.DIM_OUT)
Y, W = f32(2, edges, op.DIM_IN2), f32(2, edges, op.WEIGHT_NUMEL)
S = rng.integers(0, nodes, (2, edges)).astype(np.int32)
D = np.sort(rng.integers(0, nodes, (2, edges)), axis=1).astype(np.int32)
conv_map = jax.shard_map(lambda x, y, w, s, d: op.conv(x[0], y[0], w[0], s[0], d[0], nodes, check=False)[None],
                         mesh=mesh, in_specs=(P("b"),) * 5, out_specs=P("b"), check_vma=vma)
conv_one = lambda x, y, w, s, d: jnp.stack([op.conv(x[i], y[i], w[i], s[i], d[i], nodes, check=False)  # noqa: E731
                                            for i in range(2)])
cgrads = lambda f: jax.jit(jax.grad(lambda x, y, w: jnp.sum(f(x, y, w, S, D) * G), argnums=(0, 1, 2)))  # noqa: E731
report("shard_map conv forward", jax.jit(conv_map)(X, Y, W, S, D), jax.jit(conv_one)(X, Y, W, S, D))
report("shard_map conv gradients", cgrads(conv_map)(X, Y, W), cgrads(conv_one)(X, Y, W))

# jit on batch-sharded inputs: each device its own rows, nothing gathered
sh = NamedSharding(mesh, P("b", None))
args = [jax.device_put(a, sh) for a in (x1, x2, w)]
loss_grad = jax.grad(lambda a, b, c: jnp.sum(op.tensor_product(a, b, c) * g), argnums=(0, 1, 2))
for name, f in (("forward", op.tensor_product), ("gradients", loss_grad)):
    hlo = jax.jit(f).lower(*args).compile().as_text()
    ok(f"jit on batch-sharded inputs, {name}: no all-gather", hlo.count("all-gather") == 0,
       f"{hlo.count('all-gather')} all-gather, {hlo.count('all-reduce')} all-reduce in the compiled HLO")
out = jax.jit(op.tensor_product)(*args)
ok("jit on batch-sharded inputs: output sharded like the inputs", tuple(out.sharding.spec)[:1] == ("b",),
   f"output spec {out.sharding.spec}")
report("jit on batch-sharded inputs forward", out, jax.jit(op.tensor_product)(x1, x2, w))
report("jit on batch-sharded inputs gradients", jax.jit(loss_grad)(*args), grads(op.tensor_product)(x1, x2, w))
print(f"jax sharding check: {'all OK' if not fails else f'{fails} FAILED'}")
sys.exit(1 if fails else 0)
EOF

for step in "${steps[@]}"; do
  t=$(date +%s)
  case $step in
    prep)
      limit=$(limit_for "$TORCH_RESERVE")
      echo "prep: 4 jobs at once, limit $limit s"
      if [ $DRY = 0 ]; then
        job precompile "$limit" $PY benchmarks/precompile.py --problems mace_large --dtypes float32 \
          --workers "${EQDSL_PRECOMPILE_WORKERS:-12}" --deadline $((limit - 15)) --log-dir "$LOGS/precompile_jobs" &
      else
        job precompile "$limit" $PY benchmarks/precompile.py --problems mace_large --dtypes float32 --list &
      fi
      job gputests "$limit" $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_torch_device.py \
        tests/test_jax_sharding.py -rA &
      if [ $DRY = 0 ]; then
        job jaxcheck "$limit" $PY "$LOGS/jax_sharding_check.py" &
      else
        job jaxcheck "$limit" env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 \
          $PY "$LOGS/jax_sharding_check.py" &
      fi
      job jaxwarm "$limit" $PY benchmarks/bench_scaling.py --framework jax --warm-only "${QUICK[@]}" "${SCALING[@]}" &
      wait
      for j in precompile gputests jaxcheck jaxwarm; do cat "$LOGS/$j.status"; tail -n 2 "$LOGS/$j.log"; done
      ;;
    torch)
      limit=$(limit_for "$JAX_RESERVE")
      job torch "$limit" $PY benchmarks/bench_scaling.py --framework torch "${QUICK[@]}" "${SCALING[@]}"
      cat "$LOGS/torch.status"; grep -E "^(check|torch):" "$LOGS/torch.log"; tail -n 3 "$LOGS/torch.log"
      ;;
    jax)
      limit=$(limit_for 8)
      job jax "$limit" $PY benchmarks/bench_scaling.py --framework jax "${QUICK[@]}" "${SCALING[@]}"
      cat "$LOGS/jax.status"; grep -E "^(check|jax|check_vma)" "$LOGS/jax.log"; tail -n 3 "$LOGS/jax.log"
      ;;
  esac
  echo "$step: $(( $(date +%s) - t )) s"
done

{
  echo "===== summary ($(date -u +%FT%TZ), ${gpus:-no GPU}, dry run: $DRY)"
  for s in precompile gputests jaxcheck jaxwarm torch jax; do
    [ -f "$LOGS/$s.status" ] && cat "$LOGS/$s.status"
  done
  [ -f "$LOGS/precompile.log" ] && grep -E "^precompile:|FAILED" "$LOGS/precompile.log" | tail -n 5
  [ -f "$LOGS/gputests.log" ] && tail -n 1 "$LOGS/gputests.log"
  [ -f "$LOGS/jaxcheck.log" ] && grep -E "^(OK|FAIL|devices|jax sharding)" "$LOGS/jaxcheck.log"
  [ -f "$LOGS/jaxwarm.log" ] && grep -E "^(check|jax:|warm:)" "$LOGS/jaxwarm.log"
  for s in torch jax; do [ -f "$LOGS/$s.log" ] && grep -E "^(check|check_vma|$s:)" "$LOGS/$s.log"; done
  if [ -f "$OUT/bench_scaling.json" ]; then
    echo
    $PY benchmarks/bench_scaling.py --print-table --json "$OUT/bench_scaling.json"
  fi
  echo "total $(( $(date +%s) - T0 )) s"
} | tee "$OUT/summary.txt"
tar czf "$OUT/multi_gpu_logs.tar.gz" -C "$LOGS" . 2>/dev/null
