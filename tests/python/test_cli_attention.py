"""`qkv attention` and `qkv inspect` end to end, against numpy as a live oracle.

Inputs are written by numpy (all layouts and dtypes qkv reads), outputs written
by qkv are read back by numpy, so this also checks the .npy reader and writer.
"""
import numpy as np
import pytest

from oracles import sdpa_float64


def save(tmp_path, name, array):
    path = tmp_path / f"{name}.npy"
    np.save(path, array)
    return path


def run_attention(run, tmp_path, q, k, v, *extra, weights=False):
    args = ["attention", "--q", save(tmp_path, "q", q), "--k", save(tmp_path, "k", k), "--v", save(tmp_path, "v", v),
            "-o", tmp_path / "out.npy", *extra]
    if weights:
        args += ["--weights", tmp_path / "w.npy"]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    out = np.load(tmp_path / "out.npy")
    return (out, np.load(tmp_path / "w.npy")) if weights else out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)), ((4, 8), (6, 8), (6, 3))])
def test_matches_numpy(run, tmp_path, dtype, shape):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in shape)
    out, w = run_attention(run, tmp_path, q, k, v, weights=True)
    expected, expected_w = sdpa_float64(q, k, v)
    assert out.dtype == dtype and out.shape == expected.shape
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol)
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=tol)


def test_fortran_order_and_float16_inputs(run, tmp_path):
    rng = np.random.default_rng(1)
    q = np.asfortranarray(rng.standard_normal((6, 8)))
    k = np.asfortranarray(rng.standard_normal((9, 8)))
    v = rng.standard_normal((9, 5))
    np.testing.assert_allclose(run_attention(run, tmp_path, q, k, v), sdpa_float64(q, k, v)[0], atol=1e-13)
    half = [x.astype(np.float16) for x in (q, k, v)]
    out = run_attention(run, tmp_path, *half)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), sdpa_float64(*half)[0], atol=2e-3)


def test_masks_scale_and_causal(run, tmp_path):
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 6, 3))
    mask = rng.random((4, 6)) > 0.4
    mask[1] = False  # a fully masked row gives zeros
    np.save(tmp_path / "mask.npy", mask)
    out = run_attention(run, tmp_path, q, k, v, "--mask", tmp_path / "mask.npy", "--scale", "0.3")
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, mask=mask, scale=0.3)[0], atol=1e-13)
    assert np.all(out[:, 1] == 0)
    additive = rng.standard_normal((1, 4, 6))
    np.save(tmp_path / "bias.npy", additive)
    out = run_attention(run, tmp_path, q, k, v, "--mask", tmp_path / "bias.npy")
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, mask=additive)[0], atol=1e-13)
    out = run_attention(run, tmp_path, q, k, v, "--causal")
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, causal=True)[0], atol=1e-13)


def test_errors_go_to_stderr_with_shapes(run, tmp_path):
    rng = np.random.default_rng(3)
    args = ["attention", "--q", save(tmp_path, "q", rng.standard_normal((4, 8))),
            "--k", save(tmp_path, "k", rng.standard_normal((6, 7))),
            "--v", save(tmp_path, "v", rng.standard_normal((6, 3))), "-o", tmp_path / "out.npy"]
    result = run(*args)
    assert result.returncode != 0
    assert "q [4, 8], k [6, 7]" in result.stderr
    assert not (tmp_path / "out.npy").exists()


def test_inspect_lists_numpy_and_safetensors_files(run, tmp_path):
    from safetensors.numpy import save_file

    np.save(tmp_path / "x.npy", np.zeros((3, 2, 4), dtype=np.float32))
    result = run("inspect", tmp_path / "x.npy")
    assert result.returncode == 0, result.stderr
    assert "float32" in result.stdout and "[3, 2, 4]" in result.stdout
    save_file({"query/kernel": np.zeros((3, 2, 4), np.float32), "query/bias": np.zeros((2, 4), np.float64)},
              str(tmp_path / "m.safetensors"))
    result = run("inspect", tmp_path / "m.safetensors")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("query/kernel" in l and "[3, 2, 4]" in l for l in lines), result.stdout
    assert any("query/bias" in l and "[2, 4]" in l for l in lines), result.stdout


def test_demo_runs(run):
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert "attention weights" in result.stdout


def dense_window(lq, lk, w, causal):
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    return (j >= i - w) & (j <= i) if causal else np.abs(j - i) <= w


@pytest.mark.parametrize("causal", [False, True])
def test_variant_window_admits_exactly_what_help_says(run, tmp_path, causal):
    """--help: |j - i| <= W, or i - W <= j <= i with --causal; checked against a dense numpy mask."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 40, 8)) for _ in range(3))
    extra = ["--variant", "window", "--window", "5"] + (["--causal"] if causal else [])
    out, w = run_attention(run, tmp_path, q, k, v, *extra, weights=True)
    mask = dense_window(40, 40, 5, causal)
    np.testing.assert_array_equal(w[0] > 0, mask)
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, mask=mask)[0], atol=1e-12)
    assert "|j - i| <= W" in run("attention", "--help").stdout


def test_variants_longformer_prefix_bigbird_and_linear(run, tmp_path):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 64, 8)) for _ in range(3))
    _, w = run_attention(run, tmp_path, q, k, v, "--variant", "longformer", "--window", "2", "--globals", "0,33",
                         weights=True)
    mask = dense_window(64, 64, 2, False)
    mask[[0, 33], :] = True
    mask[:, [0, 33]] = True
    np.testing.assert_array_equal(w[0] > 0, mask)
    _, w = run_attention(run, tmp_path, q, k, v, "--variant", "prefix-lm", "--prefix", "7", weights=True)
    i, j = np.arange(64)[:, None], np.arange(64)[None, :]
    np.testing.assert_array_equal(w[0] > 0, (j <= i) | (j < 7))
    _, w = run_attention(run, tmp_path, q, k, v, "--variant", "bigbird", "--block", "16", "--random", "1",
                         weights=True)
    blocks = (w[0].reshape(4, 16, 4, 16) > 0).any(axis=(1, 3))
    assert blocks[0].all() and blocks[:, 0].all() and blocks[3].all() and blocks[:, 3].all()
    out = run_attention(run, tmp_path, q, k, v, "--variant", "linear", "--causal")
    phi = lambda x: np.where(x > 0, x + 1, np.exp(x))  # noqa: E731  elu + 1
    s = np.tril(phi(q[0]) @ phi(k[0]).T)
    np.testing.assert_allclose(out[0], (s @ v[0]) / s.sum(1, keepdims=True), atol=1e-12)


def test_device_cpu_is_the_default_and_a_missing_gpu_is_a_clear_error(run, tmp_path):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 6, 8)).astype(np.float32) for _ in range(3))
    out = run_attention(run, tmp_path, q, k, v, "--device", "cpu")
    np.testing.assert_allclose(out, sdpa_float64(q, k, v)[0], atol=2e-6)
    import qkv
    if qkv.cuda.device_count() == 0:  # CI and this machine; a GPU machine runs tests/cuda instead
        result = run("attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
                     "--device", "cuda:0", "-o", tmp_path / "gpu.npy")
        assert result.returncode != 0
        assert "cuda:0" in result.stderr
        assert not (tmp_path / "gpu.npy").exists()
    result = run("attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
                 "--device", "gpu", "-o", tmp_path / "bad.npy")
    assert result.returncode != 0 and "is not a device (expected 'cpu' or 'cuda:N')" in result.stderr
    result = run("attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
                 "--device", "cuda:0", "--variant", "window", "--window", "2", "-o", tmp_path / "bad.npy")
    assert result.returncode != 0 and "the GPU runs the full softmax attention only" in result.stderr
