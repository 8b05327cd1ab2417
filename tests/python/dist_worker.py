"""One rank of tests/python/test_dist.py's mpiexec job: qkv.dist on this rank's shards
against a float64 NumPy oracle of the whole sequence; rank 0 prints the worst relative
errors as JSON (the test asserts them)."""

import json
import sys

import numpy as np
from mpi4py import MPI

import qkv


def attention64(q, k, v, causal=False, mask=None):
    """softmax(q k^T / sqrt(D) [+ mask]) v in float64, GQA by repeating k/v heads."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def rel(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def main():
    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(0)  # the same draws on every rank
    errors = {}
    for causal, layout, hq, hk, length in [(False, "contiguous", 4, 4, 37), (True, "zigzag", 4, 2, 45),
                                           (True, "contiguous", 2, 1, 20)]:
        q = rng.standard_normal((2, hq, length, 16)).astype(np.float32)
        k = rng.standard_normal((2, hk, length, 16)).astype(np.float32)
        v = rng.standard_normal((2, hk, length, 8)).astype(np.float32)
        want = attention64(q, k, v, causal)
        mine = [qkv.dist.shard_sequence(x, r, p, layout=layout) for x in (q, k, v)]
        name = f"{'causal' if causal else 'full'}-{layout}-{hq}x{hk}"
        ring = qkv.dist.ring_attention(*mine, comm, is_causal=causal, layout=layout, enable_gqa=hq != hk)
        uly = qkv.dist.ulysses_attention(*mine, comm, is_causal=causal, layout=layout, enable_gqa=hq != hk)
        for scheme, out in (("ring", ring), ("ulysses", uly)):
            whole = qkv.dist.unshard_sequence(comm.allgather(np.asarray(out)), layout=layout)
            errors[f"{scheme}-{name}"] = rel(whole, want)
    # Ring backward: against float64 gradients of sum(out * dout) by NumPy's own chain rule.
    q, k, v = (rng.standard_normal((1, 2, 26, 8)) for _ in range(3))
    dout = rng.standard_normal((1, 2, 26, 8))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    s = np.where(np.tril(np.ones((26, 26), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    dw = dout @ np.swapaxes(v, -1, -2)
    ds = w * (dw - (dw * w).sum(-1, keepdims=True)) / np.sqrt(8)
    want = {"dq": ds @ k, "dk": np.swapaxes(ds, -1, -2) @ q, "dv": np.swapaxes(w, -1, -2) @ dout}
    mine = [qkv.dist.shard_sequence(x.astype(np.float32), r, p, layout="zigzag") for x in (q, k, v, dout)]
    out, lse = qkv.dist.ring_attention(*mine[:3], comm, is_causal=True, layout="zigzag", return_logsumexp=True)
    grads = qkv.dist.ring_attention_backward(*mine[:3], out, mine[3], lse, comm, is_causal=True, layout="zigzag")
    uly = qkv.dist.ulysses_attention_backward(*mine[:3], mine[3], comm, is_causal=True, layout="zigzag")
    for scheme, gs in (("ring", grads), ("ulysses", uly)):
        for name, g in zip(("dq", "dk", "dv"), gs):
            whole = qkv.dist.unshard_sequence(comm.allgather(np.asarray(g)), layout="zigzag")
            errors[f"{scheme}-backward-{name}"] = rel(whole, want[name])
    # Tensor parallel: Llama-style projections with GQA, against the same layer in NumPy.
    e, hq, hk, d = 16, 4, 2, 4
    sd = {n: rng.standard_normal(s).astype(np.float32) for n, s in
          [("q_proj.weight", (hq * d, e)), ("k_proj.weight", (hk * d, e)), ("v_proj.weight", (hk * d, e)),
           ("o_proj.weight", (e, hq * d)), ("o_proj.bias", (e,))]}
    x = rng.standard_normal((7, 3, e)).astype(np.float32)  # [L, N, E]
    layer = qkv.dist.TensorParallelAttention.from_projections(sd, e, hq, hk, comm)
    got = layer.forward(x, x, x, is_causal=True)
    heads = lambda w, h: (x.astype(np.float64) @ w.T).reshape(7, 3, h, d).transpose(1, 2, 0, 3)  # noqa: E731
    a = attention64(heads(sd["q_proj.weight"], hq), heads(sd["k_proj.weight"], hk), heads(sd["v_proj.weight"], hk),
                    causal=True)
    want = a.transpose(2, 0, 1, 3).reshape(7, 3, hq * d) @ sd["o_proj.weight"].T.astype(np.float64) + sd["o_proj.bias"]
    errors["tensor-parallel-gqa"] = rel(got, want)
    back = qkv.dist.TensorParallelAttention.from_shard(layer.shard_state_dict(), e, hq, hk, comm)
    errors["tensor-parallel-shard"] = rel(back.forward(x, x, x, is_causal=True), want)
    worst = comm.reduce(errors, op=lambda a, b: {n: max(a[n], b[n]) for n in a})
    if r == 0:
        json.dump({"ranks": p, "errors": worst}, sys.stdout)


def refusals():
    """Rank 1 passes arguments that fail to convert (they never reach the C++ call): every rank
    must raise at once, the others naming rank 1 and quoting its error. Rank 0 prints
    [[exception class, message] per rank] for each case as JSON."""
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    q = np.ones((1, 1, 4, 2), np.float32)
    e, h = 4, 2
    sd = {n: np.ones(s, np.float32) for n, s in [("q_proj.weight", (e, e)), ("k_proj.weight", (e, e)),
                                                  ("v_proj.weight", (e, e)), ("o_proj.weight", (e, e))]}
    layer = qkv.dist.TensorParallelAttention.from_projections(sd, e, h, h, comm)
    x = np.ones((3, 1, e), np.float32)
    odd = r == 1
    cases = {
        "ring": lambda: qkv.dist.ring_attention("not an array" if odd else q, q, q, comm),
        "ulysses": lambda: qkv.dist.ulysses_attention(q, q, q, comm, layout="zigag" if odd else "zigzag"),
        "from_projections": lambda: qkv.dist.TensorParallelAttention.from_projections(
            dict(sd, **{"o_proj.weight": "oops"}) if odd else sd, e, h, h, comm),
        "forward": lambda: layer.forward(x, x, x, is_causal="yes" if odd else False),
    }
    got = {}
    for name, call in cases.items():
        try:
            call()
            outcome = ["returned", ""]
        except Exception as err:  # noqa: BLE001 - the class is what is checked
            outcome = [type(err).__name__, str(err)]
        got[name] = comm.gather(outcome)
    ok = layer.forward(x, x, x)  # still in step
    got["in_step"] = comm.gather(float(np.abs(np.asarray(ok)).max()))
    if r == 0:
        json.dump(got, sys.stdout)


if __name__ == "__main__":
    refusals() if sys.argv[1:] == ["refusals"] else main()
