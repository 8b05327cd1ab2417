"""qkv.KVCache + qkv.decode_attention (+ qkv.apply_rotary) against ONNX Runtime's
GroupQueryAttention: the fixtures of tests/attention/make_gqa_fixtures.py (tests/fixtures/gqa),
read here through the Python surface (the C++ twin is tests/attention/decode_ort_test.cc).

One qkv cache lives through every step of a scenario, as a generation loop keeps it: the prompt
is appended with counts = each sequence's length (ORT right-pads it), later steps append their S
new tokens, and decode_attention runs the queries as the last S positions of each sequence
(right-aligned: a padded prompt's rows move to the end). Two ways: "by hand" rotates queries and
keys with apply_rotary at ORT's position ids (prompt: t, later: past + t) into a plain cache and
passes window = local_window_size; "fused" gives the cache the rotary settings and the window
(a ring smaller than the sequence where a window is set) and passes the tokens unrotated. Output
rows that are tokens and the cache's stored keys/values must equal ORT's output and
present_key/present_value to 1e-5 relative (max |qkv - ORT| / max |ORT|)."""
from pathlib import Path

import numpy as np
import pytest

import qkv
from fixture_files import load, rel_err

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "gqa").glob("*.safetensors"))
TOL = 1e-5


def heads(x, h):
    """ORT's [B, S, H*D] as qkv's [B, H, S, D]."""
    b, s, _ = x.shape
    return x.reshape(b, s, h, -1).transpose(0, 2, 1, 3)


def step_lengths(t, o, i, held):
    """(whether step i is ORT's first prompt, the tokens each sequence takes in it)."""
    s = t[f"step{i}.query"].shape[1]
    prompt = i == 0 and t["step0.past_key"].shape[2] == 0 and s == int(t["step0.total_sequence_length"][0])
    total = t[f"step{i}.seqlens_k"].astype(np.int64) + 1
    new = total if prompt else np.full(o["batch"], s)
    assert np.array_equal(held + new, total), "the fixture's lengths disagree with the steps"
    return prompt, new


def rotate(x, positions, o, fused):
    if fused or not o.get("do_rotary"):
        return x
    layout = "gptj" if o.get("rotary_interleaved") else "neox"
    return qkv.apply_rotary(x, positions, base=o["rotary_base"], layout=layout, rotary_dim=o["rotary_dim"])


def make_cache(t, o, fused):
    b, hk, d = o["batch"], o["kv_num_heads"], o["head_dim"]
    total = int(t[f"step{o['steps'] - 1}.total_sequence_length"][0])
    window = max(o.get("local_window_size", -1), 0)
    if not fused:
        return qkv.KVCache(b, hk, d, total)
    longest_step = max(t[f"step{i}.query"].shape[1] for i in range(o["steps"]))
    capacity = window + longest_step - 1 if window else total  # a ring: the window and a step's queries
    return qkv.KVCache(b, hk, d, capacity, window=window, rotary=bool(o.get("do_rotary")),
                       rotary_base=o["rotary_base"], rotary_layout="gptj" if o.get("rotary_interleaved") else "neox",
                       rotary_dim=o["rotary_dim"])


def run_step(cache, t, o, i, held, fused):
    """qkv's step i; returns (output [B, S, Hq*D] with ORT's row order, tokens per sequence)."""
    hq, hk = o["num_heads"], o["kv_num_heads"]
    q, k, v = heads(t[f"step{i}.query"], hq), heads(t[f"step{i}.key"], hk), heads(t[f"step{i}.value"], hk)
    b, _, s, d = q.shape
    prompt, new = step_lengths(t, o, i, held)
    positions = np.arange(s)[None, :] + (np.zeros((b, 1), np.int64) if prompt else held[:, None])  # [B, S]
    q, k = rotate(q, positions, o, fused), rotate(k, positions, o, fused)
    cache.append(k, v, counts=[int(n) for n in new])
    shifted = np.zeros_like(q)  # each sequence's new rows as its last rows
    for s_ in range(b):
        shifted[s_, :, s - new[s_]:] = q[s_, :, :new[s_]]
    # ORT 1.32's local_window_size W: a query sees the W keys up to and including its own
    # (the docs' window, the same W; older ORT CPU kernels saw W + 1)
    window = 0 if fused else max(o.get("local_window_size", -1), 0)  # fused: the cache's window
    out = qkv.decode_attention(shifted, cache, scale=o.get("scale"), softcap=o.get("softcap", 0.0), window=window)
    rows = np.zeros((b, hq, s, d), np.float32)
    for s_ in range(b):
        rows[s_, :, :new[s_]] = out[s_, :, s - new[s_]:]
    return rows.transpose(0, 2, 1, 3).reshape(b, s, hq * d), new


@pytest.mark.parametrize("fused", [False, True], ids=["by_hand", "fused"])
@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_decode_equals_onnxruntime_gqa(path, fused):
    t, o = load(path)
    b = o["batch"]
    cache = make_cache(t, o, fused)
    held = np.zeros(b, np.int64)
    past = t["step0.past_key"].shape[2]
    if past:  # a first step with a given past: the cache starts with ORT's past
        assert not o.get("do_rotary"), "ORT's past keys are rotated: a fused-rotary cache would rotate them again"
        held = t["step0.seqlens_k"].astype(np.int64) + 1 - t["step0.query"].shape[1]
        cache.append(t["step0.past_key"], t["step0.past_value"], counts=[int(n) for n in held])
    for i in range(o["steps"]):
        got, new = run_step(cache, t, o, i, held, fused)
        held = held + new
        assert cache.lengths == list(held)
        for s_ in range(b):  # the rows that are tokens (a padded prompt's others are not)
            want = t[f"step{i}.output"][s_, :new[s_]]
            assert rel_err(got[s_, :new[s_]], want) <= TOL, (i, s_)
            first = cache.first_kept(s_)  # > 0 once a ring evicted old positions
            for name, mine in (("present_key", cache.sequence_keys), ("present_value", cache.sequence_values)):
                ort = t[f"step{i}.{name}"][s_, :, first:held[s_]]
                assert rel_err(mine(s_), ort) <= TOL, (i, s_, name)


def test_the_fixtures_are_there():
    names = {p.stem for p in FIXTURES}
    assert {"generate", "prefill_ragged", "decode_ragged", "mqa_generate", "rotary_neox", "rotary_gptj",
            "window", "softcap_scale"} <= names
