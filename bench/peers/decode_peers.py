#!/usr/bin/env python3
"""One decode step (Lq = 1) against a KV cache: qkv beside PyTorch SDPA and ONNX Runtime's
GroupQueryAttention, same run (issue 17 item 6).

One invocation prints one Markdown table whose header names the machine. Per cache length and
batch (Hq = 32, Hk = 8, D = 128; float32, bfloat16 and float16 caches): qkv.decode_attention on a
qkv.KVCache, PyTorch F.scaled_dot_product_attention(q [B, Hq, 1, D], K, V [B, Hk, L, D],
enable_gqa=True) on the same keys, ONNX Runtime's com.microsoft GroupQueryAttention (CPU EP,
intra_op_num_threads = --threads) on the same keys, and a 2-thread memcpy of the same bytes
(numpy.copyto on two threads) as the bandwidth yardstick. Bandwidth = bytes of K and V read per
step / time.

ORT runs as ONNX Runtime GenAI runs it: past_key/past_value and present_key/present_value bound
to one buffer of L positions (past_present_share_buffer, no copy of the past), seqlens_k = L - 1,
total_sequence_length = L, the new token's key and value the buffer's last ones (ORT rewrites
them with the same values). ORT's CPU kernel has float32 and float16, no bfloat16: the bfloat16
rows have no ORT column. qkv and ORT are timed in alternating rounds (--rounds) so that both see
the same spells of load on a shared machine. Each row checks that ORT's output equals qkv's (1e-3
relative, float16 1e-2).

    PYTHONPATH=build/release/torch_stage .venv-fixtures/bin/python bench/peers/decode_peers.py
"""
import argparse
import os
import sys
import threading

import numpy as np

from precision_peers import machine
from timing import best_seconds

HQ, HK, D = 32, 8, 128


def memcpy_seconds(nbytes, threads, min_time):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)

    def copy():
        ts = [threading.Thread(target=np.copyto, args=(dst[p[0]:p[-1] + 1], src[p[0]:p[-1] + 1])) for p in parts]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return best_seconds(copy, min_time)


def ort_session(np_dtype, threads):
    """An ONNX Runtime session of one GroupQueryAttention node (Hq heads, Hk KV heads)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    t = TensorProto.FLOAT if np_dtype == np.float32 else TensorProto.FLOAT16
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=HQ, kv_num_heads=HK)
    info = helper.make_tensor_value_info
    inputs = [info(n, TensorProto.INT32 if n in names[5:] else t, None) for n in names]
    outputs = [info(n, t, None) for n in ("output", "present_key", "present_value")]
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_step(q, k, v, threads):
    """(a function running ORT's decode step, one returning its output [B, 1, Hq*D]): the past and
    present buffers are k and v themselves ([B, Hk, L, D], shared, not copied)."""
    import onnxruntime as ort

    session = ort_session(k.dtype.type, threads)
    b, length = k.shape[0], k.shape[2]
    bsnh = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, x.shape[2], -1))  # noqa: E731
    binding = session.io_binding()
    binding.bind_cpu_input("query", bsnh(q))
    binding.bind_cpu_input("key", bsnh(k[:, :, -1:]))  # the new token: the buffer's last position
    binding.bind_cpu_input("value", bsnh(v[:, :, -1:]))
    binding.bind_cpu_input("seqlens_k", np.full(b, length - 1, np.int32))
    binding.bind_cpu_input("total_sequence_length", np.array(length, np.int32))
    binding.bind_output("output")
    for past, present, x in (("past_key", "present_key", k), ("past_value", "present_value", v)):
        buffer = ort.OrtValue.ortvalue_from_numpy(x)
        binding.bind_ortvalue_input(past, buffer)
        binding.bind_ortvalue_output(present, buffer)
    return (lambda: session.run_with_iobinding(binding)), (lambda: binding.get_outputs()[0].numpy())


def interleaved(fns, min_time, rounds):
    """Best seconds of each function, measured in `rounds` alternating rounds of min_time / rounds
    each: on a shared machine every contender sees the same spells of load."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_seconds(fn, min_time / rounds))
    return best


def row(length, batch, dtype, threads, min_time, rounds):
    import torch
    import torch.nn.functional as F

    import qkv

    qkv.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((batch, HK, length, D), dtype=np.float32)
    v = rng.standard_normal((batch, HK, length, D), dtype=np.float32)
    q = rng.standard_normal((batch, HQ, 1, D), dtype=np.float32)
    cache = qkv.KVCache(batch, HK, D, length, dtype=dtype)
    cache.append(k, v)
    step = lambda: qkv.decode_attention(q, cache)  # noqa: E731
    ours = interleaved([step], min_time, rounds)[0]
    out = step().transpose(0, 2, 1, 3).reshape(batch, 1, HQ * D)
    cell = "n/a (no bf16 kernel)"
    ratio = "–"
    if dtype != "bfloat16":  # ORT's CPU GroupQueryAttention: float32 and float16 only
        kx, vx = (x if dtype == "float32" else x.astype(np.float16) for x in (k, v))
        run, result = ort_step(q.astype(kx.dtype), kx, vx, threads)
        ours_again, ort_s = interleaved([step, run], min_time, rounds)
        ours = min(ours, ours_again)
        err = np.abs(result().astype(np.float64) - out).max() / np.abs(out).max()
        assert err < (1e-3 if dtype == "float32" else 1e-2), f"ORT's output differs from qkv's by {err:.2e} relative"
        del kx, vx, run, result  # ORT's session and its (spinning) thread pool go before torch runs
        cell = None
    tdtype = getattr(torch, dtype)
    tq, tk, tv = (torch.from_numpy(x).to(tdtype) for x in (q, k, v))
    with torch.inference_mode():
        theirs = best_seconds(lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True), min_time)
    del tq, tk, tv
    nbytes = 2 * batch * HK * length * D * (4 if dtype == "float32" else 2)
    copy = memcpy_seconds(nbytes, threads, min_time)
    gb = lambda s: nbytes / s / 1e9  # noqa: E731
    if cell is None:
        cell, ratio = f"{ort_s * 1e3:.2f} ms, {gb(ort_s):.1f} GB/s", f"{ort_s / ours:.2f}×"
    return (f"| {length} | {batch} | {dtype} | {ours * 1e3:.2f} ms, {gb(ours):.1f} GB/s | "
            f"{theirs * 1e3:.2f} ms, {gb(theirs):.1f} GB/s | {theirs / ours:.2f}× | {cell} | {ratio} | "
            f"{gb(copy):.1f} GB/s | {copy / ours * 100:.0f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI (for the machine line)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--lengths", default="1024,8192,32768,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--rounds", type=int, default=4, help="alternating qkv / ORT rounds per row")
    a = ap.parse_args()
    import onnxruntime
    import torch

    print(f"{machine(a.qkv)}; {a.threads} threads; Hq={HQ}, Hk={HK}, D={D}, Lq=1; torch {torch.__version__}; "
          f"onnxruntime {onnxruntime.__version__}\n")
    print("| cache length | B | cache dtype | qkv decode_attention | torch SDPA (enable_gqa) | qkv / torch | "
          "ORT GroupQueryAttention | qkv / ORT | memcpy (same bytes) | qkv % of memcpy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch in map(int, a.batches.split(",")):
        for length in map(int, a.lengths.split(",")):
            if batch * length > 8 * 32768:  # the cache's K and V stay under ~4 GB f32
                continue
            for dtype in a.dtypes.split(","):
                print(row(length, batch, dtype, a.threads, a.min_time, a.rounds), flush=True)
                print(f"L={length} B={batch} {dtype} done, load {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
