"""qkv.KVCache and qkv.decode_attention against NumPy (float64 softmax attention over each
sequence's cached keys) and against the full causal forward, token by token."""
import numpy as np
import pytest

import qkv

rng = np.random.default_rng(5)


def numpy_decode(q, keys, values, lengths, causal=True, window=0, softcap=0.0):
    b, hq, lq, d = q.shape
    hk = keys.shape[1]
    out = np.zeros((b, hq, lq, values.shape[-1]))
    for s in range(b):
        n = lengths[s]
        for h in range(hq):
            k, v = keys[s, h // (hq // hk), :n].astype(np.float64), values[s, h // (hq // hk), :n].astype(np.float64)
            for t in range(lq):
                pos = n - lq + t
                j = np.arange(n)
                ok = (j <= pos if causal else np.ones(n, bool)) & ((j > pos - window) if window else True)
                if not ok.any():
                    continue
                sc = k @ q[s, h, t] / np.sqrt(d)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                w = np.exp(sc[ok] - sc[ok].max())
                out[s, h, t] = (w / w.sum()) @ v[ok]
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("lq,window,softcap", [(1, 0, 0.0), (3, 0, 0.0), (2, 9, 0.0), (1, 0, 2.0)])
def test_decode_matches_numpy(dtype, lq, window, softcap):
    lengths = [0, 1, 40, 257]
    cache = qkv.KVCache(4, 2, 16, 300, dtype=dtype)
    k, v = rng.standard_normal((4, 2, 257, 16)), rng.standard_normal((4, 2, 257, 16))
    cache.append(k, v, counts=lengths)
    assert cache.lengths == lengths
    q = rng.standard_normal((4, 8, lq, 16)).astype(np.float32)
    want = numpy_decode(q, cache.keys.astype(np.float64), cache.values.astype(np.float64), lengths,
                        window=window, softcap=softcap)
    got = qkv.decode_attention(q, cache, window=window, softcap=softcap, chunk=32)
    np.testing.assert_allclose(got, want, atol=3e-6)


def test_generation_step_by_step_equals_the_full_causal_forward():
    q, k, v = (rng.standard_normal((2, 4, 32, 8)).astype(np.float32) for _ in range(3))
    full = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    cache = qkv.KVCache(2, 4, 8, 32)
    for t in range(32):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        np.testing.assert_allclose(qkv.decode_attention(q[:, :, t:t + 1], cache), full[:, :, t:t + 1], atol=2e-6)


def test_errors():
    cache = qkv.KVCache(1, 2, 4, 3)
    with pytest.raises(ValueError, match="KVCache.append: sequence 0 would hold 4 positions, past the capacity 3"):
        cache.append(np.zeros((1, 2, 4, 4)), np.zeros((1, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"decode_attention: q must be \[1, Hq, Lq, 4\]"):
        qkv.decode_attention(np.zeros((1, 3, 1, 4)), cache)
    with pytest.raises(TypeError):
        qkv.KVCache(1, 2, 4, 3, dtype="float64")


def test_append_counts_take_any_integer_array(monkeypatch):
    # counts went through nanobind's list caster, which took lists and NumPy arrays but raised
    # TypeError for a torch tensor; now counts is taken as k and v are (fake_torch: no torch here).
    from fake_torch import DLPackOnly, FakeTensor
    from fake_torch import install as install_fake_torch
    install_fake_torch(monkeypatch)
    k, v = rng.standard_normal((3, 2, 5, 4)), rng.standard_normal((3, 2, 5, 4))
    want = qkv.KVCache(3, 2, 4, 8)
    want.append(k, v, counts=[5, 0, 2])
    for counts in [(5, 0, 2), np.array([5, 0, 2], np.int32), np.array([5, 0, 2], np.int8),
                   FakeTensor(np.array([5, 0, 2])), FakeTensor(np.array([5, 0, 2], np.int32)),
                   DLPackOnly(np.array([5, 0, 2])), FakeTensor(np.array([9, 5, 9, 0, 9, 2])[1::2])]:
        cache = qkv.KVCache(3, 2, 4, 8)
        cache.append(k, v, counts=counts)
        assert cache.lengths == [5, 0, 2], counts
        np.testing.assert_array_equal(cache.keys, want.keys)
    cache = qkv.KVCache(3, 2, 4, 8)
    with pytest.raises(TypeError, match="KVCache.append: counts must be integers .*, got float32"):
        cache.append(k, v, counts=FakeTensor(np.array([5, 0, 2], np.float32)))
    with pytest.raises(ValueError, match=r"KVCache.append: counts must be 1-D \[B\], got shape \[1, 3\]"):
        cache.append(k, v, counts=FakeTensor(np.array([[5, 0, 2]])))
    with pytest.raises(TypeError, match="KVCache.append: counts entry must be an int"):
        cache.append(k, v, counts=[5, 0, 2.0])
    with pytest.raises(ValueError, match="KVCache.append"):
        cache.append(k, v, counts=FakeTensor(np.array([6, 0, 2])))
    assert cache.lengths == [0, 0, 0]


def llama_rope(x, pos, base, rd):
    """Hugging Face Llama's apply_rotary_pos_emb (rotate_half), in NumPy."""
    inv = 1.0 / base ** (np.arange(0, rd, 2) / rd)
    emb = np.concatenate([np.outer(pos, inv)] * 2, -1)
    xr = x[..., :rd]
    half = np.concatenate([-xr[..., rd // 2:], xr[..., :rd // 2]], -1)
    return np.concatenate([xr * np.cos(emb) + half * np.sin(emb), x[..., rd:]], -1)


def gptj_rope(x, pos, base, rd):
    """Hugging Face GPT-J's rotate_every_two, in NumPy."""
    inv = 1.0 / base ** (np.arange(0, rd, 2) / rd)
    ang = np.repeat(np.outer(pos, inv), 2, -1)
    xr = x[..., :rd]
    every_two = np.stack([-xr[..., 1::2], xr[..., ::2]], -1).reshape(xr.shape)
    return np.concatenate([xr * np.cos(ang) + every_two * np.sin(ang), x[..., rd:]], -1)


@pytest.mark.parametrize("layout,rd", [("neox", 0), ("neox", 8), ("gptj", 0), ("gptj", 12)])
def test_rotary_matches_hugging_face_formulas(layout, rd):
    x = rng.standard_normal((2, 3, 9, 16))
    pos = np.arange(9) + 40
    want = (llama_rope if layout == "neox" else gptj_rope)(x, pos, 10000.0, rd or 16)
    np.testing.assert_allclose(qkv.apply_rotary(x, offset=40, layout=layout, rotary_dim=rd), want, atol=1e-12)
    np.testing.assert_allclose(qkv.apply_rotary(x, pos, layout=layout, rotary_dim=rd), want, atol=1e-12)
    ragged = qkv.apply_rotary(x, np.stack([pos, pos - 40]), layout=layout, rotary_dim=rd)
    np.testing.assert_allclose(ragged[0], want[0], atol=1e-12)
    with pytest.raises(ValueError, match="apply_rotary: layout must be 'neox' or 'gptj'"):
        qkv.apply_rotary(x, layout="llama")


def test_mha_layer_prefill_and_decode_with_a_cache():
    mha = qkv.nn.MultiheadAttention(16, 4, batch_first=True)
    x = rng.standard_normal((2, 40, 16)).astype(np.float32)
    mask = np.triu(np.ones((40, 40), bool), 1)  # torch's convention: True = not allowed
    full, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
    cache = qkv.KVCache(2, 4, 4, 40)
    first = x[:, :8]
    out, w = mha(first, first, first, cache=cache)
    assert w is None
    np.testing.assert_allclose(out, full[:, :8], atol=2e-6)
    for t in range(8, 40):
        step = x[:, t:t + 1]
        np.testing.assert_allclose(mha(step, step, step, cache=cache)[0], full[:, t:t + 1], atol=2e-6)
    assert cache.lengths == [40, 40]
    with pytest.raises(ValueError, match="with a cache, key and value must be the query itself"):
        mha(first, x[:, :8].copy(), first, cache=cache)


def test_medium_precision_on_a_bf16_cache_stays_close():
    cache = qkv.KVCache(1, 2, 32, 600, dtype="bfloat16")
    cache.append(rng.standard_normal((1, 2, 600, 32)), rng.standard_normal((1, 2, 600, 32)))
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    exact = qkv.decode_attention(q, cache)
    np.testing.assert_allclose(qkv.decode_attention(q, cache, matmul_precision="medium"), exact, atol=1e-2)
    with pytest.raises(ValueError, match="decode_attention: matmul_precision must be 'highest', 'high' or 'medium'"):
        qkv.decode_attention(q, cache, matmul_precision="low")


def test_cli_bench_decode_reports_time_and_bandwidth(run):
    import json

    out = run("bench", "decode", "--cache-len", "64", "--cache-len", "128", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "16", "--dtype", "bfloat16", "--min-time", "0", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["cache_len"] for r in rows] == [64, 128]
    assert all(r["dtype"] == "bfloat16" and r["ms"] > 0 and r["gb_per_s"] > 0 for r in rows)
    bad = run("bench", "decode", "--heads", "4", "--kv-heads", "3", "--min-time", "0")
    # a usage error before the cache is allocated and filled (it was decode_attention's, after)
    assert bad.returncode == 2 and "--heads 4 must be a multiple of --kv-heads 3" in bad.stderr


def test_int8_cache_is_close_to_float32():
    k, v = rng.standard_normal((1, 2, 500, 32)), rng.standard_normal((1, 2, 500, 32))
    exact, small = qkv.KVCache(1, 2, 32, 500), qkv.KVCache(1, 2, 32, 500, dtype="int8")
    exact.append(k, v)
    small.append(k, v)
    q = rng.standard_normal((1, 4, 1, 32)).astype(np.float32)
    a, b = qkv.decode_attention(q, small), qkv.decode_attention(q, exact)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 2e-2
    assert small.keys.dtype == np.int8


def test_cache_state_saves_and_loads(tmp_path):
    cache = qkv.KVCache(2, 2, 8, 50, dtype="int8")
    cache.append(rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 8)), counts=[9, 4])
    qkv.save(tmp_path / "cache.safetensors", cache.state())
    back = qkv.KVCache.from_state(qkv.load(tmp_path / "cache.safetensors"))
    assert back.lengths == [9, 4] and back.capacity == 50
    q = rng.standard_normal((2, 4, 1, 8)).astype(np.float32)
    np.testing.assert_array_equal(qkv.decode_attention(q, back), qkv.decode_attention(q, cache))


def test_a_cache_too_large_is_a_memory_error_naming_kvcache():
    # 2^40 sequences of capacity 0: their lengths and block tables ended in a bare std::bad_alloc
    # ("qkv: out of memory (std::bad_alloc)"), without the op or the size
    with pytest.raises(MemoryError, match=r"^KVCache: per-sequence state of 1099511627776 sequences .* bytes"):
        qkv.KVCache(2**40, 1, 8, 0)
    with pytest.raises(MemoryError, match=r"^KVCache: keys \[1, 1, 1099511627776, 8\] float32 needs 35184372088832 bytes"):
        qkv.KVCache(1, 1, 8, 2**40)


def test_from_state_refuses_integer_scales_and_a_2d_rotary_entry_naming_from_state():
    cache = qkv.KVCache(1, 1, 16, 4, dtype="int8", rotary=True)
    cache.append(rng.standard_normal((1, 1, 2, 16)).astype(np.float32), rng.standard_normal((1, 1, 2, 16)).astype(np.float32))
    state = cache.state()
    bad = dict(state, key_scales=np.ones(state["key_scales"].shape, np.int8))  # was read as scale 1.0
    with pytest.raises(TypeError, match=r"^KVCache.from_state: 'key_scales' must be floating point, got int8"):
        qkv.KVCache.from_state(bad)
    with pytest.raises(ValueError, match=r"^KVCache.from_state: 'rotary' must be 1-D \[base, layout, rotary_dim\]"):
        qkv.KVCache.from_state(dict(state, rotary=state["rotary"].reshape(1, 3)))
    with pytest.raises(ValueError, match=r"^KVCache.from_state: window, page_size and pages must be >= 0"):
        qkv.KVCache.from_state(dict(state, window=np.array([9], np.int64)))
    assert qkv.KVCache.from_state(state).lengths == [2]


def test_two_threads_on_one_cache_neither_crash_nor_mix_states():
    # append / reset and decode_attention release the GIL: on one paged cache from three
    # threads, decode read pages that reset and append were refilling with other keys, block
    # tables they were emptying and lengths that changed under it (1 to 5 decodes of ~800 matched
    # no state). The cache's lock (docs/decode.md) lets each decode see one state: its output is
    # that of keys set c after its first L positions, for some c and L.
    import threading
    n, step, hk, hq, d = 1024, 16, 2, 4, 64
    kv = rng.standard_normal((2, 2, 1, hk, n, d)).astype(np.float32)  # [set, k/v, B, Hk, n, D]
    q = rng.standard_normal((1, hq, 1, d)).astype(np.float32)
    want = [np.zeros((hq, d))]  # [state][Hq, D]: no key gives 0
    for c in range(2):
        for length in range(step, n + 1, step):
            rows = np.zeros((hq, d))
            for h in range(hq):
                k, v = kv[c, 0, 0, h // (hq // hk), :length], kv[c, 1, 0, h // (hq // hk), :length]
                s = k.astype(np.float64) @ q[0, h, 0] / np.sqrt(d)
                w = np.exp(s - s.max())
                rows[h] = (w / w.sum()) @ v
            want.append(rows)
    want = np.stack(want)
    cache = qkv.KVCache(1, hk, d, n, page_size=4, pages=n // 4)
    stop, errors, seen = threading.Event(), [], set()

    def writer():
        try:
            for r in range(150):
                cache.reset()
                for t in range(0, n, step):
                    cache.append(kv[r % 2, 0, :, :, t:t + step], kv[r % 2, 1, :, :, t:t + step])
                    if t % 256 == 0:
                        cache.set_length(0, cache.lengths[0])  # another writer
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            stop.set()

    def reader():
        try:
            while not stop.is_set():
                out = qkv.decode_attention(q, cache, chunk=8).astype(np.float64)  # [1, Hq, 1, D]
                gap = np.abs(want - out[0, :, 0]).max(axis=(1, 2))
                if gap.min() > 1e-4:
                    errors.append(f"decode matched no state: closest {gap.argmin()} at {gap.min()}")
                seen.add(int(gap.argmin()))
                cache.block_table(0), cache.first_kept(0), cache.lengths
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
            stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(seen) > 2  # the readers did run between appends
