"""qkv.scaled_dot_product_attention(..., qk_quantization=) from Python: the fused kernel's
int8 Q K^T (SageAttention's smoothed int8 scores; qkv/attention.h, issue 14 item 4).

Oracle: numpy in float64 (oracles.sdpa_float64). The C++ tests
(tests/attention/attention_int8_test.cc) cover masks, GQA, NaN and the error measures.
"""
import json
import subprocess

import numpy as np
import pytest

import qkv
from oracles import sdpa_float64


def relative_l1(got, want):
    return np.abs(got - want).sum() / np.abs(want).sum()


def test_int8_scores_within_their_error_and_smoothing_fixes_offset_keys():
    rng = np.random.default_rng(26)
    q, v = (rng.standard_normal((2, 4, 200, 64)).astype(np.float32) for _ in range(2))
    # keys with a per-channel offset 10x their spread (LLM keys' outlier channels)
    k = (rng.standard_normal((2, 4, 200, 64)) + 10.0 * rng.standard_normal((2, 4, 1, 64))).astype(np.float32)
    want, _ = sdpa_float64(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    exact = qkv.scaled_dot_product_attention(q, k, v)
    int8 = qkv.scaled_dot_product_attention(q, k, v, qk_quantization="int8")
    raw = qkv.scaled_dot_product_attention(q, k, v, qk_quantization="int8_unsmoothed")
    assert int8.dtype == np.float32 and int8.shape == want.shape
    assert relative_l1(exact, want) < 1e-5
    assert 1e-4 < relative_l1(int8, want) < 2e-2  # int8 ran, within its measured error
    assert relative_l1(raw, want) > 3 * relative_l1(int8, want)  # unsmoothed: the offset sets K's scales


def test_int8_scores_refuse_other_dtypes_and_unknown_names():
    q = np.ones((1, 4, 8), np.float64)
    with pytest.raises(ValueError, match="qk_quantization='int8' needs float32"):
        qkv.scaled_dot_product_attention(q, q, q, qk_quantization="int8")
    with pytest.raises(ValueError, match="qk_quantization must be 'none', 'int8' or 'int8_unsmoothed'"):
        f32 = q.astype(np.float32)
        qkv.scaled_dot_product_attention(f32, f32, f32, qk_quantization="int4")


def test_bench_attention_times_the_int8_scores_and_the_int8_gemm(qkv_cli):
    # bench/peers/precision_peers.py's int8-QK rows read these JSON lines.
    out = subprocess.run([qkv_cli, "bench", "attention", "--json", "--min-time", "0", "--shape", "1,2,64,16",
                          "--gemm", "64", "--qk-quantization", "int8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(x["op"], x["dtype"]) for x in lines] == [("gemm", "float32"), ("gemm", "int8"), ("attention", "float32")]
    assert lines[2]["qk_quantization"] == "int8" and lines[1]["gflops"] > 0


def test_cli_attention_qk_quantization(qkv_cli, tmp_path):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 128, 32)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    for qk in ("none", "int8"):
        result = subprocess.run([qkv_cli, "attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "q.npy", "--v",
                                 tmp_path / "q.npy", "--qk-quantization", qk, "-o", tmp_path / f"{qk}.npy"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    exact, int8 = np.load(tmp_path / "none.npy"), np.load(tmp_path / "int8.npy")
    assert 1e-5 < relative_l1(int8, exact) < 2e-2
    bad = subprocess.run([qkv_cli, "attention", "--q", tmp_path / "q.npy", "--v", tmp_path / "q.npy", "--variant",
                          "lsh", "--qk-quantization", "int8", "-o", tmp_path / "x.npy"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--qk-quantization is for the fused softmax attention" in bad.stderr, bad.stderr
