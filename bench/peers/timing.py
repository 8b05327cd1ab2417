"""The peer scripts' one timing loop and the machine line of their tables (they import it as
`timing`: Python puts the script's own folder, bench/peers, first on sys.path)."""
import json
import subprocess
import time


def machine_line(cpu, cpus, flags, simd_target, onednn_isa):
    """'AMD EPYC, 2 vCPUs; flags: avx2 avx512_bf16 ...; Highway: AVX3; oneDNN isa: avx512_core_bf16':
    the header line of every peer table (qkv/machine.h's fields; the isa ends in
    ' (ONEDNN_MAX_CPU_ISA=...)' where that variable caps it, the Highway target in
    ' (QKV_MAX_SIMD_TARGET=...)' where that one caps it). The callers add their thread count."""
    return f"{cpu}, {cpus} vCPUs; flags: {flags}; Highway: {simd_target}; oneDNN isa: {onednn_isa}"


def machine_of_cli(qkv):
    """The machine line from `qkv info --json` (qkv: the CLI's path)."""
    info = json.loads(subprocess.run([qkv, "info", "--json"], capture_output=True, text=True, check=True).stdout)
    flags = "unknown" if info["isa_flags"] is None else " ".join(info["isa_flags"]) or "none"
    simd_target = info["simd_target"]
    if info.get("simd_target_cap"):
        simd_target += f" (QKV_MAX_SIMD_TARGET={info['simd_target_cap']})"
    return machine_line(info["cpu_model"], info["logical_cpus"], flags, simd_target, info["onednn_isa"])


def machine_of_benchmark(context):
    """The machine line from the "context" of a qkv Google Benchmark program's JSON output
    (bench/bench_main.h records cpu, cpu_isa, simd_target and onednn_isa there)."""
    return machine_line(context.get("cpu", "?"), context.get("num_cpus", "?"), context.get("cpu_isa", "?"),
                        context.get("simd_target", "?"), context.get("onednn_isa", "?"))


def best_seconds(fn, min_time, min_runs=1, warm_up=True):
    """Best wall time of repeated calls of fn: at least min_runs calls and at least
    min_time seconds of timed calls, after one untimed warm-up call if warm_up."""
    if warm_up:
        fn()
    best, total, runs = float("inf"), 0.0, 0
    while runs < min_runs or total < min_time:
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
        best, total, runs = min(best, s), total + s, runs + 1
    return best
