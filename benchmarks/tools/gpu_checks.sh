#!/usr/bin/env bash
# GPU correctness checks in one device call (see benchmarks/tools/README.md):
#   bash benchmarks/tools/gpu_checks.sh STEP...   with STEP in main, forces, jax_grads,
#   torch_grads, torch_grads_par, conv, ops; each step has its own time limit (seconds,
#   STEP=LIMIT). torch_grads_par runs the torch GPU gradient tests as one pytest process per
#   example spec and dtype (kernel compilation is single-threaded and dominates), logs in
#   $OUT/torch_grads_par/.
#   EQDSL_K="expr" selects gradient tests by name (pytest -k), e.g. a few example specs.
# Logs go to $OUT/<step>.log; a summary line per step is printed last.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
echo "install $(( $(date +%s) - T0 )) s"
summary=()
# One background pytest process of the torch GPU gradient tests: grads_bg SELECTION LOGNAME
grads_bg() {
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_torch_grads.py \
    -k "$1" -s > "$OUT/torch_grads_par/$2.log" 2>&1 &
  pids+=($!)
}
for arg in "$@"; do
  step=${arg%%=*}; limit=${arg#*=}; [ "$limit" = "$arg" ] && limit=300
  t=$(date +%s)
  case $step in
    main) cmd=(python3 examples/main.py) ;;
    forces) cmd=(python3 -m pytest -q -x -p no:cacheprovider tests/test_forces.py) ;;
    jax_grads) cmd=(python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_jax_grads.py ${EQDSL_K:+-k "$EQDSL_K"}) ;;
    torch_grads) cmd=(python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_torch_grads.py ${EQDSL_K:+-k "$EQDSL_K"}) ;;
    conv) cmd=(python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_torch_conv.py tests/test_jax_conv.py) ;;
    ops) cmd=(python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_torch_ops.py tests/test_jax_ops.py) ;;
    torch_grads_par)
      mkdir -p "$OUT/torch_grads_par"
      pids=()
      for spec in examples/specs/*.toml; do
        stem=$(basename "$spec" .toml)
        for dt in float64 float32; do
          # EQDSL_ONLY="stem-dtype ..." limits the run to those processes; EQDSL_SPLIT="stem-dtype
          # ..." runs those as one process per kernel op (the largest kernels compile for minutes)
          [ -n "${EQDSL_ONLY:-}" ] && [[ " $EQDSL_ONLY " != *" $stem-$dt "* ]] && continue
          ops_=(all)
          [[ " ${EQDSL_SPLIT:-} " == *" $stem-$dt "* ]] && ops_=(fwd bwd_x1 bwd_x2 bwd_w)
          for op in "${ops_[@]}"; do
            sel="test_examples_all_kernels_on_gpu and $stem and $dt"
            [ "$op" = all ] || sel="$sel and $op"
            grads_bg "$sel" "$stem-$dt-$op"
          done
        done
      done
      if [ -z "${EQDSL_ONLY:-}" ] || [[ " $EQDSL_ONLY " == *" gradgradcheck "* ]]; then
        grads_bg test_gradgradcheck_on_gpu gradgradcheck
      fi
      fails=0
      for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
      for f in "$OUT"/torch_grads_par/*.log; do
        echo "== $(basename "$f" .log): $(grep "max relative error" "$f" | cut -d: -f2 | tr -s '\n' ' ') $(grep -m 3 "^E .*Error" "$f" | cut -c 1-200) $(tail -n 1 "$f")"
      done > "$OUT/$step.log"
      echo "$fails of ${#pids[@]} processes failed" >> "$OUT/$step.log"
      summary+=("$step $(( $(date +%s) - t )) s: $(tail -n 1 "$OUT/$step.log")")
      continue ;;
    *) echo "unknown step $step"; continue ;;
  esac
  timeout "$limit" "${cmd[@]}" > "$OUT/$step.log" 2>&1
  rc=$?
  summary+=("$step rc=$rc $(( $(date +%s) - t )) s: $(tail -n 1 "$OUT/$step.log")")
done
for s in "${summary[@]}"; do echo "$s"; done
