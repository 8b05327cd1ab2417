#!/usr/bin/env bash
# shellcheck disable=SC2317 # the functions below run through step's `bash -c`, unseen by shellcheck
# The one command for the GPU machine (docs/cuda.md, "Benchmarking on a GPU machine"):
# the CUDA tests, a compute-sanitizer pass and the benchmark beside PyTorch, in one run.
#
#   here:  tools/device/bundle.sh build/release .cuda_bundle
#   there: bash tools/device/cuda_checks.sh [limit-seconds, default 420] [bundle, default .cuda_bundle]
#          (device run, carry [".cuda_bundle"], timeout_s about limit + 60)
#
# Steps, in this order, each under `timeout`, each one's failure reported without
# stopping the next; the limits shrink so that the whole script ends within the limit:
#   1. the machine: nvidia-smi, nvcc --version, python3's torch and its view of the GPU
#   2. tools/device/unbundle.sh (without the bundle nothing else runs: exit 2)
#   3. qkv_cuda_tests --gtest_filter=$CUDA_TESTS_FILTER (default '*'); then, when
#      $CUDA_TEST_VARIANTS is set, again under each of its VAR=value:FILTER entries
#   4. attention_cuda_bench $CUDA_BENCH_ARGS, JSON to $OUT/qkv_bench.json (a benchmark
#      that ended with an error fails the step, although the program exits 0)
#   5. bench/peers/sdpa_cuda.py $CUDA_PEER_ARGS on the same GPU, to $OUT/torch_bench.json
#   6. bench/peers/cuda_report.py: the Markdown table (also $OUT/report.md); then, when
#      $CUDA_BENCH_VARIANTS is set, the benchmark again under each of its VAR=value settings;
#      with attention_backward_cuda_bench in the bundle, the backward beside torch's (tables
#      appended to report.md); when $CUDA_NCU_FILTER is set, ncu on the benchmarks it
#      selects in $CUDA_NCU_PROGRAM (default attention_cuda_bench; $OUT/ncu.txt); when
#      the bundle has pylibs/ or pylibs.tar.xz (docs/python.md), the Python GPU tests on an
#      extension built there
#   7. compute-sanitizer memcheck on qkv_cuda_tests --gtest_filter=$CUDA_SANITIZE_FILTER
#      (default 'CudaAttention*Small*:CudaAttentionBackward.FullyMaskedRows'; matching no
#      test counts as a failure), then racecheck on $CUDA_RACECHECK_FILTER when set; last,
#      so that a slow sanitizer run cannot take the benchmark's time
# then one line per step (ok, FAILED rc, TIMED OUT, skipped) and its seconds. Exit status:
# 0 when every step passed, 1 otherwise, 2 without the bundle.
#
# $OUT (the device tool's folder; a new temporary folder elsewhere) gets at most 7 files,
# all at its top: checks.log (everything printed), cuda_tests.json, cuda_tests.log,
# qkv_bench.json, torch_bench.json, report.md, sanitizer.log. PYTHON (default python3)
# runs the peer and the report.
set -x
set -u -o pipefail

limit=${1:-420}
bundle=${2:-.cuda_bundle}
export bundle
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHON=${PYTHON:-python3}
deadline=$((SECONDS + limit))
exec > >(tee "$OUT/checks.log") 2>&1
tee_pid=$!
export OUT
summary=()
failed=0

# budget MAX RESERVE: the seconds a step may take: at most MAX, and never past the deadline
# less RESERVE seconds kept for the steps after it (as planned for 420 s, scaled to the limit).
budget() {
  local left=$((deadline - SECONDS - $2 * limit / 420))
  echo $(($1 < left ? $1 : left))
}

# step NAME MAX RESERVE COMMAND...: runs COMMAND (a program or a function below) under
# timeout for budget MAX RESERVE seconds and records how it ended.
step() {
  local - # the tracing of this bookkeeping stays off; the command is echoed instead
  set +x
  local name=$1 t
  t=$(budget "$2" "$3")
  shift 3
  if ((t < 5)); then
    echo "== $name: skipped, ${t}s left for it before the deadline"
    summary+=("$name: skipped (no time left)")
    failed=1
    return 0
  fi
  echo "== $name: timeout ${t}s: $*"
  local begin=$SECONDS rc
  if declare -F "$1" >/dev/null; then # timeout runs programs: a function runs in a bash
    timeout -k 10 "$t" bash -c '"$@"' "$1" "$@"
  else
    timeout -k 10 "$t" "$@"
  fi
  rc=$?
  local took=$((SECONDS - begin))
  if ((rc == 0)); then
    summary+=("$name: ok, ${took}s")
  elif ((rc == 124 || rc == 137)); then
    summary+=("$name: TIMED OUT after ${took}s (limit ${t}s)")
    failed=1
  else
    summary+=("$name: FAILED rc=$rc, ${took}s")
    failed=1
  fi
  echo "== $name: rc=$rc, ${took}s"
  return 0
}

# runs "$@" with its output in FILE only, then prints FILE's last 30 lines (gtest and
# compute-sanitizer end with their summaries); the exit status is the command's.
logged() {
  local file=$1 rc
  shift
  "$@" >"$file" 2>&1
  rc=$?
  tail -n 30 "$file"
  return "$rc"
}

# compute-sanitizer with qkv_cuda_tests; a filter that matches no test is a failure.
sanitize() {
  local sanitizer
  sanitizer=$(find_tool compute-sanitizer) || {
    echo "no compute-sanitizer on PATH nor in /usr/local/cuda*/bin"
    return 3
  }
  logged "$OUT/sanitizer.log" env LD_LIBRARY_PATH="$QKV_LD" "$sanitizer" --tool memcheck --error-exitcode 99 \
    --print-limit 20 "$QKV_BUNDLE_BIN/qkv_cuda_tests" --gtest_filter="${CUDA_SANITIZE_FILTER:-CudaAttention*Small*:CudaAttentionBackward.FullyMaskedRows}"
  local rc=$?
  if grep -q '^\[==========\] 0 tests' "$OUT/sanitizer.log"; then
    echo "the filter matched no test: nothing was sanitized"
    return 4
  fi
  ((rc == 0)) || return "$rc"
  [[ -n ${CUDA_RACECHECK_FILTER:-} ]] || return 0
  # shared-memory races (racecheck) on $CUDA_RACECHECK_FILTER, appended to the same log
  env LD_LIBRARY_PATH="$QKV_LD" "$sanitizer" --tool racecheck --error-exitcode 99 --print-limit 20 \
    "$QKV_BUNDLE_BIN/qkv_cuda_tests" --gtest_filter="$CUDA_RACECHECK_FILTER" >>"$OUT/sanitizer.log" 2>&1
  rc=$?
  tail -n 8 "$OUT/sanitizer.log"
  return "$rc"
}

# attention_cuda_bench; a benchmark that skipped with an error (SkipWithError exits 0) fails.
qkv_bench() {
  env LD_LIBRARY_PATH="$QKV_LD" "$QKV_BUNDLE_BIN/attention_cuda_bench" --benchmark_out="$OUT/qkv_bench.json" \
    --benchmark_out_format=json "$@" || return
  local errors
  errors=$(grep -c '"error_occurred": true' "$OUT/qkv_bench.json")
  if ((errors > 0)); then
    echo "$errors benchmarks ended with an error (their error_message is in qkv_bench.json)"
    return 5
  fi
}

# qkv_cuda_tests again per entry of $CUDA_TEST_VARIANTS (space-separated VAR=value:FILTER,
# e.g. "QKV_CUDA_BWD_BC=128:CudaAttentionBackward.*"): the kernels' other configurations.
test_variants() {
  local entry rc=0 log=/tmp/qkv_test_variant.log
  for entry in ${CUDA_TEST_VARIANTS:-}; do
    echo "-- ${entry%%:*} --gtest_filter=${entry#*:}"
    env LD_LIBRARY_PATH="$QKV_LD" "${entry%%:*}" "$QKV_BUNDLE_BIN/qkv_cuda_tests" --gtest_filter="${entry#*:}" >"$log" 2>&1 ||
      rc=1
    grep -E '^\[  (PASSED|FAILED) |^\[==========\]|Failure|error' "$log" | head -n 20
  done
  return "$rc"
}

# attention_cuda_bench once per setting of $CUDA_BENCH_VARIANTS (space-separated
# VAR=value, e.g. "QKV_CUDA_FLASH_GROUP=1 QKV_CUDA_ALLOC=plain"), each benchmark's
# TFLOP/s printed (the JSON is not kept: $OUT returns at most 8 files).
bench_variants() {
  local setting tmp
  tmp=$(mktemp -d)
  for setting in ${CUDA_BENCH_VARIANTS:-}; do
    echo "-- $setting"
    # shellcheck disable=SC2086 # CUDA_BENCH_ARGS is a list of arguments
    env LD_LIBRARY_PATH="$QKV_LD" "$setting" "$QKV_BUNDLE_BIN/attention_cuda_bench" --benchmark_out="$tmp/b.json" \
      --benchmark_out_format=json --benchmark_filter=BM_AttentionCuda ${CUDA_BENCH_ARGS:-} >/dev/null || return
    "$PYTHON" -c 'import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    print("%-64s %8.1f TFLOP/s" % (b["name"], b.get("TFLOPs", 0)))' "$tmp/b.json" || return
  done
}

# The backward: attention_backward_cuda_bench under each setting of $CUDA_BWD_SETTINGS
# (space-separated; a setting is VAR=value[,VAR=value...]; default "QKV_CUDA_BWD_BC=64
# QKV_CUDA_BWD_BC=128", the two key tiles), torch's flash SDPA backward on the same
# shapes, and one table per setting, printed and appended to $OUT/report.md (the JSON
# stays in /tmp/qkv_backward: $OUT returns at most 8 files).
backward_bench() {
  set -o pipefail # (step runs this in a new bash, which does not inherit it)
  local tmp=/tmp/qkv_backward setting n=0 vars
  mkdir -p "$tmp"
  local settings=${CUDA_BWD_SETTINGS:-QKV_CUDA_BWD_BC=64 QKV_CUDA_BWD_BC=128}
  for setting in $settings; do
    IFS=, read -ra vars <<<"$setting"
    env LD_LIBRARY_PATH="$QKV_LD" "${vars[@]}" "$QKV_BUNDLE_BIN/attention_backward_cuda_bench" \
      --benchmark_out="$tmp/qkv_$((n++)).json" --benchmark_out_format=json || return
  done
  "$PYTHON" bench/peers/sdpa_cuda.py --backward --gemm 0 --out "$tmp/torch.json" || return
  n=0
  for setting in $settings; do
    printf '\n%s\n\n' "Backward, $setting:" | tee -a "$OUT/report.md"
    # the index moves outside the pipeline: a pipeline's commands run in subshells, so an
    # $((n++)) there never reached this loop and every table read qkv_0.json (the H200 run of
    # 2026-11-26 19:13 printed the 64-key tile's numbers under both settings)
    local json=$tmp/qkv_$n.json
    n=$((n + 1))
    "$PYTHON" bench/peers/cuda_report.py --backward --qkv "$json" --torch "$tmp/torch.json" \
      ${cuda_runtime:+--cuda-runtime "$cuda_runtime"} | tee -a "$OUT/report.md" || return
  done
}

# Nsight Compute on attention_cuda_bench --benchmark_filter=$CUDA_NCU_FILTER: the first
# $CUDA_NCU_COUNT (default 2) FlashAttention launches, clocks left alone, the sections that
# say where a kernel's time goes; the report to $OUT/ncu.txt.
profile() {
  local ncu
  ncu=$(find_tool ncu) || {
    echo "no ncu on PATH nor in /usr/local/cuda*/bin"
    return 3
  }
  logged "$OUT/ncu.txt" "$ncu" --clock-control none -k regex:flash_ -c "${CUDA_NCU_COUNT:-2}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    env LD_LIBRARY_PATH="$QKV_LD" "$QKV_BUNDLE_BIN/${CUDA_NCU_PROGRAM:-attention_cuda_bench}" \
    --benchmark_filter="$CUDA_NCU_FILTER" --benchmark_min_time=0.01
}

# The Python GPU tests (pytest -m cuda: test_cuda.py, test_qkv_torch_cuda.py) on an extension built
# here by tools/device/build_python_ext.sh from the bundle's static libraries: pylibs/
# (docs/python.md), or pylibs.tar.xz (the same, packed: `tar cJf pylibs.tar.xz -C pylibs .`).
python_gpu_tests() {
  set -o pipefail # a failing pytest must fail the step through `| tail`
  local libs=/tmp/qkvpy ext=/tmp/qkv_pyext static=$bundle/pylibs
  mkdir -p "$libs" && tar xJf "$bundle/libs.tar.xz" -C "$libs" || return
  if [[ -f $bundle/pylibs.tar.xz ]]; then # the static libraries, packed to fit the 64 MiB that travel
    static=/tmp/qkv_pylibs
    mkdir -p "$static" && tar xJf "$bundle/pylibs.tar.xz" -C "$static" || return
  fi
  bash tools/device/build_python_ext.sh -L "$libs/lib" "$static" "$ext" >"$ext.log" 2>&1 || {
    tail -n 30 "$ext.log"
    return 6
  }
  PYTHONPATH=$ext "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests/python/test_cuda.py \
    tests/python/test_qkv_torch_cuda.py 2>&1 | tail -n 40
}

# find_tool NAME: NAME on PATH, else in a CUDA toolkit's bin folder (not always on PATH).
find_tool() {
  command -v "$1" && return 0
  local candidate
  for candidate in /usr/local/cuda/bin/"$1" /usr/local/cuda-*/bin/"$1"; do
    [[ -x $candidate ]] && echo "$candidate" && return 0
  done
  return 1
}

nvcc_version() {
  local nvcc
  nvcc=$(find_tool nvcc) || return 3
  "$nvcc" --version
}

gpu_state() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv
}
torch_versions() {
  "$PYTHON" -c 'import torch, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda runtime", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "gpus", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(0), f"cc {p.major}.{p.minor}", p.multi_processor_count, "SMs",
          round(p.total_memory / 2**30, 1), "GiB")'
}
export -f logged sanitize qkv_bench test_variants bench_variants backward_bench profile python_gpu_tests find_tool nvcc_version gpu_state torch_versions

# closes checks.log (tee ends once this script's output is closed) and exits with $1.
finish() {
  set +x
  exec >&- 2>&-
  wait "$tee_pid"
  exit "$1"
}

if [[ ! -f $bundle/libs.tar.xz ]]; then # before spending device time on the rest
  echo "== no bundle: $bundle/libs.tar.xz is missing (tools/device/bundle.sh makes it; carry $bundle)"
  finish 2
fi

# 1. the machine
step nvidia-smi 20 330 nvidia-smi
step gpu-before 10 330 gpu_state
step nvcc 10 330 nvcc_version
step torch 60 330 torch_versions

# 2. the bundle. Its library path goes to qkv's programs alone (QKV_LD), not to python3 or
# nvidia-smi, which must keep the machine's own libssl, libz, ...
inherited_ld=${LD_LIBRARY_PATH-}
unbundle_env=$(timeout -k 10 "$(budget 120 230)" bash tools/device/unbundle.sh "$bundle")
unbundle_rc=$?
echo "$unbundle_env"
if [[ $unbundle_rc == 2 || -z $unbundle_env ]]; then
  echo "== no bundle ($bundle, or no time to unpack it): nothing of qkv can run"
  finish 2
fi
eval "$unbundle_env"
export QKV_LD=$LD_LIBRARY_PATH LD_LIBRARY_PATH=$inherited_ld
[[ -n $inherited_ld ]] || unset LD_LIBRARY_PATH
summary+=("unbundle: $([[ $unbundle_rc == 0 ]] && echo ok || echo "rc=$unbundle_rc (libraries not found, above)")")
grep -v '^packed:' "$bundle/manifest.txt"
cuda_runtime=$(sed -n 's/^cuda_compiler: //p' "$bundle/manifest.txt")
export cuda_runtime

# 3. tests
step cuda-tests 150 230 logged "$OUT/cuda_tests.log" env LD_LIBRARY_PATH="$QKV_LD" "$QKV_BUNDLE_BIN/qkv_cuda_tests" \
  --gtest_filter="${CUDA_TESTS_FILTER:-*}" --gtest_output="json:$OUT/cuda_tests.json"

[[ -n ${CUDA_TEST_VARIANTS:-} ]] && step test-variants 60 200 test_variants

# 4.-6. benchmark, peer, table
# shellcheck disable=SC2086 # CUDA_BENCH_ARGS and CUDA_PEER_ARGS are lists of arguments
step qkv-bench 120 120 qkv_bench ${CUDA_BENCH_ARGS:-}
step gpu-after 10 110 gpu_state
# shellcheck disable=SC2086
step torch-bench 90 25 env PYTHONUNBUFFERED=1 "$PYTHON" bench/peers/sdpa_cuda.py --out "$OUT/torch_bench.json" \
  ${CUDA_PEER_ARGS:-}
step report 20 5 "$PYTHON" bench/peers/cuda_report.py --qkv "$OUT/qkv_bench.json" --torch "$OUT/torch_bench.json" \
  ${cuda_runtime:+--cuda-runtime "$cuda_runtime"} --out "$OUT/report.md"

[[ -x $QKV_BUNDLE_BIN/attention_backward_cuda_bench ]] && step backward-bench 90 5 backward_bench
[[ -n ${CUDA_BENCH_VARIANTS:-} ]] && step bench-variants 60 5 bench_variants
[[ -n ${CUDA_NCU_FILTER:-} ]] && step ncu 90 5 profile
[[ -d $bundle/pylibs || -f $bundle/pylibs.tar.xz ]] && step python-gpu-tests 120 5 python_gpu_tests

# 7. sanitizer
step sanitizer 90 5 sanitize

set +x
files=("$OUT"/*)
echo "== summary (${SECONDS}s of the ${limit}s limit; in $OUT: ${files[*]##*/})"
printf '  %s\n' "${summary[@]}"
finish "$failed"
