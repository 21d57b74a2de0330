#!/usr/bin/env bash
# Session 9 (2026-11-27) device calls, run from the repository root with the exp/s9 copy of this folder:
#   call 1: python3 exp/s9/jax_sweep.py $OUT 470            (carry exp; the sweep, jax_sweep.json)
#   call 2: bash exp/s9/device.sh tp                         (carry .whl .whl_cueq_xz .whl_oeq generated_twins exp/s9)
#   call 3: bash exp/s9/device.sh tp2                        (same machine, warm caches: the TP rows it reached)
#   call 4: bash exp/s9/device.sh f64                        (same machine: the float64 rows, bench_tp_f64.json)
# CALL tp / conv: the harness steps of benchmarks/results/device_calls.sh, in the working tree.
set -u
CALL=$1
T0=$(date +%s)
OUT_FULL=/tmp/outfull/$CALL; mkdir -p $OUT_FULL
oeq_build() {  # OpenEquivariance's C++ extension, once per machine, beside the precompile
  ( sleep 20; . benchmarks/tools/oeq_env.sh; export PYTHONPATH=/tmp/site:$PWD
    /usr/bin/time -f "oeq import %e s" python3 -c "import openequivariance as o, torch; print('oeq', o.__version__, torch.ops.libtorch_tp_jit)" ) > $OUT_FULL/oeq_build.log 2>&1 &
}
case $CALL in
  tp)
    oeq_build
    OUT=$OUT_FULL EQDSL_DEADLINE=575 EQDSL_PRECOMPILE_ARGS="--bench --jax --no-conv" EQDSL_TWINS_ARGS="--no-conv" \
      bash benchmarks/run_device.sh precompile=260 twins=90 tp=-5 > $OUT_FULL/run.log 2>&1
    ;;
  conv)
    oeq_build
    OUT=$OUT_FULL EQDSL_DEADLINE=575 EQDSL_PRECOMPILE_ARGS="--bench --jax --conv-only" EQDSL_TWINS_ARGS="--conv-only" \
      bash benchmarks/run_device.sh precompile=200 twins=70 conv=-5 > $OUT_FULL/run.log 2>&1
    ;;
  tp2)
    OUT=$OUT_FULL EQDSL_DEADLINE=560 EQDSL_TWINS_ARGS="--no-conv" EQDSL_TP_ARGS="--time-budget=330" \
      bash benchmarks/run_device.sh twins=100 tp=-5 > $OUT_FULL/run.log 2>&1
    ;;
  f64)
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache \
      JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
    export CUDA_HOME=/tmp/cudahome LIBRARY_PATH=/tmp/cudahome/lib64 LD_LIBRARY_PATH=/tmp/cudahome/lib64:${LD_LIBRARY_PATH:-}
    timeout 195 python3 benchmarks/bench_tp.py --batch 20000 --problems mace_large,nequip_toluene --dtypes float64 \
      --impls eqdsl_torch,eqdsl_jax,eqdsl_torch_irmul,eqdsl_jax_irmul,cueq_irmul,oeq --time-budget=160 \
      --json $OUT_FULL/bench_tp_f64.json > $OUT_FULL/tp_f64.log 2>&1
    ;;
esac
wait
echo "call $CALL: $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
cd /tmp/outfull && tar -cJf $OUT/$CALL.tar.xz $CALL && cp $CALL/*.json $OUT/ 2>/dev/null
tail -n 30 $OUT_FULL/run.log
for f in $OUT_FULL/*.log; do echo "== $f"; tail -n 6 $f; done 2>/dev/null | tail -n 80
