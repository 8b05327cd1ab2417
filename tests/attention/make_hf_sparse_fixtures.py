"""Hugging Face transformers' own sparse attention layers as fixtures for qkv's AttentionMods (issue 16
item 5): LongformerSelfAttention (sliding window + global tokens) and BigBirdBlockSparseAttention
(window + global + random blocks), float32, on the CPU, with small fixed weights.

Each OUT_DIR/<name>.safetensors holds
  hidden [B, L, E] (the layer's input), padding [B, L] (int32, 1 = a real token, 0 = padding),
  the projections' weights as nn.Linear keeps them (<name>.weight [E, E], <name>.bias [E]),
  out [B, L, E] (the layer's first output),
  Longformer: global [B, L] (int32, 1 = a token with global attention);
  BigBird: rand_attn [H, L / block - 2, num_random_blocks] (int64), the random key blocks the
    layer gathered for query blocks 1 .. L / block - 2, recorded from the call itself,
and one metadata key "options" (JSON: layer, num_heads, attention_window or block_size,
num_random_blocks, training, seed).

Longformer: the layer is called as LongformerModel calls it (attention_mask -10000 padding / 0
local / +10000 global, is_index_masked, is_index_global_attn), eval, attention dropout 0.
BigBird: the masks come from BigBirdModel.create_masks_for_block_sparse_attn. In eval, transformers
5.24 draws no random blocks at all (its helpers return zeros: every "random" block is key block 0,
gathered num_random_blocks more times); "bigbird_train" calls the same layer in training mode
(it has no dropout) with seed 0, where numpy draws the layout, and records it.
A rerun with the same torch / transformers writes the same bytes.
Run: .venv-fixtures/bin/python tests/attention/make_hf_sparse_fixtures.py tests/fixtures/hf_sparse
"""
import json
import os
import sys
import warnings

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel
from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

warnings.filterwarnings("ignore")
E, H = 16, 2


def set_weights(layer, names, gen):
    """Every named nn.Linear gets weights ~ N(0, 0.3) and biases ~ N(0, 0.1) from `gen`."""
    tensors = {}
    with torch.no_grad():
        for name in names:
            lin = getattr(layer, name)
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * 0.3)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.1)
            tensors[f"{name}.weight"] = lin.weight.detach().clone()
            tensors[f"{name}.bias"] = lin.bias.detach().clone()
    return tensors


def padding_of(lengths, length):
    return torch.tensor([[1 if t < n else 0 for t in range(length)] for n in lengths], dtype=torch.int32)


def longformer(name, length, window, lengths, globals_, seed):
    """LongformerSelfAttention with attention_window `window` (one-sided window // 2), batch entries
    of `lengths` real tokens (the rest padding) and per-entry global positions."""
    gen = torch.Generator().manual_seed(seed)
    config = transformers.LongformerConfig(hidden_size=E, num_attention_heads=H, attention_window=[window],
                                           attention_probs_dropout_prob=0.0)
    layer = LongformerSelfAttention(config, layer_id=0).eval()
    tensors = set_weights(layer, ["query", "key", "value", "query_global", "key_global", "value_global"], gen)
    b = len(lengths)
    hidden = torch.randn(b, length, E, generator=gen)
    padding = padding_of(lengths, length)
    glob = torch.zeros(b, length, dtype=torch.int32)
    for e, g in enumerate(globals_):
        glob[e, g] = 1
    # LongformerModel's form: -10000 padding, 0 local, +10000 global.
    mask = (glob.float() * 10000.0) - (1 - padding).float() * 10000.0
    with torch.no_grad():
        out = layer(hidden, attention_mask=mask, is_index_masked=mask < 0, is_index_global_attn=mask > 0,
                    is_global_attn=bool((mask > 0).any()))[0]
    tensors.update(hidden=hidden, padding=padding, out=out, **{"global": glob})
    options = {"layer": "LongformerSelfAttention", "num_heads": H, "attention_window": window}
    return name, tensors, options


def bigbird(name, length, block, random_blocks, lengths, training, seed):
    """BigBirdBlockSparseAttention (use_bias), blocks of `block`, `random_blocks` random key blocks;
    in training mode with numpy seeded by the layer's `seed`."""
    gen = torch.Generator().manual_seed(seed + 100)
    config = transformers.BigBirdConfig(hidden_size=E, num_attention_heads=H, block_size=block,
                                        num_random_blocks=random_blocks, attention_type="block_sparse",
                                        max_position_embeddings=max(length, 64), use_bias=True)
    layer = BigBirdBlockSparseAttention(config, seed=seed).train(training)
    tensors = set_weights(layer, ["query", "key", "value"], gen)
    recorded = []
    draw = layer._bigbird_block_rand_mask_with_head  # record the layout the call itself uses

    def recording(*args, **kwargs):
        rand_attn = draw(*args, **kwargs)
        recorded.append(np.stack(rand_attn, axis=0))
        return rand_attn

    layer._bigbird_block_rand_mask_with_head = recording
    b = len(lengths)
    hidden = torch.randn(b, length, E, generator=gen)
    padding = padding_of(lengths, length)
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(padding.float(), block)
    with torch.no_grad():
        out = layer(hidden, band_mask=band, from_mask=from_mask, to_mask=to_mask, from_blocked_mask=blocked,
                    to_blocked_mask=blocked)[0]
    assert len(recorded) == 1, "the layer drew its random blocks elsewhere (an old plan length?)"
    tensors.update(hidden=hidden, padding=padding, out=out, rand_attn=torch.from_numpy(recorded[0]).long())
    options = {"layer": "BigBirdBlockSparseAttention", "num_heads": H, "block_size": block,
               "num_random_blocks": random_blocks, "training": training, "seed": seed}
    return name, tensors, options


def configs():
    return [
        longformer("longformer", 32, 8, [32, 27], [[0, 13], [3]], seed=1),
        longformer("longformer_wide", 48, 12, [48], [[0, 1, 47]], seed=2),
        longformer("longformer_no_global", 24, 4, [24, 20], [[], []], seed=3),
        bigbird("bigbird_eval", 64, 4, 2, [64, 53], training=False, seed=0),
        bigbird("bigbird_train", 64, 4, 2, [64, 53], training=True, seed=0),
        bigbird("bigbird_train_r3", 96, 8, 3, [96], training=True, seed=7),
    ]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name, tensors, options in configs():
        tensors = {n: t.contiguous() for n, t in tensors.items()}
        save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"),
                  metadata={"options": json.dumps(options, sort_keys=True)})
        print(name, tuple(tensors["out"].shape))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf_sparse"))
