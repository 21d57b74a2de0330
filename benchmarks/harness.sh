#!/usr/bin/env bash
# The benchmark harness as device calls of at most 600 s each, run back to back on one machine
# (benchmarks/README.md, "Every anchor at its best"). From the repository root on the GPU machine:
#
#   bash benchmarks/harness.sh tp1    the tensor product: mace_large, mace_medium, nequip_water,
#                                     nequip_aspirin, nequip_toluene (float32; float64 for mace_large
#                                     and nequip_toluene)
#   bash benchmarks/harness.sh tp2    the tensor product: the other problems (float32)
#   bash benchmarks/harness.sh conv   the fused convolution in float32, and the small-graph latency
#   bash benchmarks/harness.sh conv64 the fused convolution in float64 (mace_large, nequip_toluene)
#   bash benchmarks/harness.sh radial conv_radial against the matmul + each convolution (float32)
#
# Carry .whl, .whl_cueq_xz, .whl_oeq and generated_twins.tar.xz (benchmarks/layout_twins.py with their
# Triton code, packed: 0.7 MB; unpacked here into generated_twins/. Twins without Triton code run
# Helion's code generation in every process that calls them, the timed one included: 113 s for
# nequip_benzene's forward on 2026-11-27). Each call compiles what it times first
# (precompile.py with the timed run's --problems, so the JAX cache keys match), builds
# OpenEquivariance's extension beside it, then times with nothing else running. Caches live in
# /tmp while the machine stays warm, so a later call on the same machine compiles little.
# Results: $OUT/<call>.tar.xz (logs) and the call's JSON as $OUT/<call>_bench_*.json; merge the TP parts with
#   python benchmarks/merge_json.py bench_tp.json tp1_bench_tp.json tp2_bench_tp.json
# Measured 2026-11-27 (H100): one call for all TP problems ran out of its 600 s (ir_mul twins compiled
# by Helion inside the timed process, OpenEquivariance's 56 s build, 178 s of JAX warm-up). The first run
# of these four calls (results/s10) still lost most of tp2 and the float64 rows to twins carried without
# Triton code; conv's JAX warm-up needed more than 190 s (two jobs killed), hence 240 s now.
set -u
CALL=${1:?usage: bash benchmarks/harness.sh tp1|tp2|conv|conv64|radial}
DEADLINE=${EQDSL_DEADLINE:-575}
G1=mace_large,mace_medium,nequip_water,nequip_aspirin,nequip_toluene
G2=nequip_benzene,nequix_main,sevennet_l3i5,diffdock_l2,tetris_poly_1,e3tools_conv
T0=$(date +%s)
if [ -f generated_twins.tar.xz ]; then rm -rf generated_twins && tar -xJf generated_twins.tar.xz; fi
FULL=/tmp/harness/$CALL
mkdir -p "$FULL"
# OpenEquivariance's C++ extension (once per machine, ~30-60 s) beside the compile step; the
# 20 s wait lets run_device.sh install the wheels into /tmp/site first
if [ -d .whl_oeq ]; then
  ( sleep 20; . benchmarks/tools/oeq_env.sh; export PYTHONPATH=/tmp/site:$PWD
    python3 -c "import openequivariance, torch; print('oeq ready', torch.ops.libtorch_tp_jit)" ) > "$FULL/oeq_build.log" 2>&1 &
fi
tp() {  # $1: comma-separated problems
  local twins
  twins=$(twins_of "$1")
  OUT=$FULL EQDSL_DEADLINE=$DEADLINE EQDSL_PRECOMPILE_ARGS="--bench --jax --no-conv --problems $1" \
    EQDSL_TWINS_ARGS="--no-conv${twins:+ --problems $twins}" EQDSL_TP_ARGS="--problems $1" \
    bash benchmarks/run_device.sh precompile=240 twins=90 tp=-5 > "$FULL/run.log" 2>&1
}
twins_of() {  # the ir_mul twin packages of these problems that generated_twins holds
  local out=() p
  IFS=, read -ra ps <<< "$1"
  for p in "${ps[@]}"; do [ -d "generated_twins/${p}_irmul" ] && out+=("${p}_irmul"); done
  local IFS=,; echo "${out[*]}"
}
case $CALL in
  tp1) tp "$G1" ;;
  tp2) tp "$G2" ;;
  conv|conv64)  # one dtype per call: both did not fit one (2026-11-27: 230 s of compiling on a fresh
    # machine, then the float32 rows and 2 of the 12 float64 ones). The precompile, the twins' and the
    # timed run get the same --dtypes, so that the JAX warm-ups lower what the timed run lowers
    # The latency section (float32 only) runs in conv; conv64 skips it, and so do its JAX warm-ups
    dt=float32 lat=; [ "$CALL" = conv64 ] && dt=float64 lat=--no-latency
    OUT=$FULL EQDSL_DEADLINE=$DEADLINE EQDSL_PRECOMPILE_ARGS="--bench --jax --conv-only --dtypes $dt $lat" \
      EQDSL_TWINS_ARGS="--conv-only --dtypes $dt" EQDSL_CONV_ARGS="--dtypes $dt $lat" \
      bash benchmarks/run_device.sh precompile=240 twins=60 conv=-5 \
      > "$FULL/run.log" 2>&1 ;;
  radial)  # float32 (2026-11-27: with both dtypes it timed one float64 graph; the JAX warm-ups, not yet
    # replaying --radial, were killed at 140 s and the timed run compiled)
    OUT=$FULL EQDSL_DEADLINE=$DEADLINE \
      EQDSL_PRECOMPILE_ARGS="--bench --jax --conv-only --radial --dtypes float32 --problems mace_large,nequip_toluene" \
      EQDSL_CONV_ARGS="--radial --dtypes float32" bash benchmarks/run_device.sh precompile=200 conv=-5 \
      > "$FULL/run.log" 2>&1 ;;
  *) echo "unknown call $CALL"; exit 2 ;;
esac
wait
echo "harness $CALL: $(( $(date +%s) - T0 )) s" >> "$FULL/run.log"
RESULTS=${OUT:-/tmp/out}
tar -C /tmp/harness -cJf "$RESULTS/$CALL.tar.xz" "$CALL"
for f in "$FULL"/bench_*.json; do [ -f "$f" ] && cp "$f" "$RESULTS/${CALL}_$(basename "$f")"; done
tail -n 12 "$FULL/run.log"
