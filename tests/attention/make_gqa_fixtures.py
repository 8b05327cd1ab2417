"""ONNX Runtime GroupQueryAttention fixtures for qkv's KV cache and decode attention (issue 17
item 4): each scenario builds an ONNX model with one com.microsoft GroupQueryAttention node
(docs/ContribOperators.md in microsoft/onnxruntime) and runs it on the CPU execution provider,
float32, one thread: a prefill (no past) or a first step with a given past, then decode steps
that feed each step's present_key / present_value back as the next step's past (BNSH buffers
that grow to total_sequence_length, not shared), with ragged per-sequence lengths (seqlens_k =
each sequence's total length - 1), GQA (8 query heads, 2 KV heads) or MQA (1 KV head), rotary
embeddings from cos/sin caches (rotary_interleaved 0: GPT-NeoX pairs, 1: GPT-J pairs; the caches
are cos/sin(p * base^(-2i / rotary_dim)), rounded to float32), softcap, a custom scale and
local_window_size.

Each OUT_DIR/<name>.safetensors holds, per step i, ORT's inputs and outputs as ORT takes and
gives them: step<i>.query [B, S, Hq*D], step<i>.key / step<i>.value [B, S, Hk*D],
step<i>.seqlens_k int32 [B], step<i>.total_sequence_length int32 [1] (ORT was given the scalar),
step<i>.output [B, S, Hq*D], step<i>.present_key / step<i>.present_value [B, Hk, T, D]; the first
step's past_key / past_value (later steps' pasts are the previous step's presents); cos_cache /
sin_cache [max_len, rotary_dim / 2] when rotary. One metadata key "options": the JSON of the
node's attributes, the shapes, the step count and the rotary base. In a prompt step (no past,
S = total_sequence_length) sequence b is right-padded: only rows t <= seqlens_k[b] are its
tokens (ORT's rows past them are padding and not compared). A rerun writes the same bytes.
tests/attention/decode_ort_test.cc and tests/python/test_decode_ort.py run qkv on them.
Run: .venv-fixtures/bin/python tests/attention/make_gqa_fixtures.py tests/fixtures/gqa
"""
import json
import os
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from safetensors.numpy import save_file

D = 32  # cos_cache widths must be multiples of 8 (ORT): partial rotary needs rotary_dim 16 < D
BASE = 10000.0
MAX_LEN = 32  # rows of the cos/sin caches


def gqa_model(hq, hk, attrs):
    """An ONNX model of one GroupQueryAttention node; inputs and outputs named as in the spec."""
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    if attrs.get("do_rotary"):
        names += ["cos_cache", "sin_cache"]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=hq, kv_num_heads=hk, **attrs)
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    info = helper.make_tensor_value_info
    inputs = [info(n, i32 if n in ("seqlens_k", "total_sequence_length") else f32, None) for n in names]
    outputs = [info(n, f32, None) for n in ("output", "present_key", "present_value")]
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one thread: the same bits on every run
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def rotary_caches(rotary_dim):
    """cos/sin [MAX_LEN, rotary_dim / 2] of p * base^(-2i / rotary_dim), float64 rounded to float32."""
    inv = BASE ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.arange(MAX_LEN, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# name: batch, heads, KV heads, the first step's past lengths (None: a prompt), the new tokens
# per step (prompt: S and the ragged lengths), node attributes, rotary_dim, query scale.
SCENARIOS = {
    "prefill_ragged": dict(b=3, hk=2, past=None, steps=[(6, [6, 4, 1])], attrs={}),
    "decode_ragged": dict(b=3, hk=2, past=[7, 4, 1], steps=[1], attrs={}),
    "generate": dict(b=2, hk=2, past=None, steps=[(5, [5, 3]), 1, 1, 1], attrs={}),
    "mqa_generate": dict(b=3, hk=1, past=None, steps=[(4, [4, 2, 3]), 1, 1], attrs={}),
    "chunked_prefill": dict(b=1, hk=2, past=[5], steps=[4, 1], attrs={}),
    "softcap_scale": dict(b=2, hk=2, past=[9, 3], steps=[1, 1], attrs={"softcap": 2.0, "scale": 0.4}, q_scale=3.0),
    "rotary_neox": dict(b=2, hk=2, past=None, steps=[(6, [6, 2]), 1, 1],
                        attrs={"do_rotary": 1, "rotary_interleaved": 0}, rotary_dim=D),
    "rotary_gptj": dict(b=2, hk=2, past=None, steps=[(6, [3, 6]), 1, 1],
                        attrs={"do_rotary": 1, "rotary_interleaved": 1}, rotary_dim=D),
    "rotary_partial": dict(b=2, hk=2, past=None, steps=[(5, [5, 4]), 1],
                           attrs={"do_rotary": 1, "rotary_interleaved": 0}, rotary_dim=D // 2),
    "window": dict(b=2, hk=2, past=None, steps=[(9, [9, 5]), 1, 1, 1], attrs={"local_window_size": 3}),
    "window_rotary_softcap": dict(b=3, hk=2, past=None, steps=[(8, [8, 3, 6]), 1, 1],
                                  attrs={"local_window_size": 4, "softcap": 3.0, "do_rotary": 1,
                                         "rotary_interleaved": 1}, rotary_dim=D, q_scale=2.0),
}


def run_scenario(name, cfg, rng):
    hq, hk, b = 8, cfg["hk"], cfg["b"]
    session = gqa_model(hq, hk, cfg["attrs"])
    tensors = {}
    feeds_extra = {}
    if cfg["attrs"].get("do_rotary"):
        cos, sin = rotary_caches(cfg["rotary_dim"])
        tensors.update(cos_cache=cos, sin_cache=sin)
        feeds_extra.update(cos_cache=cos, sin_cache=sin)
    lengths = np.array(cfg["past"] or [0] * b, np.int64)  # tokens each sequence holds
    past_len = int(lengths.max())
    past_k = rng.standard_normal((b, hk, past_len, D)).astype(np.float32)
    past_v = rng.standard_normal((b, hk, past_len, D)).astype(np.float32)
    tensors.update({"step0.past_key": past_k, "step0.past_value": past_v})
    for i, step in enumerate(cfg["steps"]):
        if isinstance(step, tuple):  # a prompt: S tokens, ragged (right-padded) lengths
            s, new = step[0], np.array(step[1], np.int64)
        else:
            s, new = step, np.full(b, step, np.int64)
        lengths = lengths + new
        q = (rng.standard_normal((b, s, hq * D)) * cfg.get("q_scale", 1.0)).astype(np.float32)
        k = rng.standard_normal((b, s, hk * D)).astype(np.float32)
        v = rng.standard_normal((b, s, hk * D)).astype(np.float32)
        seqlens_k = (lengths - 1).astype(np.int32)
        total = np.array(lengths.max(), np.int32)
        out, past_k, past_v = session.run(None, dict(query=q, key=k, value=v, past_key=past_k, past_value=past_v,
                                                     seqlens_k=seqlens_k, total_sequence_length=total, **feeds_extra))
        p = f"step{i}."
        tensors.update({p + "query": q, p + "key": k, p + "value": v, p + "seqlens_k": seqlens_k,
                        p + "total_sequence_length": total.reshape(1), p + "output": out,
                        p + "present_key": past_k, p + "present_value": past_v})
    options = dict(cfg["attrs"], num_heads=hq, kv_num_heads=hk, head_dim=D, batch=b, steps=len(cfg["steps"]),
                   rotary_base=BASE, rotary_dim=cfg.get("rotary_dim", 0), onnxruntime=ort.__version__)
    return tensors, options


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for n, (name, cfg) in enumerate(SCENARIOS.items()):
        tensors, options = run_scenario(name, cfg, np.random.default_rng(100 + n))
        tensors = {k: np.ascontiguousarray(t) for k, t in tensors.items()}
        save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"),
                  metadata={"options": json.dumps(options, sort_keys=True)})
        print(name, options["steps"], "steps")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "gqa"))
