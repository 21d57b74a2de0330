#!/usr/bin/env bash
# Issues 24/28 harness calls: bash exp/fair/device.sh CALL, CALL = tp | conv | startup. Each call stands alone
# (a machine is given back 30 s after a call): it compiles what it times, then times it.
# Runs in /tmp/w: the committed tree (exp/fair/snapshot.tar.xz = git archive HEAD + generated_twins/ rendered
# from it), so the engineers' uncommitted work in the copied working tree plays no part.
set -u
CALL=$1
W=/tmp/w
HERE=$PWD
if [ ! -f $W/.ready ]; then
  mkdir -p $W && tar -xJf exp/fair/snapshot.tar.xz -C $W || exit 1
  mkdir -p $W/.whl && cp .whl_bench/*.whl $W/.whl/ && cp -r .whl_cueq_xz .whl_oeq $W/ && touch $W/.ready
fi
cd $W
OUT_FULL=/tmp/outfull/$CALL; mkdir -p $OUT_FULL
T0=$(date +%s)
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
  ncu)
    bash benchmarks/run_device.sh report=5 > /dev/null 2>&1  # installs the wheels
    export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tcache EQDSL_CACHE_DIR=/tmp/eqcache; . benchmarks/tools/oeq_env.sh
    cp $HERE/benchmarks/tools/ncu_rows.py benchmarks/tools/ncu_rows.py  # the fixed tool
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
    i=0
    for c in "nequip_water:float32:fwd:eqdsl_torch,oeq" "nequip_toluene:float64:fwd+bwd:eqdsl_torch_irmul,oeq" \
             "diffdock_l2:float32:fwd+bwd:eqdsl_torch,oeq" "mace_large:float64:fwd+bwd:eqdsl_jax_irmul,cueq_irmul,oeq"; do
      i=$((i + 1)); left=$(( 500 - ($(date +%s) - T0) )); [ $left -lt 30 ] && break
      timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$c" --json $OUT_FULL/ncu_tp_$i.json >> $OUT_FULL/ncu.log 2>&1
      echo "case $i rc $? $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
    done
    left=$(( 575 - ($(date +%s) - T0) ))
    [ $left -gt 40 ] && timeout $left python3 benchmarks/tools/ncu_rows.py --conv rand4096x32 \
        --cases "mace_large:float32:fwd+bwd:eqdsl_jax_irmul,cueq_irmul" --json $OUT_FULL/ncu_conv.json >> $OUT_FULL/ncu.log 2>&1
    ;;
  ncu2)
    bash benchmarks/run_device.sh report=5 > /dev/null 2>&1  # installs the wheels
    export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/tcache EQDSL_CACHE_DIR=/tmp/eqcache; . benchmarks/tools/oeq_env.sh
    cp $HERE/benchmarks/tools/ncu_rows.py benchmarks/tools/ncu_rows.py
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
    i=4
    for c in "e3tools_conv:float32:fwd+bwd:eqdsl_torch,eqdsl_jax,oeq" "tetris_poly_1:float32:fwd+bwd:eqdsl_torch,oeq" \
             "sevennet_l3i5:float32:fwd:eqdsl_torch_irmul,eqdsl_jax_irmul,oeq" "mace_large:float32:fwd+bwd:eqdsl_jax_irmul,oeq" \
             "nequip_toluene:float32:fwd+bwd:eqdsl_jax_irmul,oeq"; do
      i=$((i + 1)); left=$(( 470 - ($(date +%s) - T0) )); [ $left -lt 30 ] && break
      timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$c" --json $OUT_FULL/ncu_tp_$i.json >> $OUT_FULL/ncu.log 2>&1
      echo "case $i rc $? $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
    done
    left=$(( 570 - ($(date +%s) - T0) ))
    [ $left -gt 40 ] && timeout $left python3 benchmarks/tools/ncu_rows.py --conv bulk \
        --cases "mace_large:float32:fwd+bwd:eqdsl_jax_irmul,cueq_irmul" --json $OUT_FULL/ncu_conv.json >> $OUT_FULL/ncu.log 2>&1
    ;;
  after)
    # the same-run before/after of issue 25: the committed tree before the restructuring (/tmp/w) and the
    # final tree (the working copy), eqdsl only, on a host-bound, a bandwidth-bound and a uvw problem
    for tree in $W $HERE $W; do
      cd $tree; mkdir -p .whl; cp $HERE/.whl_bench/*.whl .whl/ 2>/dev/null
      tag=$( [ $tree = $W ] && echo before || echo after )
      OUT=$OUT_FULL/$tag EQDSL_DEADLINE=170 EQDSL_PRECOMPILE_ARGS="--bench --jax --no-conv --problems nequip_water,mace_large,tetris_poly_1" \
        EQDSL_TP_ARGS="--problems nequip_water,mace_large,tetris_poly_1 --impls eqdsl_torch,eqdsl_jax --dtypes float32" \
        bash benchmarks/run_device.sh precompile=100 tp=-5 >> $OUT_FULL/run.log 2>&1
      cp $OUT_FULL/$tag/bench_tp.json $OUT_FULL/bench_tp_${tag}_$(date +%s).json
      grep -E "^ *(nequip_water|mace_large|tetris_poly_1) " $OUT_FULL/$tag/tp.log | sed "s/^/$tag /" >> $OUT_FULL/run.log
    done
    cd $W
    ;;
  startup)
    bash benchmarks/run_device.sh report=5 > /dev/null 2>&1  # installs the wheels
    export PYTHONPATH=/tmp/site:$PWD; . benchmarks/tools/oeq_env.sh
    ( CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=/tmp/tcb timeout 150 python3 -m eqdsl build generated/mace_large --arch sm_90 --dtype float32 ) > $OUT_FULL/build.log 2>&1
    echo "build rc $? $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
    timeout 300 python3 benchmarks/bench_startup.py --steps torch_cubins,torch_jit,oeq_cold,oeq --timeout 100 --json $OUT_FULL/bench_startup.json > $OUT_FULL/startup.log 2>&1
    echo "startup rc $? $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
    export TRITON_CACHE_DIR=/tmp/tcache EQDSL_CACHE_DIR=/tmp/eqcache
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); export NCU
    i=0
    for c in "mace_large:float32:fwd+bwd:eqdsl_torch,oeq" "nequip_toluene:float32:fwd+bwd:eqdsl_torch,oeq" \
             "mace_large:float64:fwd+bwd:eqdsl_torch,cueq_irmul" "mace_large:float64:fwd+bwd:eqdsl_jax"; do
      i=$((i + 1)); left=$(( 560 - ($(date +%s) - T0) )); [ $left -lt 30 ] && break
      timeout $left python3 benchmarks/tools/ncu_rows.py --cases "$c" --json $OUT_FULL/ncu_tp_$i.json >> $OUT_FULL/ncu.log 2>&1
    done
    left=$(( 570 - ($(date +%s) - T0) ))
    [ $left -gt 40 ] && timeout $left python3 benchmarks/tools/ncu_rows.py --conv rand4096x32 \
        --cases "mace_large:float32:fwd+bwd:eqdsl_torch,cueq_irmul,eqdsl_jax" --json $OUT_FULL/ncu_conv.json >> $OUT_FULL/ncu.log 2>&1
    ;;
esac
wait
echo "call $CALL: $(( $(date +%s) - T0 )) s" >> $OUT_FULL/run.log
cd /tmp/outfull && tar -cJf $OUT/$CALL.tar.xz $CALL && cp $CALL/*.json $OUT/ 2>/dev/null
cat $OUT_FULL/run.log | tail -n 30
for f in $OUT_FULL/*.log; do echo "== $f"; tail -n 6 $f; done 2>/dev/null | tail -n 100
