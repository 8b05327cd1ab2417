"""The pictures of docs/attention-variants.md and docs/attention-variants-lsh.md, made by qkv itself (qkv.plot, libpng):
each modifier's mask pattern at L = 48, and the weights of one attention with ALiBi.

    PYTHONPATH=<a staged qkv> .venv/bin/python docs/images/make_pictures.py   (or after make python)
"""
import pathlib

import numpy as np

import qkv

OUT = pathlib.Path(__file__).resolve().parent
L = 48
M = qkv.AttentionMods
PATTERNS = {
    "causal": (M.causal(), L),
    "causal_bottom_right": (M.causal("bottom_right"), 32),
    "window": (M.sliding_window(6, 0), L),
    "dilated": (M(window_left=24, window_right=0, dilation=4), L),
    "prefix_lm": (M.prefix_lm(10), L),
    "longformer": (M.longformer(4, 4, [0, 24]), L),
    "bigbird": (M.bigbird(6, 1, 1, 0, 2 * L), 2 * L),
    "documents": (M(document_ids=np.repeat([0, 1, 2], [14, 20, 14]), window_right=0), L),
}

for name, (mods, lq) in PATTERNS.items():
    lk = lq if name == "bigbird" else L
    pattern = qkv.plot.mask_pattern(mods, lq, lk)
    qkv.plot.heatmap(pattern.astype(np.float32), OUT / f"pattern_{name}.png", cell=5 if lk == L else 3)
    print(name, pattern.mean())

rng = np.random.default_rng(0)
tokens = "the cat sat on the mat and looked at the dog".split()
q, k = (rng.standard_normal((1, 2, len(tokens), 16)) for _ in range(2))
_, w = qkv.scaled_dot_product_attention(q, k, k, return_weights=True,
                                        mods=M(window_right=0, alibi_slopes=np.array([0.5, 0.0])))
qkv.plot.heatmap(w[0], OUT / "weights_alibi.png", index=0, tokens=tokens, cell=24)

# LSH attention (Reformer): the merged weights of every (query, key) pair, read off as the output
# for v = the identity. 48 tokens from 4 clusters of 12 (tokens 0-11, 12-23, ...), 2 hash rounds
# into 4 buckets, chunks of 8 seeing themselves and the chunk before: a token attends only within
# its cluster, never to itself, and to the members its chunks hold.
centers = rng.standard_normal((4, 16)) * 3
qk_lsh = centers[np.repeat(np.arange(4), 12)] + rng.standard_normal((L, 16)) * 0.5
w_lsh = qkv.attention.lsh(qk_lsh, np.eye(L), n_hashes=2, n_buckets=4, chunk_length=8, seed=1)
qkv.plot.heatmap(w_lsh, OUT / "weights_lsh.png", cell=5)
print("lsh", (w_lsh > 1e-3).mean())
