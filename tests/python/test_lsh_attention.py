"""qkv.attention.lsh (Reformer's LSH attention) against a float64 NumPy oracle written here from
the definition (Hugging Face transformers' LSHSelfAttention semantics) and against the layer itself
(tests/fixtures/lsh, tests/attention/make_lsh_fixtures.py; also read by
tests/attention/lsh_attention_test.cc), qkv.attention.lsh_buckets, the seed, the CLI, the errors."""
import pathlib

import numpy as np
import pytest

import qkv
from fixture_files import load, rel_err

FIXTURES = sorted((pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "lsh").glob("*.safetensors"))


def buckets_np(qk, rot, factors, mask):
    """[B, H, n_hashes, L]: argmax over [x R, -x R] per factor, padding in bucket prod(factors)."""
    y = np.einsum("bhld,hdrk->bhrlk", qk, np.broadcast_to(rot, (qk.shape[1],) + rot.shape[1:]))
    out, col, scale = np.zeros(y.shape[:-1], np.int64), 0, 1
    for f in factors:
        part = y[..., col:col + f // 2]
        out += scale * np.argmax(np.concatenate([part, -part], -1), -1)
        scale, col = scale * f, col + f // 2
    if mask is not None:
        out = np.where(mask[:, None, None, :] != 0, out, scale)
    return out


def lsh_np(qk, v, rot, factors, n_hashes, chunk, before, after, causal, mask, dtype=np.float64):
    """The definition in loops over (batch, head, chunk of the rounds' sorted order), in `dtype`
    (float64: the oracle; float32: a naive float32 implementation)."""
    qk, v = qk.astype(dtype), v.astype(dtype)
    b_, h_, length, d = qk.shape
    standard = length <= chunk
    rounds, cl = (1, length) if standard else (n_hashes, chunk)
    before, after = (0, 0) if standard else (before, after)
    bk = buckets_np(qk, rot.astype(dtype), factors, mask)
    kn = qk / np.sqrt(np.mean(qk ** 2, -1, keepdims=True) + dtype(1e-6)) / dtype(np.sqrt(d))
    out = np.zeros(qk.shape[:-1] + (v.shape[-1],), dtype)
    for b in range(b_):
        for h in range(h_):
            order = np.concatenate([np.arange(length) if standard else np.argsort(bk[b, h, r], kind="stable")
                                    for r in range(rounds)])
            total = rounds * length // cl
            outs, lses = np.zeros((rounds, length, v.shape[-1]), dtype), np.zeros((rounds, length), dtype)
            for c in range(total):
                keys = np.concatenate([order[(c + a) % total * cl:((c + a) % total + 1) * cl]
                                       for a in range(-before, after + 1)])
                qs = order[c * cl:(c + 1) * cl]
                s = qk[b, h, qs] @ kn[b, h, keys].T
                masked = np.zeros(s.shape, bool)
                if mask is not None:
                    masked |= (mask[b, keys] == 0)[None, :]
                if causal:
                    masked |= keys[None, :] > qs[:, None]
                s = np.where(keys[None, :] == qs[:, None], dtype(-1e5), np.where(masked, dtype(-1e9), s))
                top = s.max(-1, keepdims=True)
                lse = top + np.log(np.exp(s - top).sum(-1, keepdims=True))
                outs[c * cl // length, qs] = np.exp(s - lse) @ v[b, h, keys]
                lses[c * cl // length, qs] = lse[:, 0]
            w = np.exp(lses - lses.max(0))
            out[b, h] = ((w / w.sum(0))[..., None] * outs).sum(0)
    return out


CASES = [  # (L, chunk, n_hashes, factors, before, after, causal, padded)
    (32, 8, 1, [4], 1, 0, False, False),
    (32, 8, 2, [4], 1, 0, True, False),
    (48, 8, 3, [2, 4], 1, 0, False, True),
    (40, 8, 2, [8], 1, 1, True, True),
    (64, 16, 4, [8], 2, 0, False, False),
    (6, 8, 2, [4], 1, 0, True, True),  # L <= chunk: no hashing
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lsh_matches_the_definition(case, dtype):
    length, chunk, n_hashes, factors, before, after, causal, padded = case
    rng = np.random.default_rng(length * 7 + n_hashes)
    qk = rng.standard_normal((2, 3, length, 8)).astype(dtype)
    v = rng.standard_normal((2, 3, length, 5)).astype(dtype)
    rot = rng.standard_normal((3, 8, n_hashes, sum(factors) // 2))
    mask = None
    if padded:
        mask = np.ones((2, length), np.int64)
        mask[1, length - 3:] = 0
    got = qkv.attention.lsh(qk, v, n_hashes=n_hashes, n_buckets=factors, chunk_length=chunk,
                            num_chunks_before=before, num_chunks_after=after, is_causal=causal, rotations=rot,
                            attention_mask=None if mask is None else mask[:, None, :])
    assert got.dtype == dtype and got.shape == v.shape
    want = lsh_np(qk, v, rot.astype(dtype), factors, n_hashes, chunk, before, after, causal, mask)
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= (1e-11 if dtype == np.float64 else 2e-6), err
    buckets = qkv.attention.lsh_buckets(qk, n_hashes=n_hashes, n_buckets=factors, chunk_length=chunk, rotations=rot,
                                        attention_mask=None if mask is None else mask[:, None, :])
    np.testing.assert_array_equal(buckets, buckets_np(qk.astype(np.float64), rot, factors, mask))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_matches_reformer_lsh_self_attention(path):
    t, o = load(path)
    mask = t.get("attention_mask")
    hidden = t["hidden"]
    b, length, _ = hidden.shape
    heads, d = t["qk"].shape[1], t["qk"].shape[3]

    def project(w):  # HF's bias-free nn.Linear, then its head split [B, H, L, D]
        y = qkv.einsum("ble,fe->blf", hidden, w).reshape(b, length, heads, d)
        return np.ascontiguousarray(y.transpose(0, 2, 1, 3))

    out = qkv.attention.lsh(project(t["w_qk"]), project(t["w_v"]), n_hashes=o["n_hashes"], n_buckets=o["n_buckets"],
                            chunk_length=o["chunk_length"], num_chunks_before=o["num_chunks_before"],
                            num_chunks_after=o["num_chunks_after"], is_causal=o["is_decoder"],
                            rotations=t["rotations"], attention_mask=None if mask is None else mask[:, None, :])
    got = out.transpose(0, 2, 1, 3).reshape(b, length, heads * d)
    # float32 causal: Reformer's own float32 logsumexp over rounds at -1e5 (a token left with only
    # itself) weighs each round 0.4989, not 1/2 (docs/attention-variants-lsh.md); elsewhere einsum's
    # and torch's projections round apart.
    tol = 1e-11 if o["dtype"] == "float64" else (3e-3 if o["is_decoder"] and o["n_hashes"] > 1 else 2e-5)
    assert rel_err(got, t["out"]) <= tol


# Issue 16's criterion on every one of these configurations, seeds 0, 1 and 2 each (all 21 cases
# asserted): (B, H, L, D, Dv, n_hashes, factors, chunk, before, after, causal, padded).
NAIVE_CASES = [
    (1, 4, 128, 32, 32, 1, [8], 16, 1, 0, False, False),
    (1, 4, 128, 32, 32, 2, [8], 16, 1, 0, False, False),
    (1, 4, 128, 32, 32, 4, [8], 16, 1, 0, False, False),
    (2, 2, 256, 64, 32, 2, [4, 4], 32, 1, 1, True, False),
    (1, 2, 512, 64, 64, 2, [16], 64, 1, 0, False, False),
    (2, 3, 96, 16, 24, 3, [2, 4], 8, 2, 0, False, True),
    (1, 4, 48, 32, 32, 2, [8], 64, 1, 0, True, False),  # L <= chunk: no hashing
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("index", range(len(NAIVE_CASES)))
def test_float32_error_within_twice_a_naive_float32(index, seed):
    # Issue 16: qkv's float32 error against the float64 oracle <= 2x that of the definition run
    # naively in float32 (lsh_np in float32: NumPy's OpenBLAS GEMMs, float32 softmax and merge),
    # both the largest and the mean absolute error. Measured here: largest <= 1.32x naive's, mean
    # <= 0.74x (near 0 where naive's float32 merge errs at logsumexp -1e5); the kernel before its
    # precision work: 1.95 here, 3.03 on seeds 0-9; with one float32 Q K^T GEMM: 2.07 here
    # (docs/attention-variants-lsh.md).
    b, h, length, d, dv, rounds, factors, chunk, before, after, causal, padded = NAIVE_CASES[index]
    rng = np.random.default_rng(1000 * index + seed)
    qk = rng.standard_normal((b, h, length, d)).astype(np.float32)
    v = rng.standard_normal((b, h, length, dv)).astype(np.float32)
    rot = rng.standard_normal((h, d, rounds, sum(factors) // 2))
    mask = None
    if padded:
        mask = np.ones((b, length), np.int64)
        mask[-1, length - 5:] = 0
    args = (rot, factors, rounds, chunk, before, after, causal, mask)
    want = lsh_np(qk, v, *args)
    naive = np.abs(lsh_np(qk, v, *args, np.float32) - want)
    got = qkv.attention.lsh(qk, v, n_hashes=rounds, n_buckets=factors, chunk_length=chunk, num_chunks_before=before,
                            num_chunks_after=after, is_causal=causal, rotations=rot,
                            attention_mask=None if mask is None else mask[:, None, :])
    err = np.abs(got - want)
    assert 0 < naive.max() and err.max() <= 2 * naive.max(), (err.max(), naive.max())
    assert err.mean() <= 2 * naive.mean(), (err.mean(), naive.mean())


def test_seed_draws_the_rotations():
    rng = np.random.default_rng(3)
    qk, v = rng.standard_normal((1, 2, 64, 16)), rng.standard_normal((1, 2, 64, 16))
    kw = dict(n_hashes=2, n_buckets=8, chunk_length=8)
    a, b = qkv.attention.lsh(qk, v, seed=5, **kw), qkv.attention.lsh(qk, v, seed=5, **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(qkv.attention.lsh_buckets(qk, seed=5, **kw), qkv.attention.lsh_buckets(qk, seed=6, **kw))
    buckets = qkv.attention.lsh_buckets(qk, seed=5, **kw)
    assert buckets.shape == (1, 2, 2, 64) and buckets.min() == 0 and buckets.max() == 7
    # Reformer's default bucket count for L = 64, chunk 8: 2^floor(log2(2 * 64 / 8)) = 16.
    assert qkv.attention.lsh_buckets(qk, chunk_length=8).max() >= 8


def test_errors():
    qk = np.zeros((1, 2, 32, 8), np.float32)
    with pytest.raises(ValueError, match="must be even"):
        qkv.attention.lsh(qk, qk, n_buckets=5, chunk_length=8)
    with pytest.raises(ValueError, match="multiple of chunk_length = 12"):
        qkv.attention.lsh(qk, qk, chunk_length=12)
    with pytest.raises(ValueError, match="rotations must be"):
        qkv.attention.lsh(qk, qk, chunk_length=8, n_buckets=4, rotations=np.zeros((2, 8, 1, 3)))
    with pytest.raises(ValueError, match="attention_mask"):
        qkv.attention.lsh(qk, qk, chunk_length=8, attention_mask=np.ones((1, 31)))
    with pytest.raises(ValueError, match="n_hashes"):
        qkv.attention.lsh(qk, qk, n_hashes=0)


def test_cli_variant_lsh(run, tmp_path):
    rng = np.random.default_rng(9)
    qk, v = rng.standard_normal((1, 2, 32, 8)), rng.standard_normal((1, 2, 32, 4))
    rot = rng.standard_normal((2, 8, 2, 3))
    mask = np.ones((1, 32))
    mask[0, -4:] = 0
    for name, array in (("qk", qk), ("v", v), ("rot", rot), ("mask", mask[:, None, :])):
        np.save(tmp_path / f"{name}.npy", array)
    args = ["attention", "--q", tmp_path / "qk.npy", "--v", tmp_path / "v.npy", "--variant", "lsh", "--hashes", "2",
            "--buckets", "2,4", "--chunk", "8", "--chunks-after", "1", "--causal", "--mask", tmp_path / "mask.npy",
            "--rotations", tmp_path / "rot.npy", "-o", tmp_path / "out.npy"]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    want = lsh_np(qk, v, rot, [2, 4], 2, 8, 1, 1, True, mask)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=0, atol=1e-12)
    result = run("attention", "--q", tmp_path / "qk.npy", "--k", tmp_path / "v.npy", "--v", tmp_path / "v.npy",
                 "--variant", "lsh", "-o", tmp_path / "out.npy")
    assert result.returncode != 0 and "omit --k" in result.stderr
    result = run("attention", "--q", tmp_path / "qk.npy", "--v", tmp_path / "v.npy", "--variant", "lsh", "--chunk",
                 "12", "-o", tmp_path / "out.npy")
    assert result.returncode != 0 and "multiple of chunk_length = 12" in result.stderr
    result = run("attention", "--q", tmp_path / "qk.npy", "--v", tmp_path / "v.npy", "-o", tmp_path / "out.npy")
    assert result.returncode != 0 and "--k is required" in result.stderr
