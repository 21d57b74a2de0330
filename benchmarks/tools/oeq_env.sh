#!/usr/bin/env bash
# OpenEquivariance on the GPU machine, for the benchmarks' `oeq` implementation. Source it:
#   . benchmarks/tools/oeq_env.sh        (from the repository root, after /tmp/site holds the .whl wheels)
#
# OpenEquivariance 0.7.0 is an sdist whose torch extension is compiled at import
# (torch.utils.cpp_extension + ninja + pybind11) against a CUDA toolkit directory ($CUDA_HOME).
# The GPU image has the CUDA runtime, NVRTC and cuBLAS as pip `nvidia-*` packages but no toolkit
# directory, and two header sets are missing: crt/host_defines.h (nvidia-cuda-crt) and nv/target
# (nvidia-cuda-cccl). This script
#   1. installs ninja and pybind11 from .whl_oeq/ into /tmp/site and unpacks the package directory of
#      the sdist there (only its JAX extension needs the sdist's CMake build: not used);
#   2. assembles $CUDA_HOME (default /tmp/cudahome) from symlinks: every nvidia-* include directory plus
#      the two header wheels, every nvidia-* shared library and the driver's libcuda.so;
#   3. exports CUDA_HOME, LIBRARY_PATH and LD_LIBRARY_PATH.
# .whl_oeq/ holds (fetch on a machine with the package index, see benchmarks/README.md):
#   openequivariance-0.7.0.tar.gz, ninja, pybind11 (py3.12 manylinux wheels),
#   nvidia-cuda-crt 13.5.37 and nvidia-cuda-cccl 13.0.85 (header-only wheels).
# The first import compiles the extension (~30 s on the H100 host, once per machine); each new
# problem then JIT-compiles its kernels with NVRTC (seconds).
OEQ_DIR=${OEQ_DIR:-.whl_oeq}
SITE=${OEQ_SITE:-/tmp/site}
if [ ! -d "$SITE/openequivariance" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$OEQ_DIR"/ninja-*.whl "$OEQ_DIR"/pybind11-*.whl
  tmp=$(mktemp -d) && tar -xzf "$OEQ_DIR"/openequivariance-0.7.0.tar.gz -C "$tmp" \
    && cp -r "$tmp"/openequivariance-0.7.0/openequivariance "$SITE/" && rm -rf "$tmp"
fi
HDR=${OEQ_HEADERS:-/tmp/oeq_headers}
if [ ! -d "$HDR/crt" ]; then
  mkdir -p "$HDR/crt" "$HDR/cccl"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$OEQ_DIR"/nvidia_cuda_crt-*.whl "$HDR/crt"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$OEQ_DIR"/nvidia_cuda_cccl-*.whl "$HDR/cccl"
fi
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
CH=${CUDA_HOME_DIR:-/tmp/cudahome}
if [ ! -d "$CH/lib64" ]; then
  mkdir -p "$CH/include" "$CH/lib64"
  for d in "$SP"/nvidia/*/include "$SP"/nvidia/cu13/include; do [ -d "$d" ] && cp -rsn "$d"/. "$CH/include/" 2>/dev/null; done
  for d in "$HDR"/crt/nvidia/*/include "$HDR"/cccl/nvidia/*/include; do [ -d "$d" ] && cp -rsn "$d"/. "$CH/include/" 2>/dev/null; done
  for f in $(find "$SP/nvidia" -name 'lib*.so*' 2>/dev/null); do
    b=$(basename "$f"); ln -sf "$f" "$CH/lib64/$b"; ln -sf "$f" "$CH/lib64/${b%%.so*}.so"
  done
  for l in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1; do
    [ -f "$l" ] && ln -sf "$l" "$CH/lib64/libcuda.so"
  done
fi
export CUDA_HOME=$CH LIBRARY_PATH=$CH/lib64 LD_LIBRARY_PATH=$CH/lib64:${LD_LIBRARY_PATH:-}
export PATH=$SITE/bin:$PATH  # ninja's entry point
