#!/usr/bin/env bash
# Fetch the cuEquivariance wheels the GPU image lacks (Python 3.12, manylinux x86_64,
# CUDA 13, torch >= 2.11) into ignored folders of the repository root, for `carry`.
# Run here (not on the device machine), from anywhere; needs pip and network to PyPI.
#
#   .whl_cueq_a/   cuequivariance-ops-cu13 (~45 MB)                    } two calls,
#   .whl_cueq_b/   cuequivariance-ops-torch-cu13 (~29 MB) + pure wheels } back to back
#   .whl_cueq_xz/  the two ops wheels' files, unchanged, in one tar.xz (~26 MB)
#                  + the pure-python wheels: fits one call with .whl
#
# Each folder must be listed in .git/info/exclude (this script adds the lines).
set -euo pipefail
cd "$(dirname "$0")/../.."
V=0.13.0
PY=${PYTHON:-python3}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" -d "$1" "${@:2}"; }
for d in .whl_cueq_a .whl_cueq_b .whl_cueq_xz; do
  rm -rf "$d"; mkdir -p "$d"
  grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude
done
dl .whl_cueq_a cuequivariance-ops-cu13==$V
dl .whl_cueq_b cuequivariance-ops-torch-cu13==$V cuequivariance==$V cuequivariance-torch==$V platformdirs==4.14.7
cp .whl_cueq_b/cuequivariance-$V-*.whl .whl_cueq_b/cuequivariance_torch-$V-*.whl .whl_cueq_b/platformdirs-*.whl .whl_cueq_xz/
tmp=$(mktemp -d)
for w in .whl_cueq_a/cuequivariance_ops_cu13-*.whl .whl_cueq_b/cuequivariance_ops_torch_cu13-*.whl; do
  (cd "$tmp" && unzip -qo "$OLDPWD/$w")
done
tar cf - -C "$tmp" . | xz -T0 -9 > .whl_cueq_xz/cueq_ops-$V.tar.xz
rm -rf "$tmp"
ls -l .whl_cueq_a .whl_cueq_b .whl_cueq_xz
