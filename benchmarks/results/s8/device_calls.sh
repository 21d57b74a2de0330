#!/usr/bin/env bash
# Session 8 device calls: bash exp/s8/device.sh CALL. Runs in the copied working tree.
set -u
CALL=$1
T0=$(date +%s)
L=/tmp/out8/$CALL; mkdir -p $L
[ $CALL = ncu_rest ] || bash benchmarks/run_device.sh report=5 > $L/install.log 2>&1   # installs the carried wheels into /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EQDSL_CACHE_DIR=/tmp/eqcache TRITON_CACHE_DIR=/tmp/tcache
step() {  # step NAME SECONDS command...
  local name=$1 secs=$2; shift 2
  local left=$(( 585 - ($(date +%s) - T0) )); [ $left -lt 20 ] && { echo "$name: no time" >> $L/run.log; return; }
  [ $secs -gt $left ] && secs=$left
  timeout $secs "$@" > $L/$name.log 2>&1; echo "$name rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
}
case $CALL in
  verify)  # last session's unverified GPU work: the symmetric packages' Triton code, the jit_fn[grid] launch's host time
    step check_lowering 100 python3 benchmarks/tools/check_lowering.py mace_mp_products mace_large --dtypes float32,float64
    step sym_triton 170 python3 benchmarks/tools/symmetric_torch_bench.py --triton --dtypes float32,float64 --layouts mul_ir --forces --per-op --elements 10 --reps 20 --no-baselines
    step host_profile 60 python3 exp/s8/host_profile.py
    step small_graph ${SG_S:-220} python3 benchmarks/bench_small_graph.py --impls torch_eager,torch_graph,torch_compile_graph,jax_jit,torch_conv_fwd_bwd --json $L/bench_small_graph.json
    ;;
  ncu_tp|ncu_conv)  # Nsight Compute on the rows an anchor wins that have no measured reason yet (issue 28)
    [ -d .whl_oeq ] && . benchmarks/tools/oeq_env.sh > $L/oeq_env.log 2>&1
    export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
    if [ $CALL = ncu_tp ]; then
      cases=(":mace_large:float32:fwd+bwd:eqdsl_jax_irmul" ":mace_large:float64:fwd:eqdsl_jax_irmul"
             ":mace_medium:float32:fwd+bwd:eqdsl_jax_irmul" ":nequip_aspirin:float32:fwd:eqdsl_torch,eqdsl_jax_irmul"
             ":nequip_aspirin:float32:fwd+bwd:eqdsl_torch_irmul" ":nequip_toluene:float32:fwd:eqdsl_jax_irmul"
             ":nequip_toluene:float32:fwd+bwd:eqdsl_jax_irmul" ":nequip_toluene:float64:fwd:eqdsl_jax_irmul"
             ":nequip_toluene:float64:fwd+bwd:eqdsl_jax" ":nequip_benzene:float32:fwd:eqdsl_jax_irmul"
             ":nequix_main:float32:fwd+bwd:eqdsl_jax_irmul" ":sevennet_l3i5:float32:fwd+bwd:eqdsl_jax_irmul"
             ":diffdock_l2:float32:fwd:eqdsl_jax" ":diffdock_l2:float32:fwd+bwd:eqdsl_jax"
             ":mace_large:float32:fwd+bwd:oeq" ":mace_large:float64:fwd:oeq" ":nequip_toluene:float32:fwd+bwd:oeq"
             ":nequip_aspirin:float32:fwd:oeq" ":nequip_aspirin:float32:fwd+bwd:oeq" ":nequix_main:float32:fwd+bwd:oeq")
    else
      cases=("bulk:mace_large:float32:fwd+bwd:eqdsl_jax_irmul" "rand4096x32:mace_large:float32:fwd+bwd:eqdsl_jax_irmul"
             "rand512x64:mace_large:float64:fwd+bwd:eqdsl_jax_irmul" "bulk:mace_large:float64:fwd:eqdsl_jax_irmul"
             "bulk:mace_large:float64:fwd+bwd:eqdsl_jax_irmul" "bulk:nequip_toluene:float32:fwd:eqdsl_jax"
             "rand4096x32:nequip_toluene:float32:fwd:eqdsl_jax_irmul" "rand512x64:nequip_toluene:float64:fwd:eqdsl_jax_irmul"
             "rand512x64:nequip_toluene:float64:fwd+bwd:eqdsl_jax_irmul"
             "bulk:mace_large:float32:fwd+bwd:cueq_irmul,eqdsl_torch_irmul" "bulk:mace_large:float64:fwd:cueq_irmul,oeq"
             "rand512x64:nequip_toluene:float64:fwd+bwd:oeq")
    fi
    i=0
    for c in "${cases[@]}"; do
      i=$((i + 1)); left=$(( 570 - ($(date +%s) - T0) )); [ $left -lt 25 ] && { echo "case $i $c: no time" >> $L/run.log; continue; }
      graph=${c%%:*}; case_=${c#*:}
      timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$case_" ${graph:+--conv $graph} --json $L/ncu_$i.json >> $L/ncu.log 2>&1
      echo "case $i $c rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
    done
    ;;
  jaxba)  # same-run before/after of ABI 2 (no concatenation pass after the Pallas kernels): eqdsl JAX only
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
    export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 XLA_PYTHON_CLIENT_PREALLOCATE=false
    HERE=$PWD
    jobs=("tp mace_large float32" "tp nequip_benzene float32" "tp nequix_main float32" "conv mace_large float32"
          "tp sevennet_l3i5 float32" "tp mace_large float64" "conv mace_large float64")
    for job in "${jobs[@]}"; do
      set -- $job; kind=$1 prob=$2 dt=$3
      for tree in before after; do
        left=$(( 560 - ($(date +%s) - T0) )); [ $left -lt 30 ] && { echo "$kind $prob $dt $tree: no time" >> $L/run.log; continue; }
        dir=$HERE; [ $tree = before ] && dir=$HERE/exp/s8/before
        if [ $kind = tp ]; then
          (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $left python3 benchmarks/bench_tp.py --problems $prob --impls eqdsl_jax,eqdsl_jax_irmul \
             --batch 20000 --dtypes $dt --time-budget $((left - 10)) --json $L/${kind}_${prob}_${dt}_$tree.json) > $L/${kind}_${prob}_${dt}_$tree.log 2>&1
        else
          (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $left python3 benchmarks/bench_conv.py --problems $prob --graphs bulk --no-latency \
             --impls eqdsl_jax,eqdsl_jax_irmul --dtypes $dt --time-budget $((left - 10)) --json $L/${kind}_${prob}_${dt}_$tree.json) > $L/${kind}_${prob}_${dt}_$tree.log 2>&1
        fi
        echo "$kind $prob $dt $tree rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
      done
    done
    ;;
  convh100)  # the JAX conv after ABI 2 against cuEquivariance (ir_mul), same run, on an H100
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl_cueq_xz/*.whl > $L/pip.log 2>&1
    python3 -c "import tarfile; tarfile.open('.whl_cueq_xz/cueq_ops-0.13.0.tar.xz').extractall('/tmp/site', filter='fully_trusted')"
    export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache XLA_PYTHON_CLIENT_PREALLOCATE=false
    step conv_h100 ${CONV_S:-230} python3 benchmarks/bench_conv.py --problems mace_large --graphs bulk,rand4096x32 --no-latency \
      --impls eqdsl_jax_irmul,cueq_irmul --dtypes float32 --time-budget 200 --json $L/conv_h100.json
    ;;
  ncu_rest)  # the rows still without a measured reason (after ABI 2), short deadline
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
    export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache XLA_PYTHON_CLIENT_PREALLOCATE=false
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
    cases=("bulk:mace_large:float64:fwd+bwd:eqdsl_jax_irmul" "bulk:nequip_toluene:float32:fwd:eqdsl_jax"
           "rand512x64:nequip_toluene:float64:fwd+bwd:eqdsl_jax_irmul" ":nequip_aspirin:float32:fwd+bwd:eqdsl_torch_irmul"
           "rand512x64:mace_large:float64:fwd+bwd:eqdsl_jax_irmul" "rand4096x32:nequip_toluene:float32:fwd:eqdsl_jax_irmul")
    i=0
    for c in "${cases[@]}"; do
      i=$((i + 1)); left=$(( ${DEADLINE_S:-175} - ($(date +%s) - T0) )); [ $left -lt 15 ] && { echo "case $i $c: no time" >> $L/run.log; continue; }
      graph=${c%%:*}; case_=${c#*:}
      timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$case_" ${graph:+--conv $graph} --json $L/ncu_rest_$i.json >> $L/ncu.log 2>&1
      echo "case $i $c rc $? at $(( $(date +%s) - T0 )) s" >> $L/run.log
    done
    ;;
  *) echo "unknown call $CALL"; exit 2;;
esac
cd /tmp/out8 && tar -czf $OUT/$CALL.tgz $CALL; cp $CALL/*.json $OUT/ 2>/dev/null
cat $L/run.log
[ -f $L/ncu.log ] && cat $L/ncu.log | tail -n 150
[ $CALL = jaxba ] && { for f in $L/*_before.log $L/*_after.log; do echo "== $f"; grep -E "^\s*(float|mace|nequ|seven|[0-9])|us|BAD|rror" $f | tail -n 14; done; exit 0; }
[ -f $L/ncu.log ] || for f in $L/*.log; do echo "== $f"; tail -n 30 $f; done 2>/dev/null | tail -n 220
