#!/usr/bin/env bash
# Installs the Debian packages qkv builds with, only those missing; non-interactive.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config
  python3-venv python3-dev                      # .venv and the Python extension's headers
  clang libclang-rt-14-dev libomp-dev          # libFuzzer targets and their sanitizers
  libdnnl-dev                                   # GEMM (oneDNN); Highway 1.2.0 is built by CMake (cmake/QkvHighway.cmake)
  ocl-icd-opencl-dev                            # dnnl-config.cmake finds OpenCL; libdnnl-dev only recommends it
  libopenblas-openmp-dev                        # float64 GEMM (OpenBLAS, OpenMP threads)
  libgtest-dev libbenchmark-dev                 # tests and benchmarks
  libcli11-dev nlohmann-json3-dev               # CLI parsing, JSON headers
  libhdf5-dev zlib1g-dev                        # Keras .h5 weights, .keras zips
  libpng-dev                                    # heatmaps (qkv heatmap, qkv.plot)
  openmpi-bin libopenmpi-dev                    # qkv::dist: ring/Ulysses/tensor-parallel attention over MPI
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
