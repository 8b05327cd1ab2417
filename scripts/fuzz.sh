#!/usr/bin/env bash
# Runs every libFuzzer target BUILD_DIR/*_fuzzer, then the atheris harness over the
# Python API (fuzz/python/api_fuzzer.py, target name "api_python"), for SECONDS each,
# one after the other.
#
#   scripts/fuzz.sh BUILD_DIR [SECONDS [NAME...]]   (make fuzz: scripts/fuzz.sh build/fuzz 300)
#
# NAMEs pick targets (e.g. "einsum einops api_python"); default: all of them.
# Each target NAME works on fuzz/work/NAME (gitignored), seeded from the committed
# fuzz/corpus/NAME, and uses fuzz/corpus/NAME.dict when present.
# Crashing inputs go to fuzz/artifacts/ (gitignored); logs to fuzz/work/NAME.log.
# Exits non-zero when any target reports a finding. FUZZ_TIMEOUT (default 10) is the
# per-input limit in seconds of wall time.
#
# The Python harness imports the _qkv that BUILD_DIR built (with ASan + UBSan in the
# fuzz preset; the sanitizer runtime is then preloaded into python) or, when
# BUILD_DIR has none, the qkv installed for $FUZZ_PYTHON (default .venv/bin/python),
# which finds Python-level faults only. It needs atheris (fuzz/requirements.txt).
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS [NAME...]]" >&2
  exit 2
fi
build=$1
seconds=${2:-300}
shift $(( $# >= 2 ? 2 : 1 ))
root=$(cd "$(dirname "$0")/.." && pwd)
python=${FUZZ_PYTHON:-$root/.venv/bin/python}

shopt -s nullglob
targets=()
for fuzzer in "$build"/*_fuzzer; do targets+=("$(basename "$fuzzer" _fuzzer)"); done
if "$python" -c "import atheris" 2>/dev/null; then targets+=(api_python); fi
if [ $# -gt 0 ]; then targets=("$@"); fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no *_fuzzer binaries in $build (configure with: cmake --preset fuzz)" >&2
  exit 2
fi

# clang's ASan runtime and libFuzzer in one shared library to preload into python
# (what atheris builds as asan_with_fuzzer.so when it is compiled from source; its
# wheels lack it): the static runtimes linked whole, less asan_preinit (a .preinit_array
# is not allowed in a shared library). Built once into fuzz/work/.
asan_with_fuzzer() {
  local out="$root/fuzz/work/asan_with_fuzzer.so" rt objs
  if [ ! -f "$out" ]; then
    rt=$(clang++ -print-runtime-dir)
    objs=$(mktemp -d)
    (cd "$objs" && ar x "$rt/libclang_rt.asan-x86_64.a" && rm -f asan_preinit.cpp.o)
    clang++ -shared -o "$out" "$objs"/*.o -Wl,--whole-archive "$rt/libclang_rt.asan_cxx-x86_64.a" \
      "$rt/libclang_rt.fuzzer_no_main-x86_64.a" -Wl,--no-whole-archive -lpthread -ldl -lrt -lm -lstdc++
    rm -rf "$objs"
  fi
  echo "$out"
}

# The qkv package for the Python harness: python/qkv plus BUILD_DIR's extension.
# Prints the environment assignments (PYTHONPATH-like dir, preload) for `env`.
python_env() {
  local ext=("$build"/python/_qkv*.so)
  if [ ${#ext[@]} -eq 0 ]; then
    echo "fuzz.sh: no _qkv in $build/python; api_python runs on the qkv installed for $python" >&2
    return
  fi
  local pkg="$root/fuzz/work/python-pkg"
  rm -rf "$pkg" && mkdir -p "$pkg/qkv"
  cp "$root"/python/qkv/*.py "$pkg/qkv/" && cp "${ext[0]}" "$pkg/qkv/"
  echo "QKV_FUZZ_PYTHONPATH=$pkg"
  local undefined
  undefined=$(nm -D --undefined-only "${ext[0]}")  # not piped into grep -q: pipefail and SIGPIPE
  if [[ $undefined == *__asan_init* ]]; then
    # python itself is not instrumented: the ASan runtime (which carries UBSan's
    # handlers) goes first, together with libFuzzer so that atheris uses it (and sees
    # the extension's coverage) instead of its own; Python's allocations leak by design.
    echo "LD_PRELOAD=$(asan_with_fuzzer)"
    echo "ASAN_OPTIONS=detect_leaks=0"
  fi
}

mkdir -p "$root/fuzz/artifacts" "$root/fuzz/work"
failed=()
for name in "${targets[@]}"; do
  work="$root/fuzz/work/$name"
  log="$root/fuzz/work/$name.log"
  mkdir -p "$work"
  # Seeds are copied, not used in place, so the committed corpus never grows by accident.
  if [ -d "$root/fuzz/corpus/$name" ]; then
    cp -n "$root/fuzz/corpus/$name"/* "$work"/ 2>/dev/null || true
  fi
  # FUZZ_TIMEOUT: seconds of wall time per input (a loaded 2-core machine needs more than 10).
  args=("$work" -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$root/fuzz/artifacts/$name-")
  if [ -f "$root/fuzz/corpus/$name.dict" ]; then
    args+=(-dict="$root/fuzz/corpus/$name.dict")
  fi
  if [ "$name" = api_python ]; then
    mapfile -t envs < <(python_env)
    cmd=(env "${envs[@]}" "$python" "$root/fuzz/python/api_fuzzer.py")
  else
    cmd=("$build/${name}_fuzzer")
  fi
  echo "== $name: ${seconds}s on $work (log: $log)"
  if "${cmd[@]}" "${args[@]}" >"$log" 2>&1; then
    # The last status line has the exec count, coverage and speed.
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
  else
    echo "!! $name found a problem; last lines of $log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds}s each, no findings"
