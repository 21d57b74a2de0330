#!/usr/bin/env bash
# GPU correctness checks in one device call (see benchmarks/README.md):
#   bash benchmarks/gpu_checks.sh STEP...   with STEP in main, forces, jax_grads,
#   torch_grads, conv, ops; each step has its own time limit (seconds, STEP=LIMIT).
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
    *) echo "unknown step $step"; continue ;;
  esac
  timeout "$limit" "${cmd[@]}" > "$OUT/$step.log" 2>&1
  rc=$?
  summary+=("$step rc=$rc $(( $(date +%s) - t )) s: $(tail -n 1 "$OUT/$step.log")")
done
for s in "${summary[@]}"; do echo "$s"; done
