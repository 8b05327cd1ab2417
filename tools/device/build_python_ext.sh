#!/usr/bin/env bash
# Builds the _qkv extension for THIS machine's python3 from qkv's static libraries
# built elsewhere (build/<preset>/src/libqkv_*.a), without CMake: for the device
# machine, whose Python (3.12) differs from the build machine's (3.11) and which has
# no oneDNN / OpenBLAS / HDF5 development packages (their shared objects
# travel in a folder, -L). docs/python.md ("CUDA tensors") shows the whole sequence.
#
#   tools/device/build_python_ext.sh [-L <shared-lib-dir>] [-j N] <static-lib-dir> <out-dir>
#
# Compiles python/src/*.cc and nanobind's sources (those nb_combined.cpp includes)
# with python3's headers (-O2 -std=c++20 -fPIC, N jobs, default: all cores) and
# links them with the static libraries libqkv_*.a and libhwy.a (one group: no order to get wrong), the
# CUDA runtime when the libraries were built with it (libcudart_static.a of the
# toolkit: $CUDA_HOME, else nvcc's, else /usr/local/cuda), and every shared object in
# <shared-lib-dir> (as needed; rpath set to that folder). <out-dir> then holds
# qkv/ (python/qkv/*.py and the extension): PYTHONPATH=<out-dir> imports it.
# Environment: PYTHON (default python3), QKV_CXX (default g++ on PATH), CUDA_HOME, QKV_LDFLAGS,
# QKV_MPI=1 to build qkv.dist's MPI bindings (libqkv_dist.a and MPI's headers needed; off by default).
set -euo pipefail

usage() {
  echo "usage: $0 [-L <shared-lib-dir>] [-j N] <static-lib-dir> <out-dir>" >&2
  exit 2
}
shared_dir=""
jobs=$(nproc)
while getopts "L:j:" opt; do
  case $opt in
    L) shared_dir=$(realpath "$OPTARG") ;;
    j) jobs=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || usage
lib_dir=$(realpath "$1")
out_dir=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
# Not $CXX: the device image sets CXX=/opt/gcc/bin/g++, whose libstdc++ ends up inside the
# module (exported __cxa_throw), and every qkv exception then crashed once NumPy had
# loaded the system libstdc++ first. The system g++ links the shared libstdc++.
cxx=${QKV_CXX:-g++}

nb_include=$("$py" -m nanobind --include_dir)
nb_root=$(dirname "$nb_include")
py_include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext_suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
version=$(sed -n 's/^project(qkv VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")

# nanobind's own sources: the ones its single-file build includes (the set changes
# between nanobind versions); nb_ft.cpp only for free-threaded Pythons.
free_threaded=$("$py" -c 'import sysconfig; print(int(bool(sysconfig.get_config_var("Py_GIL_DISABLED"))))')
nb_sources=()
for f in $(sed -n 's/^#[[:space:]]*include "\(.*\.cpp\)"/\1/p' "$nb_root/src/nb_combined.cpp"); do
  if [ "$f" = nb_ft.cpp ] && [ "$free_threaded" = 0 ]; then continue; fi
  nb_sources+=("$nb_root/src/$f")
done

# Every qkv layer library there (one link group: no order to get wrong); qkv_dist only
# with QKV_MPI=1 (the device has no MPI; bind_dist.cc then binds `available = False`).
defines="-DQKV_VERSION=\\\"$version\\\""
if [ "${QKV_MPI:-0}" = 1 ]; then defines="$defines -DQKV_HAVE_MPI=1 $(mpicxx --showme:compile)"; fi
static_paths=()
for a in "$lib_dir"/libqkv_*.a; do
  if [ "$(basename "$a")" = libqkv_dist.a ] && [ "${QKV_MPI:-0}" != 1 ]; then continue; fi
  static_paths+=("$a")
done
for l in runtime tensor ops nn io io_keras io_png; do
  [ -f "$lib_dir/libqkv_$l.a" ] || { echo "$0: $lib_dir/libqkv_$l.a is missing" >&2; exit 1; }
done
# Highway, built with qkv as a static library (cmake/QkvHighway.cmake: build/<preset>/_deps/hwy-build/libhwy.a)
[ -f "$lib_dir/libhwy.a" ] || { echo "$0: $lib_dir/libhwy.a is missing (build/<preset>/_deps/hwy-build)" >&2; exit 1; }
static_paths+=("$lib_dir/libhwy.a")

# The CUDA runtime, when the static libraries call it (a QKV_CUDA build).
cuda_libs=""
if nm "${static_paths[@]}" 2>/dev/null | grep -E ' U (cuda[A-Z]|__cuda)' >/dev/null; then  # not -q: nm's SIGPIPE would fail the pipe
  cuda_home=${CUDA_HOME:-}
  if [ -z "$cuda_home" ] && command -v nvcc >/dev/null; then cuda_home=$(dirname "$(dirname "$(command -v nvcc)")"); fi
  cuda_home=${cuda_home:-/usr/local/cuda}
  cudart=""
  for d in lib64 lib targets/x86_64-linux/lib; do
    if [ -f "$cuda_home/$d/libcudart_static.a" ]; then cudart="$cuda_home/$d/libcudart_static.a"; break; fi
  done
  [ -n "$cudart" ] || { echo "$0: libcudart_static.a not found under $cuda_home (set CUDA_HOME)" >&2; exit 1; }
  cuda_libs="$cudart -lrt -ldl -lpthread"
fi

shared_libs=""
if [ -n "$shared_dir" ]; then
  shared_libs="-Wl,--as-needed $(find "$shared_dir" -maxdepth 1 -name '*.so*' | sort | tr '\n' ' ') -Wl,--no-as-needed"
  # DT_RPATH (not RUNPATH): it also finds their own dependencies (libhdf5 -> libsz, ...) there.
  shared_libs="$shared_libs -Wl,--disable-new-dtags -Wl,-rpath,$shared_dir -L$shared_dir"
fi

obj_dir="$out_dir/obj"
module="$out_dir/qkv/_qkv$ext_suffix"
mkdir -p "$obj_dir" "$out_dir/qkv"
cp "$root"/python/qkv/*.py "$root/python/qkv/py.typed" "$out_dir/qkv/"

# A Makefile, so that make -j runs the compiles in parallel and a rerun rebuilds
# only what changed (everything when the flags changed: each target depends on it).
common="-O2 -std=c++20 -fPIC -fvisibility=hidden -fno-stack-protector -isystem $py_include -isystem $nb_include"
{
  echo "CXX := $cxx"
  echo "QKV_FLAGS := $common -fopenmp $defines -I$root/include -I$root/python/src"
  echo "NB_FLAGS := $common -DNB_BUILD -fno-strict-aliasing -isystem $nb_root/ext/robin_map/include"
  objects=()
  for src in "$root"/python/src/*.cc; do
    o="$obj_dir/$(basename "${src%.cc}").o"
    objects+=("$o")
    printf '%s: %s %s\n\t$(CXX) $(QKV_FLAGS) -MMD -c $< -o $@\n' "$o" "$src" "$out_dir/Makefile"
  done
  for src in "${nb_sources[@]}"; do
    o="$obj_dir/nb_$(basename "${src%.cpp}").o"
    objects+=("$o")
    printf '%s: %s %s\n\t$(CXX) $(NB_FLAGS) -c $< -o $@\n' "$o" "$src" "$out_dir/Makefile"
  done
  printf '%s: %s %s %s\n' "$module" "${objects[*]}" "${static_paths[*]}" "$out_dir/Makefile"
  printf '\t$(CXX) -shared -fopenmp -Wl,--gc-sections %s -o $@ %s -Wl,--start-group %s -Wl,--end-group %s %s\n' "${QKV_LDFLAGS:-}" \
    "${objects[*]}" "${static_paths[*]}" "$cuda_libs" "$shared_libs"
  echo "-include $obj_dir/*.d"
} >"$out_dir/Makefile.new"
if cmp -s "$out_dir/Makefile.new" "$out_dir/Makefile"; then rm "$out_dir/Makefile.new"; else mv "$out_dir/Makefile.new" "$out_dir/Makefile"; fi

make -s -j "$jobs" -f "$out_dir/Makefile" "$module"
# A shared object the loader cannot find fails the import with less to go on: say it here.
if ldd "$module" | grep "not found" >&2; then
  echo "$0: $module needs the libraries above: put them in the -L folder" >&2
  exit 1
fi
"$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import qkv; print("qkv", qkv.__version__, "cuda built:", qkv.cuda.is_built(), "devices:", qkv.cuda.device_count())' "$out_dir"
echo "$module"
