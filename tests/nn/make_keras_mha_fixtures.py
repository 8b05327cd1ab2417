#!/usr/bin/env python3
"""Writes the Keras 3 fixtures for qkv::nn::KerasMultiHeadAttention.

Usage: KERAS_BACKEND=jax make_keras_mha_fixtures.py OUTPUT_DIR [AXES_DIR]    (`make fixtures`)

Every configuration becomes OUTPUT_DIR/<name>.safetensors holding
  mha/query/kernel, mha/query/bias, ..., mha/attention_output/bias
                    the layer's variables under their Keras 3 paths, float32
  input.query, input.value, input.key (optional)          float32
  input.query_mask, input.value_mask, input.key_mask, input.attention_mask  (optional)
  expected.output   keras.layers.MultiHeadAttention run in float64 (dtype="float64",
                    jax_enable_x64) on the float64 upcast of the stored float32 numbers
  expected.scores   (when return_attention_scores) the returned attention scores
and `__metadata__["options"]`: JSON with the layer arguments (num_heads, key_dim,
value_dim, use_bias, output_shape, attention_axes; sliding_window and use_gate only when
set), the call flags
(return_attention_scores, use_causal_mask), which Keras code path ran, the Keras,
backend and JAX versions and a description.

The query mask is attached to the query tensor (backend.set_keras_mask): Keras 3 reads
it from there and ignores the query_mask argument. Keras 3.15 on JAX fails on its
dot_product_attention path when key_dim != value_dim; those configurations without
scores run with dropout=0.1 and training=False, which takes Keras' explicit einsum path
(dropout is the identity in inference).

AXES_DIR (default OUTPUT_DIR/../mha_keras_axes) gets the attention_axes set: every
spelling Keras accepts of the token axes of rank-3, -4 and -5 inputs (each positive axis,
each negative one, and pairs), with scores, the value's attended axes longer than the
query's; and keras_axes_errors.json: for every other single axis in [-2R-1, R+1] and
for duplicates, what Keras 3 does with it on its einsum path (the error it raises, or
"accepts" with the axes it attends over).
"""

from __future__ import annotations

import json
import os
import re
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
             scores=False, causal=False, masks=(), const=None, sliding_window=None, use_gate=False)
    c.update(kw)
    return c


SEED001_X = [[[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [2, 2, 6]]]
CONFIGS = [
    config("self", "self-attention [B, T, E]", self_attention=True, q=(2, 5, 8)),
    config("cross", "cross-attention T != S, key defaults to value"),
    config("separate_key", "key given with its own size", k=(2, 7, 6), v=(2, 7, 5)),
    config("value_dim_scores", "value_dim != key_dim, scores returned", value_dim=3, scores=True),
    config("value_dim", "value_dim != key_dim (explicit path)", value_dim=6),
    config("output_shape_int", "output_shape=5", output_shape=5),
    config("output_shape_tuple", "output_shape=(3, 2)", output_shape=(3, 2), scores=True),
    config("no_bias", "use_bias=False", use_bias=False),
    config("scores", "return_attention_scores", scores=True),
    config("query_mask", "query mask (Keras mask of the query)", masks=("query",), scores=True),
    config("value_mask", "value_mask", masks=("value",)),
    config("key_mask", "key_mask", masks=("key",), k=(2, 7, 8), scores=True),
    config("attention_mask", "attention_mask [B, T, S]", masks=("attention",)),
    config("attention_mask_2d", "attention_mask [T, S] (expanded at the heads axis)", masks=("attention2d",),
           scores=True),
    config("attention_mask_float", "attention_mask of 0./1. floats", masks=("attention_float",), scores=True),
    config("causal_self", "use_causal_mask, self-attention", causal=True, self_attention=True, q=(2, 6, 8)),
    config("causal_cross", "use_causal_mask with T != S, scores", causal=True, q=(2, 5, 8), v=(2, 7, 8),
           scores=True),
    config("causal_masks", "causal + attention_mask + value_mask", causal=True, q=(2, 6, 8), v=(2, 6, 8),
           masks=("attention", "value")),
    config("all_masks_scores", "query, value, key and attention masks, causal, scores", causal=True,
           q=(2, 6, 8), v=(2, 6, 8), k=(2, 6, 8), masks=("query", "value", "key", "attention"), scores=True),
    config("fully_masked_rows", "a query row with every key masked (uniform softmax)",
           masks=("attention_rowmasked",), scores=True),
    config("fully_masked_batch", "value_mask masking every key of one batch", masks=("value_allmasked",)),
    config("axes_1", "attention_axes=(1,) given explicitly", attention_axes=(1,)),
    config("axes_default_rank4", "[B, H, W, C], default axes (1, 2): 2-D attention", q=(2, 3, 4, 6),
           v=(2, 3, 4, 6), self_attention=True),
    config("axes_12_scores", "[B, H, W, C], attention_axes=(1, 2), scores", q=(2, 3, 4, 6), v=(2, 2, 5, 6),
           attention_axes=(1, 2), scores=True),
    config("axes_2_rank4", "[B, H, W, C], attention_axes=(2,)", q=(2, 3, 4, 6), v=(2, 3, 5, 6),
           attention_axes=(2,)),
    config("axes_1_rank4", "[B, H, W, C], attention_axes=(1,), scores", q=(2, 3, 4, 6), v=(2, 5, 4, 6),
           attention_axes=(1,), scores=True),
    config("axes_12_mask", "attention_axes=(1, 2) with attention_mask [B, H, W, H', W']", q=(2, 3, 4, 6),
           v=(2, 2, 3, 6), attention_axes=(1, 2), masks=("attention",), scores=True),
    config("axes_2_mask", "attention_axes=(2,) with attention_mask [B, H, W, W']", q=(2, 3, 4, 6),
           v=(2, 3, 5, 6), attention_axes=(2,), masks=("attention",), scores=True),
    config("axes_23_rank5", "[B, D1, D2, D3, C], attention_axes=(2, 3)", q=(2, 2, 3, 2, 6), v=(2, 2, 2, 3, 6),
           attention_axes=(2, 3), value_dim=3, scores=True),
    config("one_head", "num_heads=1", num_heads=1, key_dim=8),
    config("wide", "N=4, key_dim=8, value_dim=6, output_shape=10, masks", num_heads=4, key_dim=8, value_dim=6,
           q=(3, 9, 16), v=(3, 11, 12), output_shape=10, masks=("value", "attention"), scores=True),
] + [
    config(f"seed001_const_{c:g}".replace(".", "p"), f"seed 001: MultiHeadAttention(2, 4) on [2, 2, 3], constant "
           f"input {c:g}", q=(2, 2, 3), self_attention=True, const=c)
    for c in (0.1, 1.0, 10.0, 100.0, 1000.0)
] + [config("seed001_toy", "seed 001: the toy batch [[[1,2,3],[4,5,6]],[[1,1,1],[2,2,6]]]", q=(2, 2, 3),
            self_attention=True, const="toy", scores=True)] + [
    # Keras 3.15's sliding_window (a band |row - col| < w over axis 1, AND-ed with every mask) and
    # use_gate (a sigmoid EinsumDense "gate" on the query multiplying the attention output).
    config("window_self", "sliding_window=2, self-attention (fused path)", sliding_window=2, self_attention=True,
           q=(2, 7, 8)),
    config("window_self_scores", "sliding_window=3, self-attention, scores", sliding_window=3, self_attention=True,
           q=(2, 7, 8), scores=True),
    config("window_1", "sliding_window=1 (the diagonal only), scores", sliding_window=1, self_attention=True,
           q=(2, 5, 8), scores=True),
    config("window_causal", "sliding_window=3 with use_causal_mask, self-attention", sliding_window=3, causal=True,
           self_attention=True, q=(2, 8, 8)),
    config("window_causal_scores", "sliding_window=2 with use_causal_mask, scores", sliding_window=2, causal=True,
           q=(2, 6, 8), v=(2, 6, 8), scores=True),
    config("window_masks", "sliding_window=3 with query, value and attention masks, scores", sliding_window=3,
           q=(2, 6, 8), v=(2, 6, 8), masks=("query", "value", "attention"), scores=True),
    config("window_masks_fused", "sliding_window=2 with value and attention masks", sliding_window=2, q=(2, 6, 8),
           v=(2, 6, 8), masks=("value", "attention")),
    config("window_cross", "sliding_window=3, cross-attention T=5 < S=9", sliding_window=3, q=(2, 5, 8),
           v=(2, 9, 8)),
    config("window_cross_rows", "sliding_window=2, T=9 > S=4: rows 5.. have no key (fused: mean of the values)",
           sliding_window=2, q=(2, 9, 8), v=(2, 4, 8)),
    config("window_cross_rows_scores", "sliding_window=2, T=9 > S=4, scores (einsum: zero rows)", sliding_window=2,
           q=(2, 9, 8), v=(2, 4, 8), scores=True),
    config("window_axes_1_rank4", "[B, H, W, C], attention_axes=(1,), sliding_window=2, scores", q=(2, 5, 3, 6),
           v=(2, 6, 3, 6), attention_axes=(1,), sliding_window=2, scores=True),
    config("gate_self", "use_gate, self-attention", use_gate=True, self_attention=True),
    config("gate_cross_scores", "use_gate, cross-attention, scores", use_gate=True, scores=True),
    config("gate_no_bias", "use_gate, use_bias=False", use_gate=True, use_bias=False),
    config("gate_output_shape", "use_gate, value_dim=3, output_shape=(3, 2)", use_gate=True, value_dim=3,
           output_shape=(3, 2)),
    config("gate_value_dim_key", "use_gate, value_dim=6, key given, value and key masks, scores", use_gate=True,
           value_dim=6, k=(2, 7, 5), masks=("value", "key"), scores=True),
    config("gate_axes_12", "use_gate, [B, H, W, C], attention_axes=(1, 2), scores", use_gate=True, q=(2, 3, 4, 6),
           v=(2, 2, 5, 6), attention_axes=(1, 2), scores=True),
    config("gate_window", "use_gate, sliding_window=3, causal, value and attention masks, scores", use_gate=True,
           sliding_window=3, causal=True, q=(2, 7, 8), v=(2, 7, 8), masks=("value", "attention"), scores=True),
    config("gate_window_fused", "use_gate, sliding_window=2, cross-attention T=6 < S=8", use_gate=True,
           sliding_window=2, q=(2, 6, 8), v=(2, 8, 8)),
    config("gate_window_no_bias_rows", "use_gate, use_bias=False, sliding_window=2, T=8 > S=4 (rows with no key)",
           use_gate=True, use_bias=False, sliding_window=2, q=(2, 8, 8), v=(2, 4, 8)),
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
            mm[0] = False
            out["value_mask"] = mm
        elif m in ("attention", "attention_rowmasked", "attention_float"):
            axes = c["attention_axes"] or tuple(range(1, len(qs)))
            mm = rng.random(qs + tuple(vs[a] for a in axes)) < 0.7
            mm[..., 0] = True
            if m == "attention_rowmasked":
                mm[0, 1, :] = False
                mm[1, 3, :] = False
            out["attention_mask"] = mm.astype(np.float32) if m == "attention_float" else mm
        elif m == "attention2d":
            mm = rng.random((qs[1], vs[1])) < 0.7
            mm[:, 0] = True
            out["attention_mask"] = mm
    return out


def make_inputs(c, rng):
    if c["const"] == "toy":
        q = np.array(SEED001_X, np.float32)
    elif c["const"] is not None:
        q = np.full(c["q"], c["const"], np.float32)
    else:
        q = rng.standard_normal(c["q"]).astype(np.float32)
    v = q if c["self_attention"] else rng.standard_normal(c["v"]).astype(np.float32)
    k = None if c["k"] is None else rng.standard_normal(c["k"]).astype(np.float32)
    return q, v, k


def run(c, seed):
    rng = np.random.default_rng(seed)
    q, v, k = make_inputs(c, rng)
    explicit = c["value_dim"] not in (None, c["key_dim"]) and not c["scores"]
    layer = keras.layers.MultiHeadAttention(
        num_heads=c["num_heads"], key_dim=c["key_dim"], value_dim=c["value_dim"], use_bias=c["use_bias"],
        output_shape=c["output_shape"], attention_axes=c["attention_axes"], dropout=0.1 if explicit else 0.0,
        sliding_window=c["sliding_window"], use_gate=c["use_gate"], dtype="float64", name="mha")
    layer.build(q.shape, v.shape, None if k is None else k.shape)
    weights = [(rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32) for w in layer.get_weights()]
    if c["use_bias"]:
        for i in range(1, len(weights), 2):
            weights[i] = (rng.standard_normal(weights[i].shape) * 0.5).astype(np.float32)
    layer.set_weights([w.astype(np.float64) for w in weights])
    masks = masks_for(c, rng, q, v)
    q64 = jax.numpy.asarray(q.astype(np.float64))
    if "query_mask" in masks:
        kb.set_keras_mask(q64, jax.numpy.asarray(masks["query_mask"]))
    kwargs = {k2: jax.numpy.asarray(m) for k2, m in masks.items() if k2 != "query_mask"}
    res = layer(q64, jax.numpy.asarray(v.astype(np.float64)), key=None if k is None else k.astype(np.float64),
                return_attention_scores=c["scores"], use_causal_mask=c["causal"], training=False, **kwargs)
    out, scores = res if c["scores"] else (res, None)
    tensors = {var.path: w for var, w in zip(layer.weights, weights)}
    tensors["input.query"] = q
    if not c["self_attention"]:
        tensors["input.value"] = v
    if k is not None:
        tensors["input.key"] = k
    for name, m in masks.items():
        tensors["input." + name] = np.ascontiguousarray(m)
    tensors["expected.output"] = np.asarray(out, np.float64)
    if scores is not None:
        tensors["expected.scores"] = np.asarray(scores, np.float64)
    assert np.isfinite(tensors["expected.output"]).all(), c["name"]
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
    options["keras_path"] = "einsum (dropout=0.1, training=False)" if explicit else "default"
    options["keras"] = keras.__version__
    options["backend"] = keras.backend.backend()
    options["jax"] = jax.__version__
    return tensors, {"options": json.dumps(options, sort_keys=True)}


def axes_configs():
    """The token axes 1..R-2 of a rank-R input named every way in [-R, R): each axis as a
    positive and as a negative number (Keras reads a < 0 as R + a), and lists mixing both."""
    out = []
    for rank in (3, 4, 5):
        q = (2,) + (2, 3, 2)[:rank - 2] + (4,)
        token = list(range(1, rank - 1))
        spellings = [(a,) for a in token] + [(a - rank,) for a in token]
        spellings += {3: [], 4: [(1, -2), (-3, 2), (-2, -3)], 5: [(1, -2), (-4, 2), (-2, -3), (3, -4, 2)]}[rank]
        for axes in spellings:
            real = [a if a >= 0 else rank + a for a in axes]
            v = list(q)
            for a in real:
                v[a] += 1  # the value's attended axes differ from the query's: a wrong axis cannot pass
            name = f"r{rank}_" + "_".join(("m" if a < 0 else "p") + str(abs(a)) for a in axes)
            out.append(config(name, f"rank {rank}, attention_axes={axes} (axes {tuple(real)})", q=q,
                              v=tuple(v), attention_axes=axes, scores=True, key_dim=2))
    return out


def keras_axis_behaviour(rank, axes):
    """What Keras 3 does with attention_axes=axes on rank-R inputs (einsum path: scores returned)."""
    q = np.ones((2,) + (3,) * (rank - 2) + (4,))
    layer = keras.layers.MultiHeadAttention(2, 2, attention_axes=axes, dtype="float64")
    try:
        _, scores = layer(q, q, return_attention_scores=True)
    except Exception as e:  # noqa: BLE001 -- the error Keras raises is what is recorded
        lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()]
        why = lines[1] if len(lines) > 1 and lines[0].startswith("Exception encountered") else lines[0]
        return {"keras": "error", "error": type(e).__name__, "message": why.strip()[:200]}
    return {"keras": "accepts", "attends_over": list(layer._attention_axes), "scores_shape": list(scores.shape)}


def write_axes_errors(out_dir):
    cases = []
    for rank in (3, 4, 5):
        token = set(range(1, rank - 1))
        singles = [(a,) for a in range(-2 * rank - 1, rank + 2) if (a if a >= 0 else rank + a) not in token]
        dups = [(1, 1), (1, 1 - rank)] + ([(rank - 2, -2)] if rank >= 4 else [])
        for axes in singles + dups:
            cases.append({"rank": rank, "attention_axes": list(axes), **keras_axis_behaviour(rank, axes)})
    with open(os.path.join(out_dir, "keras_axes_errors.json"), "w") as f:
        json.dump({"keras": keras.__version__, "backend": keras.backend.backend(), "cases": cases}, f, indent=1)
        f.write("\n")


def write_gate_weights_file(out_dir, first_seed):
    """OUTPUT_DIR/gate_window.weights.h5: Keras' own weight file (model.save_weights of a Functional
    model around the layer) of the gate_window configuration's layer, with its gate sublayer (saved
    as layers/multi_head_attention/_gate_dense/vars/0): qkv loads it into a layer with use_gate and
    gets gate_window.safetensors' expected output. A rerun writes a byte-identical file."""
    i = next(i for i, c in enumerate(CONFIGS) if c["name"] == "gate_window")
    c = CONFIGS[i]
    tensors, _ = run(c, first_seed + i)
    keras.backend.clear_session()  # the sublayers' auto names (dropout_<n>) no longer depend on what ran before
    layer = keras.layers.MultiHeadAttention(c["num_heads"], c["key_dim"], use_gate=True,
                                            sliding_window=c["sliding_window"], name="mha")
    inp, val = keras.Input(c["q"][1:]), keras.Input(c["v"][1:])
    model = keras.Model([inp, val], layer(inp, val))
    layer.set_weights([tensors[var.path] for var in layer.weights])
    model.save_weights(os.path.join(out_dir, "gate_window.weights.h5"))


def main():
    main_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                                  "mha_keras")
    axes_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(main_dir)),
                                                                  "mha_keras_axes")
    write_fixture_set(axes_configs(), run, 3000, "mha_keras_axes",
                      ["# Keras 3 MultiHeadAttention attention_axes fixtures", "",
                       f"Written by tests/nn/make_keras_mha_fixtures.py with Keras {keras.__version__} on "
                       f"{keras.backend.backend()} {jax.__version__} (float64). keras_axes_errors.json: what "
                       "Keras does with the other axes."], save_file, out_dir=axes_dir)
    write_axes_errors(axes_dir)
    write_fixture_set(CONFIGS, run, 2000, "mha_keras",
                      ["# Keras 3 MultiHeadAttention fixtures", "",
                       f"Written by tests/nn/make_keras_mha_fixtures.py with Keras {keras.__version__} on "
                       f"{keras.backend.backend()} {jax.__version__} (float64). gate_window.weights.h5: "
                       "Keras' weight file of gate_window's layer."], save_file)
    write_gate_weights_file(main_dir, 2000)


if __name__ == "__main__":
    main()
