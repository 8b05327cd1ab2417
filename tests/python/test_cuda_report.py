"""bench/peers/cuda_report.py on hand-made results: the numbers it parses and the ratios it prints.

The inputs mimic attention_cuda_bench's Google Benchmark JSON (1.7's layout: iteration
rows, "median" aggregates with --benchmark_repetitions, error rows) and
bench/peers/sdpa_cuda.py's JSON; no GPU and no torch are needed.
"""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cuda_report", ROOT / "bench" / "peers" / "cuda_report.py")
cuda_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cuda_report)


def bench(name, tflops, run_type="iteration", aggregate=None, **extra):
    row = {"name": name + (f"_{aggregate}" if aggregate else ""), "run_name": name, "run_type": run_type,
           "iterations": 10, "real_time": 1.0, "cpu_time": 0.1, "time_unit": "ms", "TFLOPs": tflops, **extra}
    if aggregate:
        row["aggregate_name"] = aggregate
    return row


QKV = {
    "context": {"date": "2026-11-26T04:00:00+00:00", "num_cpus": 16, "gpu": "NVIDIA H100 80GB HBM3",
                "cuda_runtime": "13.0"},
    "benchmarks": [
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:0/manual_time", 400.0),
        # repetitions: the median aggregate (450) wins over the iteration rows
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:1/manual_time", 300.0),
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:1/manual_time", 500.0),
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:1/manual_time", 450.0, "aggregate", "median"),
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:1/manual_time", 416.7, "aggregate", "mean"),
        # no aggregate: the median of the three iteration rows
        bench("BM_AttentionCuda/B:1/H:16/L:16384/D:128/causal:0/manual_time", 380.0),
        bench("BM_AttentionCuda/B:1/H:16/L:16384/D:128/causal:0/manual_time", 420.0),
        bench("BM_AttentionCuda/B:1/H:16/L:16384/D:128/causal:0/manual_time", 400.0),
        {"name": "BM_AttentionCuda/B:1/H:16/L:16384/D:128/causal:1/manual_time", "run_type": "iteration",
         "error_occurred": True, "error_message": "CUDA error: out of memory"},
        bench("BM_CublasGemmBf16/M:8192/N:8192/K:8192/min_time:0.500/manual_time", 800.0),
    ],
}

TORCH = {
    "context": {"torch": "2.11.0+cu130", "torch_cuda_runtime": "13.0", "gpu": "NVIDIA H100 80GB HBM3",
                "compute_capability": "9.0", "multiprocessors": 132, "driver": "580.159.04",
                "cuda_driver_api": 13000},
    "rows": [
        {"name": "torch_sdpa_flash", "B": 4, "H": 16, "L": 4096, "D": 128, "causal": False, "ms": 0.3,
         "tflops": 500.0, "runs": 1000},
        {"name": "torch_sdpa_flash", "B": 4, "H": 16, "L": 4096, "D": 128, "causal": True, "ms": 0.2,
         "tflops": 360.0, "runs": 1000},
        {"name": "torch_sdpa_flash", "B": 1, "H": 16, "L": 16384, "D": 128, "causal": False, "ms": 4.0,
         "tflops": 550.0, "runs": 250},
        {"name": "torch_sdpa_flash", "B": 1, "H": 16, "L": 16384, "D": 128, "causal": True, "ms": 2.2,
         "tflops": 500.0, "runs": 450},
        {"name": "torch_matmul_bf16", "M": 8192, "N": 8192, "K": 8192, "B": None, "H": None, "L": None, "D": None,
         "causal": None, "ms": 1.4, "tflops": 780.0, "runs": 700},
    ],
}


@pytest.fixture()
def files(tmp_path):
    qkv, torch = tmp_path / "qkv_bench.json", tmp_path / "torch_bench.json"
    qkv.write_text(json.dumps(QKV))
    torch.write_text(json.dumps(TORCH))
    return str(qkv), str(torch)


def test_parse_name_ignores_segments_without_an_integer_value():
    assert cuda_report.parse_name("BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:1/manual_time") == (
        "BM_AttentionCuda", {"B": 4, "H": 16, "L": 4096, "D": 128, "causal": 1})
    assert cuda_report.parse_name("BM_CublasGemmBf16/M:8/N:16/K:32/min_time:0.500/real_time") == (
        "BM_CublasGemmBf16", {"M": 8, "N": 16, "K": 32})


def test_load_qkv_takes_medians_and_skips_errors(files):
    context, attention, gemm = cuda_report.load_qkv(files[0])
    assert context["cuda_runtime"] == "13.0"
    assert attention == {(4, 16, 4096, 128, 0): 400.0, (4, 16, 4096, 128, 1): 450.0,
                         (1, 16, 16384, 128, 0): 400.0}
    assert gemm == {(8192, 8192, 8192): 800.0}


def test_square_gemm_name_and_min_time_segment(tmp_path):
    # attention_cuda_bench names its GEMM by M alone, with Google Benchmark's min_time segment
    path = tmp_path / "square.json"
    path.write_text(json.dumps({"benchmarks": [
        bench("BM_CublasGemmBf16/M:8192/min_time:0.500/manual_time", 700.0),
        bench("BM_AttentionCuda/B:4/H:16/L:4096/D:64/causal:0/min_time:0.500/manual_time", 350.0)]}))
    _, attention, gemm = cuda_report.load_qkv(str(path))
    assert gemm == {(8192, 8192, 8192): 700.0}
    assert attention == {(4, 16, 4096, 64, 0): 350.0}


def test_load_torch(files):
    context, attention, gemm = cuda_report.load_torch(files[1])
    assert context["driver"] == "580.159.04"
    assert attention[(1, 16, 16384, 128, 1)] == 500.0 and len(attention) == 4
    assert gemm == {(8192, 8192, 8192): 780.0}


def test_rows_ratios_and_percentages_of_qkv_gemm(files):
    _, qatt, qgemm = cuda_report.load_qkv(files[0])
    _, tatt, tgemm = cuda_report.load_torch(files[1])
    gemm, label = cuda_report.yardstick(qgemm, tgemm)
    assert (gemm, label) == (800.0, "qkv BM_CublasGemmBf16 8192x8192x8192")
    table = {r[0]: r[1:] for r in cuda_report.rows(qatt, tatt, gemm)}
    assert table[(4, 16, 4096, 128, 0)] == pytest.approx((400.0, 500.0, 0.8, 50.0, 62.5))
    assert table[(4, 16, 4096, 128, 1)] == pytest.approx((450.0, 360.0, 1.25, 56.25, 45.0))
    # qkv's failed causal L = 16384 row: torch alone, no ratio
    assert table[(1, 16, 16384, 128, 1)] == (None, 500.0, None, None, 62.5)


def test_report_text(files):
    text = cuda_report.report(*files)
    lines = text.splitlines()
    assert lines[0] == ("GPU: NVIDIA H100 80GB HBM3 (cc 9.0, 132 SMs); driver 580.159.04 (CUDA 13.0); "
                        "CUDA runtime: qkv 13.0, torch 13.0; torch 2.11.0+cu130")
    assert "800.0 (qkv 8192x8192x8192), 780.0 (torch.matmul 8192x8192x8192)" in lines[2]
    assert "| 4, 16, 4096, 128 | 0 | 400.0 | 500.0 | 0.80 | 50% | 62% |" in lines
    assert "| 1, 16, 16384, 128 | 0 | 400.0 | 550.0 | 0.73 | 50% | 69% |" in lines
    assert "| 1, 16, 16384, 128 | 1 | - | 500.0 | - | - | 62% |" in lines
    # a row qkv did not measure is not "met"
    assert lines[-1] == "qkv / torch at D = 128, L >= 4096: min 0.73 over 3 of 4 rows (target >= 0.70: not met)"


def test_target_met_when_every_row_has_a_pair(tmp_path, files):
    qkv = dict(QKV, benchmarks=QKV["benchmarks"][:8] + [
        bench("BM_AttentionCuda/B:1/H:16/L:16384/D:128/causal:1/manual_time", 350.0)])
    path = tmp_path / "all_rows.json"
    path.write_text(json.dumps(qkv))
    assert cuda_report.report(str(path), files[1]).endswith("min 0.70 over 4 of 4 rows (target >= 0.70: met)\n")
    qkv["benchmarks"][-1]["TFLOPs"] = 349.0
    path.write_text(json.dumps(qkv))
    assert cuda_report.report(str(path), files[1]).endswith("min 0.70 over 4 of 4 rows (target >= 0.70: not met)\n")


def test_header_from_qkv_context_alone(tmp_path):
    # attention_cuda_bench's context: cudaDriverGetVersion / cudaRuntimeGetVersion integers
    path = tmp_path / "qkv.json"
    path.write_text(json.dumps({"context": {"gpu": "NVIDIA H200", "cuda_driver": "13000", "cuda_runtime": "13000"},
                                "benchmarks": []}))
    assert cuda_report.report(str(path), None).splitlines()[0] == (
        "GPU: NVIDIA H200; driver ? (CUDA 13.0); CUDA runtime: qkv 13.0, torch ?; torch ?")


def test_missing_qkv_file_leaves_dashes_and_uses_torch_gemm(tmp_path, files, capsys):
    text = cuda_report.report(str(tmp_path / "absent.json"), files[1], cuda_runtime="13.0")
    assert "no qkv results" in capsys.readouterr().err
    assert "CUDA runtime: qkv 13.0, torch 13.0" in text
    assert "percentages of torch.matmul 8192x8192x8192" in text
    assert "| 4, 16, 4096, 128 | 1 | - | 360.0 | - | - | 46% |" in text
    assert text.splitlines()[-1] == "qkv / torch at D = 128, L >= 4096: no pair of results"


def test_main_writes_the_table(tmp_path, files, capsys):
    out = tmp_path / "report.md"
    assert cuda_report.main(["--qkv", files[0], "--torch", files[1], "--out", str(out)]) == 0
    assert out.read_text() == capsys.readouterr().out
    assert out.read_text().count("\n| ") == 5  # the column header and four shapes
