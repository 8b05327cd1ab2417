#!/usr/bin/env python3
"""Writes Keras 3 fixtures for qkv's additive and dot-product attention (issue 16 item 2).

Usage: KERAS_BACKEND=jax make_keras_attention_fixtures.py OUTPUT_DIR   (the committed way: `make fixtures`)

Each configuration runs keras.layers.AdditiveAttention or keras.layers.Attention
(score_mode="dot") on float32 query, value and key with a set scale and writes
OUTPUT_DIR/<name>.safetensors: query, value, key, scale, value_mask (when used) and out, the
layer's output. `__metadata__` "options" (one key) names the layer and its arguments.
A rerun writes byte-identical files.
"""
import json
import os
import sys

import keras
import numpy as np
from safetensors.numpy import save_file

CONFIGS = [
    ("additive_plain", "AdditiveAttention", (2, 4, 5, 6), dict(), False, False),
    ("additive_value_mask", "AdditiveAttention", (2, 4, 5, 6), dict(), True, False),
    ("additive_causal", "AdditiveAttention", (2, 5, 5, 3), dict(), False, True),
    ("additive_all_masked_row", "AdditiveAttention", (2, 3, 4, 4), dict(), "all_false_first", False),
    ("dot_scaled_value_mask", "Attention", (3, 4, 6, 8), dict(score_mode="dot"), True, False),
    ("concat_scaled", "Attention", (2, 3, 5, 4), dict(score_mode="concat"), True, False),
]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(1616)
    for name, kind, (b, tq, tk, d), kwargs, masked, causal in CONFIGS:
        q = rng.standard_normal((b, tq, d)).astype(np.float32)
        v = rng.standard_normal((b, tk, d)).astype(np.float32)
        k = rng.standard_normal((b, tk, d)).astype(np.float32)
        layer = getattr(keras.layers, kind)(use_scale=True, **kwargs)
        layer.build([q.shape, v.shape, k.shape])
        scale = (rng.standard_normal(d) if kind == "AdditiveAttention" else np.array([0.7])).astype(np.float32)
        layer.scale.assign(scale.reshape(layer.scale.shape))
        if kwargs.get("score_mode") == "concat":
            layer.concat_score_weight.assign(np.float32(1.3))
        mask = None
        if masked:
            mask = rng.random((b, tk)) < 0.7
            mask[:, 0] = True
            if masked == "all_false_first":
                mask[0, :] = False  # Keras: scores - 1e9 everywhere in the row: uniform weights
        out = layer([q, v, k], mask=[None, mask] if mask is not None else None, use_causal_mask=causal)
        tensors = {"query": q, "value": v, "key": k, "scale": scale, "out": np.asarray(out, np.float32)}
        if kwargs.get("score_mode") == "concat":
            tensors["concat_score_weight"] = np.array([1.3], np.float32)
        if mask is not None:
            tensors["value_mask"] = mask
        options = {"layer": kind, "kwargs": kwargs, "use_causal_mask": causal}
        save_file(tensors, os.path.join(out_dir, name + ".safetensors"), metadata={"options": json.dumps(options)})
    print(f"wrote {len(CONFIGS)} fixtures (keras {keras.__version__}) to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1])
