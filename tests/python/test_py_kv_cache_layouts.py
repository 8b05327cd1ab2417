"""qkv.KVCache(window=..., page_size=..., rotary=...): a sliding-window ring against a full cache
with the same window, fused rotary against Hugging Face's rotary formulas (NumPy) + NumPy decode,
a paged cache against the contiguous one bit for bit, state round trips."""
import numpy as np
import pytest
from test_py_decode import gptj_rope, llama_rope, numpy_decode

import qkv

rng = np.random.default_rng(17)


def feed(caches, steps, t, hk=2, d=16, b=3):
    for s in range(steps):
        counts = [(5 * s + 3 * i) % (t + 1) for i in range(b)]
        k, v = rng.standard_normal((b, hk, t, d)), rng.standard_normal((b, hk, t, d))
        for cache in caches:
            cache.append(k, v, counts=counts)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_window_ring_equals_a_full_cache_with_the_window(dtype):
    ring, full = qkv.KVCache(3, 2, 16, 20, dtype=dtype, window=16), qkv.KVCache(3, 2, 16, 400, dtype=dtype)
    feed([ring, full], 25, 9)
    assert ring.lengths == full.lengths and max(ring.lengths) > 60 and ring.window == 16
    assert ring.first_kept(0) == max(0, ring.lengths[0] - 20)
    np.testing.assert_array_equal(ring.sequence_keys(1), full.sequence_keys(1)[:, ring.first_kept(1):])
    for lq in (1, 3):
        q = rng.standard_normal((3, 4, lq, 16)).astype(np.float32)
        np.testing.assert_allclose(qkv.decode_attention(q, ring), qkv.decode_attention(q, full, window=16), atol=2e-6)
        np.testing.assert_allclose(qkv.decode_attention(q, ring, window=5), qkv.decode_attention(q, full, window=5),
                                   atol=2e-6)
    with pytest.raises(ValueError, match="window 17 is wider than the cache's window 16"):
        qkv.decode_attention(q, ring, window=17)


@pytest.mark.parametrize("layout,rd", [("neox", 0), ("neox", 8), ("gptj", 0), ("gptj", 12)])
def test_fused_rotary_matches_hugging_face_formulas(layout, rd):
    rope = llama_rope if layout == "neox" else gptj_rope
    cache = qkv.KVCache(2, 2, 16, 64, rotary=True, rotary_layout=layout, rotary_base=500000.0, rotary_dim=rd)
    keys = [[], []]
    for s in range(4):
        k, v = rng.standard_normal((2, 2, 6, 16)), rng.standard_normal((2, 2, 6, 16))
        counts = [6, (3 * s) % 7]
        for b in range(2):
            at = cache.lengths[b]
            keys[b].append(rope(k[b, :, :counts[b]], np.arange(at, at + counts[b]), 500000.0, rd or 16))
        cache.append(k, v, counts=counts)
    for b in range(2):
        np.testing.assert_allclose(cache.sequence_keys(b), np.concatenate(keys[b], 1), atol=2e-5)
    lq = 2
    q = rng.standard_normal((2, 4, lq, 16)).astype(np.float32)
    qr = np.stack([rope(q[b], np.arange(cache.lengths[b] - lq, cache.lengths[b]), 500000.0, rd or 16)
                   for b in range(2)])
    want = numpy_decode(qr, np.stack([np.pad(cache.sequence_keys(b), ((0, 0), (0, 24 - cache.lengths[b]), (0, 0)))
                                      for b in range(2)]),
                        np.stack([np.pad(cache.sequence_values(b), ((0, 0), (0, 24 - cache.lengths[b]), (0, 0)))
                                  for b in range(2)]), cache.lengths)
    np.testing.assert_allclose(qkv.decode_attention(q, cache), want, atol=2e-6)
    with pytest.raises(ValueError, match="KVCache: layout must be 'neox' or 'gptj'"):
        qkv.KVCache(1, 1, 16, 4, rotary=True, rotary_layout="llama")


@pytest.mark.parametrize("page_size", [1, 7, 64])
def test_paged_cache_equals_the_contiguous_cache_bit_for_bit(page_size, tmp_path):
    paged, flat = qkv.KVCache(3, 2, 16, 500, page_size=page_size), qkv.KVCache(3, 2, 16, 500)
    feed([paged, flat], 12, 40)
    assert paged.lengths == flat.lengths and paged.page_size == page_size
    used = sum(len(paged.block_table(b)) for b in range(3))
    assert used == sum(-(-n // page_size) for n in paged.lengths) and paged.free_pages == paged.pages - used
    q = rng.standard_normal((3, 8, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(qkv.decode_attention(q, paged), qkv.decode_attention(q, flat))
    np.testing.assert_array_equal(qkv.decode_attention(q, paged, window=9, softcap=3.0),
                                  qkv.decode_attention(q, flat, window=9, softcap=3.0))
    qkv.save(tmp_path / "paged.safetensors", paged.state())
    back = qkv.KVCache.from_state(qkv.load(tmp_path / "paged.safetensors"))
    assert back.page_size == page_size and back.lengths == paged.lengths
    np.testing.assert_array_equal(qkv.decode_attention(q, back), qkv.decode_attention(q, flat))


def test_paged_pool_exhaustion():
    cache = qkv.KVCache(2, 1, 8, 16, page_size=4, pages=3)
    k = rng.standard_normal((2, 1, 8, 8))
    cache.append(k, k, counts=[8, 0])
    with pytest.raises(ValueError, match="the page pool is exhausted: this append needs 2 more pages of 4 positions, "
                                         "1 of 3 are free"):
        cache.append(k, k, counts=[0, 8])
    assert cache.lengths == [8, 0]
    cache.reset()
    assert cache.free_pages == 3


def test_cli_bench_decode_paged_and_windowed(run):
    import json

    for extra, key, value in [(["--page-size", "16"], "page_size", 16), (["--window", "32"], "window", 32)]:
        out = run("bench", "decode", "--cache-len", "100", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                  "--min-time", "0", "--json", *extra)
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout)
        assert row[key] == value and row["ms"] > 0 and row["gb_per_s"] > 0
    # a ring starts at its last `capacity` positions: filling 2^63 - 1 of them never ended, and the
    # slices' ends overflowed
    out = run("bench", "decode", "--cache-len", 2**63 - 1, "--window", "4", "--page-size", "2", "--heads", "2",
              "--kv-heads", "1", "--head-dim", "8", "--min-time", "0", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cache_len"] == 2**63 - 1


def test_windowed_pages_return_to_the_pool_and_decode_as_the_ring():
    paged = qkv.KVCache(3, 2, 16, 20, window=16, page_size=7)
    ring = qkv.KVCache(3, 2, 16, 20, window=16)
    feed([paged, ring], 25, 9)
    q = rng.standard_normal((3, 4, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(qkv.decode_attention(q, paged), qkv.decode_attention(q, ring))
    assert all(len(paged.block_table(b)) <= 4 and min(paged.block_table(b)) >= 0 for b in range(3))
    assert paged.first_block(0) > 0 and paged.pages == 12
    # evicted pages leave the table: a ring at 2^40 positions holds a table of ~capacity / page_size + 1 entries
    paged.set_length(1, 2**40)
    assert len(paged.block_table(1)) <= 4 and paged.first_block(1) == (2**40 - 20) // 7
    keys, values = paged.sequence_keys(1)[None], paged.sequence_values(1)[None]  # the 20 kept positions
    want = numpy_decode(q[1:2], keys, values, [20], window=16)
    np.testing.assert_allclose(qkv.decode_attention(q, paged)[1:2], want, atol=1e-5)


def test_from_state_rejects_a_first_kept_the_cache_cannot_have(tmp_path):
    # a cache without a window stores every position from 0; a ring keeps [n - capacity, n - window]
    plain = qkv.KVCache(2, 2, 8, 10)
    plain.append(rng.standard_normal((2, 2, 6, 8)), rng.standard_normal((2, 2, 6, 8)), counts=[6, 3])
    state = plain.state()
    state["first_kept"] = np.array([2, 0], dtype=np.int64)
    qkv.save(tmp_path / "plain.safetensors", state)
    with pytest.raises(ValueError, match=r"first_kept\[0\] = 2 for a cache without a window \(window 0, capacity 10"):
        qkv.KVCache.from_state(qkv.load(tmp_path / "plain.safetensors"))
    ring = qkv.KVCache(2, 2, 8, 6, window=4)
    ring.append(rng.standard_normal((2, 2, 10, 8)), rng.standard_normal((2, 2, 10, 8)), counts=[10, 6])
    state = ring.state()
    assert list(state["first_kept"]) == [4, 0]
    state["first_kept"] = np.array([3, 0], dtype=np.int64)
    with pytest.raises(ValueError, match=r"first_kept\[0\] = 3 is outside \[4, 6\] for lengths\[0\] = 10, window 4"):
        qkv.KVCache.from_state(state)
    state["first_kept"] = np.array([4], dtype=np.int64)
    with pytest.raises(ValueError, match=r"'first_kept' must hold one position per sequence \(2\), got 1"):
        qkv.KVCache.from_state(state)


def test_rotary_positions_past_2_to_53_are_errors():
    x = rng.standard_normal((1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"apply_rotary: positions offset \+ t must lie within \+-2\^53"):
        qkv.apply_rotary(x, offset=2**63 - 1)
    with pytest.raises(ValueError, match=r"got 9007199254740993 at flat index 1"):
        qkv.apply_rotary(x, np.array([0, 2**53 + 1, 2]))
    assert np.isfinite(qkv.apply_rotary(x, offset=2**53 - 2)).all()
    ring = qkv.KVCache(1, 2, 8, 6, window=4, rotary=True)
    ring.set_length(0, 2**53 - 1)
    with pytest.raises(ValueError, match=r"KVCache.append: sequence 0's rotary positions 9007199254740991 \.\. "):
        ring.append(x, x)
    assert ring.lengths == [2**53 - 1]
