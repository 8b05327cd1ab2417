"""qkv.machine_info(), `qkv info [--json]`, the machine line of `qkv bench` and the peer scripts'
machine() (qkv/machine.h), against /proc/cpuinfo read here on its own."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEYS = ["cpu_model", "isa_flags", "simd_target", "simd_target_cap", "onednn_isa", "logical_cpus", "threads"]


def cpuinfo_first(key):
    """The value of /proc/cpuinfo's first `key` line (qkv's tests run on x86 Linux)."""
    text = pathlib.Path("/proc/cpuinfo").read_text()
    return re.search(rf"^{key}\s*:\s*(.*)$", text, re.M).group(1)


def test_machine_info_is_proc_cpuinfo_highway_and_onednn():
    info = qkv.machine_info()
    assert list(info) == KEYS
    flags = set(cpuinfo_first("flags").split())
    wanted = sorted(f for f in flags if f in ("avx2", "fma", "f16c") or f.startswith(("avx512", "amx")))
    assert info["isa_flags"] == wanted
    assert ("avx2" in info["isa_flags"]) == ("avx2" in flags)
    assert info["cpu_model"] == cpuinfo_first("model name")
    assert info["logical_cpus"] == os.cpu_count()
    assert info["threads"] == qkv.get_num_threads()
    avx512 = {"avx512f", "avx512vl", "avx512dq", "avx512bw", "avx512cd"} <= flags
    # Highway's AVX3_DL: AVX-512 with VNNI, VPCLMULQDQ, VBMI, VBMI2, VAES, VPOPCNTDQ, BITALG, GFNI
    dl = avx512 and {"avx512_vnni", "vpclmulqdq", "avx512vbmi", "avx512_vbmi2", "vaes", "avx512_vpopcntdq",
                     "avx512_bitalg", "gfni"} <= flags
    if os.environ.get("QKV_MAX_SIMD_TARGET"):
        pytest.fail("run these tests without QKV_MAX_SIMD_TARGET (the cap's tests set it themselves)")
    if dl:
        assert info["simd_target"] == "AVX3_DL"
    elif avx512:
        assert info["simd_target"] == "AVX3"
    elif "avx2" in flags:
        assert info["simd_target"] == "AVX2"
    assert info["simd_target_cap"] is None
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if cap:
        assert info["onednn_isa"].endswith(f" (ONEDNN_MAX_CPU_ISA={cap})"), info["onednn_isa"]
    else:
        assert info["onednn_isa"].startswith("avx512_core" if avx512 else "avx2"), info["onednn_isa"]


def test_machine_info_threads_follow_set_num_threads():
    before = qkv.get_num_threads()
    try:
        qkv.set_num_threads(3)
        assert qkv.machine_info()["threads"] == 3
    finally:
        qkv.set_num_threads(before)


def test_cli_info_json_has_the_fields_of_machine_info(qkv_cli):
    env = dict(os.environ, QKV_NUM_THREADS="1")
    out = subprocess.run([qkv_cli, "info", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert list(info) == KEYS and info["threads"] == 1
    mine = qkv.machine_info()
    assert {k: info[k] for k in KEYS[:-1]} == {k: mine[k] for k in KEYS[:-1]}
    line = subprocess.run([qkv_cli, "info"], capture_output=True, text=True, env=env, timeout=60).stdout
    flags = " ".join(info["isa_flags"])
    assert line == (f"{info['cpu_model']}, {info['logical_cpus']} vCPUs, 1 thread; flags: {flags}; "
                    f"Highway: {info['simd_target']}; oneDNN isa: {info['onednn_isa']}\n")


def test_cli_info_names_the_onednn_cap(qkv_cli):
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([qkv_cli, "info", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(out.stdout)["onednn_isa"] == "avx2 (ONEDNN_MAX_CPU_ISA=AVX2)"


def test_bench_prints_the_machine_line_before_its_results(qkv_cli):
    env = dict(os.environ, QKV_NUM_THREADS="1")
    line = subprocess.run([qkv_cli, "info"], capture_output=True, text=True, env=env, timeout=60).stdout
    text = subprocess.run([qkv_cli, "bench", "attention", "--min-time", "0", "--shape", "1,1,4,4"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == "Machine: " + line.rstrip("\n")
    assert text.stdout.splitlines()[1].startswith("attention (B,H,L,D)=(1,1,4,4)")
    # --json: stdout keeps one JSON result per line; the machine line goes to stderr
    for args in (["attention", "--shape", "1,1,4,4"], ["decode", "--cache-len", "8", "--heads", "2", "--kv-heads",
                                                        "1", "--head-dim", "4"]):
        out = subprocess.run([qkv_cli, "bench", *args, "--min-time", "0", "--json"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert [json.loads(x)["threads"] for x in out.stdout.splitlines()] == [1]
        assert "Machine: " + line.rstrip("\n") in out.stderr.splitlines()


def test_peer_scripts_name_the_machine_through_qkv_info(qkv_cli):
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    try:
        import precision_peers
    finally:
        sys.path.pop(0)
    info = qkv.machine_info()
    assert precision_peers.machine(qkv_cli) == (
        f"{info['cpu_model']}, {info['logical_cpus']} vCPUs; flags: {' '.join(info['isa_flags'])}; "
        f"Highway: {info['simd_target']}; oneDNN isa: {info['onednn_isa']}")


def machine_info_under(cap):
    """qkv.machine_info() of a fresh process with QKV_MAX_SIMD_TARGET=cap (the variable is read
    once per process), and the ValueError text an attention call there raises, or None."""
    code = ("import json, numpy, qkv\nx = numpy.ones((1, 1, 4, 4), numpy.float32)\n"
            "try:\n    qkv.scaled_dot_product_attention(x, x, x); error = None\n"
            "except ValueError as e:\n    error = str(e)\n"
            "try:\n    info = qkv.machine_info()\n"
            "except ValueError as e:\n    info = str(e)\n"
            "print(json.dumps([info, error]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, QKV_MAX_SIMD_TARGET=cap))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_max_simd_target_caps_the_dispatch_and_every_machine_line_names_it(qkv_cli, monkeypatch):
    flags = set(cpuinfo_first("flags").split())
    info, error = machine_info_under("avx2")
    assert error is None
    assert info["simd_target_cap"] == "avx2"
    # AVX2 where the CPU has it, else the fallback: a cap is a maximum, as ONEDNN_MAX_CPU_ISA's
    uncapped = qkv.machine_info()["simd_target"]
    assert info["simd_target"] == ("AVX2" if {"avx2", "fma", "f16c", "bmi2"} <= flags else uncapped)
    # The fallback (SSE2 on x86-64 with Highway 1.2): a cap no compiled target but it meets
    # (SSE4) picks it, and a cap at its own name too.
    fallback = machine_info_under("SSE4")[0]["simd_target"]
    assert fallback == "SSE2"
    assert machine_info_under(fallback)[0]["simd_target"] == fallback
    assert machine_info_under("AVX3_SPR")[0]["simd_target"] == uncapped  # above qkv's targets
    monkeypatch.setenv("QKV_MAX_SIMD_TARGET", "avx2")
    line = subprocess.run([qkv_cli, "info"], capture_output=True, text=True, timeout=60).stdout
    assert f"; Highway: {info['simd_target']} (QKV_MAX_SIMD_TARGET=avx2); oneDNN isa: " in line
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    try:
        import precision_peers
    finally:
        sys.path.pop(0)
    header = precision_peers.machine(qkv_cli)
    assert f"; Highway: {info['simd_target']} (QKV_MAX_SIMD_TARGET=avx2); " in header


def test_a_bad_max_simd_target_is_a_value_error_naming_it_at_first_use(qkv_cli):
    info, error = machine_info_under("AVX-512")
    want = "QKV_MAX_SIMD_TARGET='AVX-512' names no Highway SIMD target: it takes one of AVX3_SPR, AVX3_ZEN4, AVX3_DL, AVX3, AVX2"
    assert want in error and want in info, (info, error)
    out = subprocess.run([qkv_cli, "info"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, QKV_MAX_SIMD_TARGET="AVX-512"))
    assert out.returncode == 1 and want in out.stderr, out.stderr


def test_measure_fma_peak_reports_its_workers_target_and_lanes():
    """qkv.measure_fma_peak (qkv/machine.h): the workers are get_num_threads(), the target machine_info()'s,
    its float32 lanes; the rate is only a figure (benchmarks, not tests, judge it)."""
    old = qkv.get_num_threads()
    try:
        for threads in (1, 2):
            qkv.set_num_threads(threads)
            peak = qkv.measure_fma_peak(0)
            target = qkv.machine_info()["simd_target"]
            lanes = 16 if target.startswith("AVX3") else 8 if target == "AVX2" else 4
            assert peak == {"gflops": peak["gflops"], "threads": threads, "simd_target": target, "lanes": lanes}
            assert peak["gflops"] > 0
    finally:
        qkv.set_num_threads(old)
    for bad in (-1.0, float("nan"), 1e9):
        with pytest.raises(ValueError, match=r"measure_fma_peak: min_seconds must be in \[0, 3600\]"):
            qkv.measure_fma_peak(bad)
    with pytest.raises(TypeError, match="measure_fma_peak: min_seconds"):
        qkv.measure_fma_peak("fast")
