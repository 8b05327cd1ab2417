#!/usr/bin/env python3
"""Writes the Keras 3 gradient fixtures for qkv::nn::KerasMultiHeadAttention::backward.

Usage: KERAS_BACKEND=jax make_keras_mha_grad_fixtures.py OUTPUT_DIR    (`make fixtures`)

Every configuration becomes OUTPUT_DIR/<name>.safetensors holding
  mha/query/kernel, ..., mha/attention_output/bias   the layer's variables, float32
  input.query, input.value, input.key (optional)       float32
  input.query_mask, input.value_mask, input.key_mask, input.attention_mask  (optional)
  grad_output       float32, the output's shape: the loss is sum(output * grad_output), a random
                    projection of the output
  grad.query, grad.value, grad.key (when given)   d loss / d input by role, float64
  grad.mha/query/kernel, ...                       d loss / d variable, float64
and `__metadata__["options"]` (one key): JSON with the layer arguments (sliding_window and use_gate
only when set), the call flags,
which Keras code path ran, the versions and a description.

The gradients are jax.grad of keras.layers.MultiHeadAttention.stateless_call run in float64
(dtype="float64", jax_enable_x64) on the float64 upcast of the stored float32 numbers. Query,
value and key are separate arguments of the loss even when they hold the same numbers
(self-attention), so each gradient is the one of its role; when key is not given Keras uses
the value as key and grad.value holds both uses. The query mask is attached to the query
(backend.set_keras_mask), where Keras 3 reads it. Keras 3.15 on JAX fails on its
dot_product_attention path when key_dim != value_dim; those configurations run with
dropout=0.1 and training=False (Keras' einsum path, dropout the identity), as in
make_keras_mha_fixtures.py. On its fused path (options["keras_path"] ==
"dot_product_attention") Keras runs the softmax in float32 even in a float64 layer
(_dot_product_attention_core), so those gradients are float32-accurate (up to 1.8e-6 of a
gradient's scale from the same configuration on Keras' float64 einsum path). A rerun writes
byte-identical files.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.src import backend as kb  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from fixture_set import write_fixture_set  # noqa: E402


def config(name, desc, **kw):
    c = dict(name=name, description=desc, num_heads=2, key_dim=4, value_dim=None, use_bias=True,
             output_shape=None, attention_axes=None, q=(2, 5, 8), v=(2, 7, 8), k=None, self_attention=False,
             scores=False, causal=False, masks=(), sliding_window=None, use_gate=False)
    c.update(kw)
    return c


CONFIGS = [
    config("self", "self-attention [B, T, E] (query is value, key defaults to value)", self_attention=True),
    config("cross", "cross-attention T != S, key defaults to value"),
    config("separate_key", "key given with its own size", k=(2, 7, 6), v=(2, 7, 5)),
    config("value_dim", "value_dim != key_dim (einsum path)", value_dim=6),
    config("value_dim_key", "value_dim != key_dim, key given, scores returned", value_dim=3, k=(2, 7, 5),
           scores=True),
    config("output_shape_int", "output_shape=5", output_shape=5),
    config("output_shape_tuple", "output_shape=(3, 2)", output_shape=(3, 2)),
    config("no_bias", "use_bias=False", use_bias=False),
    config("no_bias_self_causal", "use_bias=False, self-attention, causal", use_bias=False, self_attention=True,
           causal=True),
    config("scores", "return_attention_scores (einsum path)", scores=True),
    config("query_mask", "query mask (Keras mask of the query)", masks=("query",)),
    config("value_mask", "value_mask", masks=("value",)),
    config("key_mask", "key_mask with key given", masks=("key",), k=(2, 7, 8)),
    config("attention_mask", "attention_mask [B, T, S]", masks=("attention",)),
    config("attention_mask_2d", "attention_mask [T, S] (expanded at the heads axis)", masks=("attention2d",)),
    config("causal_self", "use_causal_mask, self-attention", causal=True, self_attention=True, q=(2, 6, 8)),
    config("causal_cross", "use_causal_mask with T != S", causal=True, q=(2, 5, 8), v=(2, 7, 8)),
    config("causal_masks", "causal + attention_mask + value_mask", causal=True, q=(2, 6, 8), v=(2, 6, 8),
           masks=("attention", "value")),
    config("all_masks", "query, value, key and attention masks, causal, key given", causal=True, q=(2, 6, 8),
           v=(2, 6, 8), k=(2, 6, 8), masks=("query", "value", "key", "attention")),
    config("fully_masked_rows", "query rows with every key masked, fused path (uniform softmax)",
           masks=("attention_rowmasked",)),
    config("fully_masked_rows_einsum", "query rows with every key masked, einsum path (zero rows)",
           masks=("attention_rowmasked",), scores=True),
    config("fully_masked_batch", "value_mask masking every key of one batch (fused path)",
           masks=("value_allmasked",)),
    config("axes_default_rank4", "[B, H, W, C] self-attention, default axes (1, 2)", q=(2, 3, 4, 6),
           v=(2, 3, 4, 6), self_attention=True),
    config("axes_12", "[B, H, W, C], attention_axes=(1, 2), cross", q=(2, 3, 4, 6), v=(2, 2, 5, 6),
           attention_axes=(1, 2)),
    config("axes_2_rank4", "[B, H, W, C], attention_axes=(2,)", q=(2, 3, 4, 6), v=(2, 3, 5, 6),
           attention_axes=(2,)),
    config("axes_m3_rank4", "[B, H, W, C], attention_axes=(-3,) (axis 1), key given", q=(2, 3, 4, 6),
           v=(2, 5, 4, 6), k=(2, 5, 4, 5), attention_axes=(-3,)),
    config("axes_12_mask", "attention_axes=(1, 2) with attention_mask [B, H, W, H', W'] and a fully masked row",
           q=(2, 3, 4, 6), v=(2, 2, 3, 6), attention_axes=(1, 2), masks=("attention_rowmasked",)),
    config("axes_23_rank5", "[B, D1, D2, D3, C], attention_axes=(2, 3), value_dim=3, output_shape=(2, 2)",
           q=(2, 2, 3, 2, 6), v=(2, 2, 2, 3, 6), attention_axes=(2, 3), value_dim=3, output_shape=(2, 2)),
    config("one_head", "num_heads=1", num_heads=1, key_dim=8),
    config("wide", "N=4, key_dim=8, value_dim=6, output_shape=10, masks", num_heads=4, key_dim=8, value_dim=6,
           q=(3, 9, 16), v=(3, 11, 12), output_shape=10, masks=("value", "attention")),
    # Keras 3.15's sliding_window (a constant band mask) and use_gate (a sigmoid EinsumDense on the
    # query multiplying the attention output: gate/kernel and gate/bias get gradients, and so does
    # the query through it).
    config("window_self", "sliding_window=2, self-attention (fused path)", sliding_window=2, self_attention=True,
           q=(2, 6, 8)),
    config("window_causal_scores", "sliding_window=3, causal, scores (einsum path)", sliding_window=3, causal=True,
           q=(2, 7, 8), v=(2, 7, 8), scores=True),
    config("window_masks", "sliding_window=2 with value and attention masks", sliding_window=2, q=(2, 6, 8),
           v=(2, 6, 8), masks=("value", "attention")),
    config("window_cross", "sliding_window=3, cross-attention T=5 < S=9", sliding_window=3, q=(2, 5, 8),
           v=(2, 9, 8)),
    config("window_cross_rows", "sliding_window=2, T=8 > S=4: rows with no key (fused: mean of the values)",
           sliding_window=2, q=(2, 8, 8), v=(2, 4, 8)),
    config("window_cross_rows_einsum", "sliding_window=2, T=8 > S=4, scores (einsum: zero rows)", sliding_window=2,
           q=(2, 8, 8), v=(2, 4, 8), scores=True),
    config("window_axes_1_rank4", "[B, H, W, C], attention_axes=(1,), sliding_window=2", q=(2, 5, 3, 6),
           v=(2, 6, 3, 6), attention_axes=(1,), sliding_window=2),
    config("gate_self", "use_gate, self-attention (fused path)", use_gate=True, self_attention=True),
    config("gate_no_bias", "use_gate, use_bias=False, cross-attention", use_gate=True, use_bias=False),
    config("gate_output_shape", "use_gate, value_dim=3, output_shape=(3, 2) (einsum path)", use_gate=True,
           value_dim=3, output_shape=(3, 2)),
    config("gate_key_masks", "use_gate, key given, query/value/key/attention masks, causal", use_gate=True,
           causal=True, q=(2, 6, 8), v=(2, 6, 8), k=(2, 6, 8), masks=("query", "value", "key", "attention")),
    config("gate_axes_12", "use_gate, [B, H, W, C], attention_axes=(1, 2)", use_gate=True, q=(2, 3, 4, 6),
           v=(2, 2, 5, 6), attention_axes=(1, 2)),
    config("gate_window", "use_gate, sliding_window=3, causal, value and attention masks, scores", use_gate=True,
           sliding_window=3, causal=True, q=(2, 7, 8), v=(2, 7, 8), masks=("value", "attention"), scores=True),
    config("gate_window_rows", "use_gate, sliding_window=2, T=8 > S=4 (rows with no key, fused path)",
           use_gate=True, sliding_window=2, q=(2, 8, 8), v=(2, 4, 8)),
]


def masks_for(c, rng, q, v):
    out = {}
    qs, vs = q.shape[:-1], v.shape[:-1]
    for m in c["masks"]:
        if m == "query":
            mm = rng.random(qs) < 0.8
            mm[:, 0] = True
            out["query_mask"] = mm
        elif m in ("value", "key"):
            mm = rng.random(vs) < 0.7
            mm[:, 0] = True
            out[m + "_mask"] = mm
        elif m == "value_allmasked":
            mm = rng.random(vs) < 0.7
            mm[1, 0] = True
            mm[0] = False
            out["value_mask"] = mm
        elif m in ("attention", "attention_rowmasked"):
            axes = c["attention_axes"] or tuple(range(1, len(qs)))
            mm = rng.random(qs + tuple(vs[a] for a in axes)) < 0.7
            mm[..., 0] = True
            if m == "attention_rowmasked":
                mm[0, 1] = False
                mm[1, 2] = False
            out["attention_mask"] = mm
        elif m == "attention2d":
            mm = rng.random((qs[1], vs[1])) < 0.7
            mm[:, 0] = True
            out["attention_mask"] = mm
    return out


def run(c, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(c["q"]).astype(np.float32)
    v = q if c["self_attention"] else rng.standard_normal(c["v"]).astype(np.float32)
    k = None if c["k"] is None else rng.standard_normal(c["k"]).astype(np.float32)
    einsum_for_dims = c["value_dim"] not in (None, c["key_dim"]) and not c["scores"] and len(c["q"]) == 3
    layer = keras.layers.MultiHeadAttention(
        num_heads=c["num_heads"], key_dim=c["key_dim"], value_dim=c["value_dim"], use_bias=c["use_bias"],
        output_shape=c["output_shape"], attention_axes=c["attention_axes"],
        dropout=0.1 if einsum_for_dims else 0.0, sliding_window=c["sliding_window"], use_gate=c["use_gate"],
        dtype="float64", name="mha")
    layer.build(q.shape, v.shape, None if k is None else k.shape)
    train = layer.trainable_variables  # get_weights() order, without the dropout's seed state
    weights = [(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32) for w in train]
    if c["use_bias"]:
        for i in range(1, len(weights), 2):
            weights[i] = (rng.standard_normal(weights[i].shape) * 0.5).astype(np.float32)
    masks = masks_for(c, rng, q, v)
    kwargs = {name: jax.numpy.asarray(m) for name, m in masks.items() if name != "query_mask"}

    fixed = [var.value for var in layer.non_trainable_variables]

    def forward(ws, qq, vv, kk):
        if "query_mask" in masks:
            kb.set_keras_mask(qq, jax.numpy.asarray(masks["query_mask"]))
        res, _ = layer.stateless_call(ws, fixed, qq, vv, key=kk, return_attention_scores=c["scores"],
                                      use_causal_mask=c["causal"], training=False, **kwargs)
        return res[0] if c["scores"] else res

    f64 = lambda x: None if x is None else jax.numpy.asarray(x.astype(np.float64))  # noqa: E731
    ws64 = [f64(w) for w in weights]
    out = forward(ws64, f64(q), f64(v), f64(k))
    grad_output = rng.standard_normal(out.shape).astype(np.float32)
    loss = lambda ws, qq, vv, kk: jax.numpy.sum(forward(ws, qq, vv, kk) * grad_output.astype(np.float64))  # noqa
    dws, dq, dv, dk = jax.grad(loss, argnums=(0, 1, 2, 3))(ws64, f64(q), f64(v), f64(k))
    tensors = {var.path: w for var, w in zip(train, weights)}
    tensors["input.query"] = q
    if not c["self_attention"]:
        tensors["input.value"] = v
    if k is not None:
        tensors["input.key"] = k
    for name, m in masks.items():
        tensors["input." + name] = np.ascontiguousarray(m)
    tensors["grad_output"] = grad_output
    tensors["grad.query"] = np.asarray(dq, np.float64)
    tensors["grad.value"] = np.asarray(dv, np.float64)
    if k is not None:
        tensors["grad.key"] = np.asarray(dk, np.float64)
    for var, d in zip(train, dws):
        tensors["grad." + var.path] = np.asarray(d, np.float64)
    for name, t in tensors.items():
        assert t.dtype == bool or np.isfinite(t).all(), (c["name"], name)
    options = {key: c[key] for key in ("num_heads", "key_dim", "value_dim", "use_bias", "description",
                                       "self_attention")}
    options["output_shape"] = [c["output_shape"]] if isinstance(c["output_shape"], int) else c["output_shape"]
    options["attention_axes"] = c["attention_axes"]
    options["return_attention_scores"] = c["scores"]
    options["use_causal_mask"] = c["causal"]
    if c["sliding_window"] is not None:  # only when set: the older files stay byte-identical
        options["sliding_window"] = c["sliding_window"]
    if c["use_gate"]:
        options["use_gate"] = True
    fused = not c["scores"] and len(c["q"]) == 3 and not einsum_for_dims
    options["keras_path"] = "dot_product_attention" if fused else "einsum"
    if einsum_for_dims:
        options["keras_path"] += " (dropout=0.1, training=False)"
    options["keras"] = keras.__version__
    options["backend"] = keras.backend.backend()
    options["jax"] = jax.__version__
    return tensors, {"options": json.dumps(options, sort_keys=True)}


def main():
    write_fixture_set(CONFIGS, run, 4000, "mha_keras_grad",
                      ["# Keras 3 MultiHeadAttention gradient fixtures", "",
                       f"Written by tests/nn/make_keras_mha_grad_fixtures.py with Keras {keras.__version__} on "
                       f"{keras.backend.backend()} {jax.__version__} (float64, jax.grad of "
                       "sum(output * grad_output))."], save_file)


if __name__ == "__main__":
    main()
