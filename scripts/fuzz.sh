#!/usr/bin/env bash
# Runs every libFuzzer target BUILD_DIR/*_fuzzer for SECONDS each, one after the other.
#
#   scripts/fuzz.sh BUILD_DIR SECONDS        (make fuzz does: scripts/fuzz.sh build/fuzz 300)
#
# Each target NAME_fuzzer works on fuzz/work/NAME (gitignored), seeded from the
# committed fuzz/corpus/NAME, and uses fuzz/corpus/NAME.dict when present.
# Crashing inputs go to fuzz/artifacts/ (gitignored); logs to fuzz/work/NAME.log.
# Exits non-zero when any target reports a finding.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS]" >&2
  exit 2
fi
build=$1
seconds=${2:-300}
root=$(cd "$(dirname "$0")/.." && pwd)

shopt -s nullglob
fuzzers=("$build"/*_fuzzer)
if [ ${#fuzzers[@]} -eq 0 ]; then
  echo "fuzz.sh: no *_fuzzer binaries in $build (configure with: cmake --preset fuzz)" >&2
  exit 2
fi

mkdir -p "$root/fuzz/artifacts" "$root/fuzz/work"
failed=()
for fuzzer in "${fuzzers[@]}"; do
  name=$(basename "$fuzzer" _fuzzer)
  work="$root/fuzz/work/$name"
  log="$root/fuzz/work/$name.log"
  mkdir -p "$work"
  # Seeds are copied, not used in place, so the committed corpus never grows by accident.
  if [ -d "$root/fuzz/corpus/$name" ]; then
    cp -n "$root/fuzz/corpus/$name"/* "$work"/ 2>/dev/null || true
  fi
  args=("$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$root/fuzz/artifacts/$name-")
  if [ -f "$root/fuzz/corpus/$name.dict" ]; then
    args+=(-dict="$root/fuzz/corpus/$name.dict")
  fi
  echo "== $name: ${seconds}s on $work (log: $log)"
  if "$fuzzer" "${args[@]}" >"$log" 2>&1; then
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
echo "fuzz.sh: ${#fuzzers[@]} target(s), ${seconds}s each, no findings"
