#!/usr/bin/env bash
# Packs qkv's programs for the GPU machine (docs/cuda.md, "Benchmarking on a GPU machine").
#
#   tools/device/bundle.sh <build-dir> <out-dir> [program ...]
#
# Programs are paths relative to <build-dir> (default: qkv_cuda_tests attention_cuda_bench;
# a bare name is also looked for in <build-dir>/bin). They are copied to <out-dir>/bin, and
# every shared library they load here that the GPU machine may lack goes, under the name the
# programs ask for, into <out-dir>/libs.tar.xz (lib/...); with BUNDLE_XZ_PROGRAMS=1 the
# programs go into <out-dir>/programs.tar.xz (bin/...) instead of <out-dir>/bin. Left out, because the GPU machine
# (Ubuntu 24.04-like, glibc 2.39, NVIDIA driver, CUDA toolkit in /usr/local/cuda) has its
# own: glibc's libraries and the dynamic loader, libstdc++, libgcc_s, the driver's libcuda
# and the toolkit's libcudart/libcublas/libcublasLt (a newer glibc and libstdc++ run what
# was built against older ones; a driver library must match the driver). BUNDLE_EXCLUDE
# (an extended regex on the library's name) replaces that list. <out-dir>/manifest.txt
# records the build (commit, OS, nvcc), the programs, the packed libraries and the ones
# the GPU machine must supply, which tools/device/unbundle.sh looks for there.
#
# The working tree and the carried folders travel together and must stay under 64 MiB,
# hence xz. <out-dir> inside this repository is added to .git/info/exclude (it is carried,
# never committed). Exit status: 0, or 1 with a message (a program missing, a library
# that ldd cannot resolve here).
set -euo pipefail

usage() {
  echo "usage: $0 <build-dir> <out-dir> [program ...]" >&2
  exit 1
}
[[ $# -ge 2 ]] || usage
build=$1
out=$2
shift 2
programs=("$@")
[[ ${#programs[@]} -gt 0 ]] || programs=(qkv_cuda_tests attention_cuda_bench)
exclude=${BUNDLE_EXCLUDE:-'^(linux-vdso|linux-gate|ld-linux[^/]*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libnsl|libBrokenLocale|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so'}

find_program() {
  local name=$1
  for candidate in "$build/$name" "$build/bin/$name"; do
    if [[ -f $candidate && -x $candidate ]]; then
      echo "$candidate"
      return 0
    fi
  done
  echo "bundle.sh: no program $name in $build (nor $build/bin): build it first" >&2
  return 1
}

paths=()
for p in "${programs[@]}"; do
  paths+=("$(find_program "$p")")
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/bin" "$out"
rm -rf "${out:?}/bin" "$out/libs.tar.xz" "$out/programs.tar.xz" "$out/manifest.txt"
if [[ ${BUNDLE_XZ_PROGRAMS:-0} == 1 ]]; then
  bin=$stage/bin # packed below into programs.tar.xz
else
  bin=$out/bin
  mkdir -p "$bin"
fi

# ldd's lines: "libfoo.so.1 => /path/libfoo.so.1 (0x...)", "/lib64/ld-linux... (0x...)",
# "linux-vdso.so.1 (0x...)", or "libfoo.so.1 => not found".
declare -A packed=() machine=()
for path in "${paths[@]}"; do
  cp -p "$path" "$bin/"
  while read -r name arrow target _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $name =~ $exclude ]]; then
      machine[$name]=1 # found here or not (libcuda.so.1 needs a driver): the GPU machine's
    elif [[ $target == not ]]; then
      echo "bundle.sh: $path needs $name, which ldd cannot find here" >&2
      exit 1
    elif [[ -z ${packed[$name]:-} ]]; then
      cp -L "$target" "$stage/lib/$name"
      packed[$name]=$target
    fi
  done < <(ldd "$path")
done

tar -C "$stage" -cf - lib | xz -T2 -6 >"$out/libs.tar.xz"
if [[ $bin == "$stage/bin" ]]; then
  tar -C "$stage" -cf - bin | xz -T2 -6 >"$out/programs.tar.xz"
fi

{
  echo "# tools/device/bundle.sh $build $out ${programs[*]}"
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), $(ldd --version | head -1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'none')"
  echo "cuda_compiler: $(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | tail -1)"
  for path in "${paths[@]}"; do
    echo "program: $(basename "$path") $(stat -L -c %s "$path") $(sha256sum "$path" | cut -c1-16)"
  done
  for name in $(printf '%s\n' "${!packed[@]}" | sort); do
    echo "packed: $name $(stat -c %s "$stage/lib/$name") ${packed[$name]}"
  done
  # unbundle.sh looks for these on the GPU machine
  echo "machine: $(printf '%s\n' "${!machine[@]}" | sort | tr '\n' ' ')"
} >"$out/manifest.txt"

git_dir=$(git rev-parse --git-common-dir 2>/dev/null || true)
top=$(git rev-parse --show-toplevel 2>/dev/null || true)
abs_out=$(cd "$out" && pwd)
if [[ -n $top && $abs_out == "$top"/* ]] && ! git check-ignore -q "$out/manifest.txt"; then
  echo "/${abs_out#"$top"/}/" >>"$git_dir/info/exclude"
  echo "bundle.sh: added /${abs_out#"$top"/}/ to $git_dir/info/exclude (carry it, do not commit it)" >&2
fi

bytes() { du -cb "$@" | tail -1 | cut -f1; }
echo "bundle.sh: ${#packed[@]} libraries, $(bytes "$stage/lib") bytes unpacked -> libs.tar.xz $(stat -c %s "$out/libs.tar.xz") bytes"
echo "bundle.sh: $out weighs $(bytes "$out") bytes; the machine supplies: ${!machine[*]}"
if [[ -n $top ]]; then
  # What travels: tracked and untracked-not-ignored files (du counts each file once) and $out.
  tree=$(cd "$top" && git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  total=$((tree + $(bytes "$out")))
  echo "bundle.sh: working tree $tree bytes + $out = $total bytes of the 67108864 (64 MiB) that may travel"
  if ((total > 62914560)); then
    echo "bundle.sh: over 60 MiB: BUNDLE_XZ_PROGRAMS=1 packs the programs too (unbundle.sh unpacks them)" >&2
  fi
fi
