#!/usr/bin/env bash
# Session of 2026-12-07 (s21), device call 1 (17:17 UTC): the float64 conv table alone, at the
# harness's default deadline. Carry .whl .whl_cueq_xz .whl_oeq generated_twins.tar.xz.
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/harness.sh conv64
