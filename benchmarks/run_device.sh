#!/usr/bin/env bash
# The benchmarks on the device machine (see benchmarks/README.md), in steps:
#   bash benchmarks/run_device.sh STEP[=SECONDS]...
#   precompile  every generated torch kernel, one process per kernel (precompile.py; EQDSL_PRECOMPILE_ARGS
#               adds arguments, e.g. --bench --jax as in all)
#   twins       the torch kernels of the ir_mul twins (generated_twins/, benchmarks/layout_twins.py) the
#               benchmarks call, compiled as precompile does (their JAX functions: precompile --jax;
#               EQDSL_TWINS_ARGS adds arguments, e.g. --no-conv)
#   gputests    the GPU tests (pytest -m gpu: devices, CUDA graphs, the Triton launch path)
#   tp          bench_tp.py at 20,000 rows (EQDSL_TP_ARGS adds arguments, e.g. --problems)
#   conv        bench_conv.py: small-graph latency, then the fused convolution
#   host        bench_small_graph.py: energy + forces per step on 32 atoms (eager, CUDA graph, compiled, JAX)
#               and host time per eager call (EQDSL_HOST_ARGS)
#   fused       tools/gpu_fused.py: the fused backward checked against the three ops, and timed (EQDSL_FUSED_ARGS)
#   all         the whole benchmark in one call (the default with no STEP): precompile --bench --jax
#               (every torch kernel and JAX function the benchmarks call, in parallel, into the
#               caches), then with nothing else running tp, conv (latency first), then report.py
#               ($OUT/BENCHMARKS.md, $OUT/roofline.png); each step's limit is what the call's
#               EQDSL_DEADLINE (default 585 s from the start) leaves it, so the tables always print
#   report      report.py on $OUT's JSON files into $OUT/BENCHMARKS.md and $OUT/roofline.png
#   tune        eqdsl tune --write on each spec of EQDSL_TUNE_SPECS (comma-separated problem
#               names), EQDSL_TUNE_PARALLEL (default up to 3) at a time, sharing 15 workers
#               (EQDSL_TUNE_ARGS adds arguments); each rewritten spec goes to $OUT/specs
# Installs the carried wheels (.whl, .whl_cueq_xz) into /tmp/site once per machine; the
# caches (/tmp/eqcache: Helion's generated modules, /tmp/tcache: Triton's binaries, /tmp/jaxcache:
# JAX's executables) stay while the machine is warm, so steps can be split over calls made back to back.
# Logs and JSON go to $OUT; a summary line per step is printed last.
set -u
T0=$(date +%s)
if [ ! -f /tmp/site/.eqdsl_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_cueq_xz/*.whl || exit 1
  python3 -c "import tarfile; tarfile.open('.whl_cueq_xz/cueq_ops-0.13.0.tar.xz').extractall('/tmp/site', filter='fully_trusted')" || exit 1
  touch /tmp/site/.eqdsl_installed
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
# OpenEquivariance (the `oeq` implementation) when its bundle is carried: benchmarks/tools/oeq_env.sh
[ -d .whl_oeq ] && . benchmarks/tools/oeq_env.sh
# JAX's persistent compilation cache: what precompile.py --jax compiles, the timed run loads
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
echo "install $(( $(date +%s) - T0 )) s; $(nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader)"
DEADLINE=${EQDSL_DEADLINE:-585}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
if [ "${steps[*]}" = "all" ]; then
  # reserved for what follows each step (measured 2026-11-26 on an H100 with warm caches: tp
  # 101-112 s, conv 76-88 s; precompile 220-240 s on 15 workers)
  steps=("precompile=$(( $(left) - 300 ))" "tp=-115" "conv=-12" "report=-1")
  EQDSL_PRECOMPILE_ARGS=${EQDSL_PRECOMPILE_ARGS:---bench --jax}
fi
summary=()
for arg in "${steps[@]}"; do
  step=${arg%%=*}; limit=${arg#*=}; [ "$limit" = "$arg" ] && limit=300
  # a negative limit: all the time left but that many seconds
  [ "$limit" -lt 0 ] 2>/dev/null && limit=$(( $(left) + limit ))
  [ "$limit" -lt 10 ] && limit=10
  t=$(date +%s)
  case $step in
    precompile) cmd=(python3 benchmarks/precompile.py --workers 15 --deadline $((limit - 10)) --log-dir "$OUT/precompile_jobs"
                     ${EQDSL_PRECOMPILE_ARGS:-}) ;;
    twins) cmd=(python3 benchmarks/precompile.py --workers 15 --deadline $((limit - 10)) --generated generated_twins
                --bench --log-dir "$OUT/precompile_twins" ${EQDSL_TWINS_ARGS:-}) ;;
    gputests) cmd=(python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/) ;;
    tp) cmd=(python3 benchmarks/bench_tp.py --batch 20000 --time-budget=$((limit - 40)) ${EQDSL_TP_ARGS:-}) ;;
    conv) cmd=(python3 benchmarks/bench_conv.py --time-budget=$((limit - 40)) ${EQDSL_CONV_ARGS:-}) ;;
    host) cmd=(python3 benchmarks/bench_small_graph.py ${EQDSL_HOST_ARGS:-}) ;;
    report) cmd=(python3 benchmarks/report.py --tp "$OUT/bench_tp.json" --conv "$OUT/bench_conv.json"
                 --latency "$OUT/bench_latency.json" --out "$OUT/BENCHMARKS.md" --png "$OUT/roofline.png") ;;
    fused) cmd=(python3 benchmarks/tools/gpu_fused.py --json "$OUT/gpu_fused.json" ${EQDSL_FUSED_ARGS:-}) ;;
    tune)
      IFS=, read -ra specs <<< "${EQDSL_TUNE_SPECS:-mace_large}"
      par=${EQDSL_TUNE_PARALLEL:-$(( ${#specs[@]} < 3 ? ${#specs[@]} : 3 ))}
      mkdir -p "$OUT/specs"
      cmd=(bash -c 'par=$1; shift; printf "%s\n" "$@" | xargs -P "$par" -I{} sh -c "python3 -m eqdsl tune examples/specs/{}.toml --write --workers $((15 / par)) ${EQDSL_TUNE_ARGS:-} > $OUT/tune_{}.log 2>&1; cp examples/specs/{}.toml $OUT/specs/"; tail -n 30 "$OUT"/tune_*.log' _ "$par" "${specs[@]}") ;;
    *) echo "unknown step $step"; continue ;;
  esac
  timeout "$limit" "${cmd[@]}" > "$OUT/$step.log" 2>&1
  rc=$?
  summary+=("$step: rc $rc, $(( $(date +%s) - t )) s")
  tail -n 3 "$OUT/$step.log"
done
printf '%s\n' "${summary[@]}"
echo "total $(( $(date +%s) - T0 )) s"
