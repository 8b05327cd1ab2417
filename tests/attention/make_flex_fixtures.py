"""FlexAttention fixtures for qkv's attention modifiers (issue 16 item 5): PyTorch's
flex_attention (torch.nn.attention.flex_attention, eager, float64, CPU) with mask_mod /
score_mod functions written as FlexAttention's documentation writes them, a block mask from
create_block_mask, its output and logsumexp (FlexAttention has no backward on the CPU: the
gradients under mods are checked against dense masks instead).

Each OUT_DIR/<name>.safetensors holds q, k, v, out, lse (float64), the block mask of
create_block_mask (BLOCK_SIZE 16; int32, batch and head dims dropped: kv_num_blocks [Lq / 16] and
kv_indices [Lq / 16, Lk / 16] list each query block's partial key blocks, full_kv_num_blocks and
full_kv_indices its full ones; absent without a mask_mod) and the
tensors the qkv side needs (alibi_slopes, relative_bias, document_ids, block_pattern), with one
metadata key "qkv_mods": the JSON of the equivalent qkv.AttentionMods fields (the tensor fields
named by the tensors they read). tests/python/test_py_attention_mods.py runs qkv on them.
A rerun with the same torch writes the same bytes.
Run: .venv-fixtures/bin/python tests/attention/make_flex_fixtures.py tests/fixtures/flex
"""
import json
import os
import sys
import warnings

import torch
from safetensors.torch import save_file
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

warnings.filterwarnings("ignore")
torch.manual_seed(0)
H, D = 2, 16


def document_ids(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def configs():
    """(name, Lq, Lk, mask_mod, score_mod, qkv mods fields, extra tensors)."""
    slopes = torch.tensor([0.5, 0.125], dtype=torch.float64)
    rel = torch.randn(H, 48 + 48 - 1, dtype=torch.float64)
    docs = document_ids([20, 25, 19])
    pattern = torch.rand(8, 8) > 0.6
    out = [
        ("causal", 64, 64, lambda b, h, q, k: q >= k, None, {"window_right": 0}, {}),
        ("causal_bottom_right", 40, 64, lambda b, h, q, k: q + 24 >= k, None,
         {"window_right": 0, "align": "bottom_right"}, {}),
        ("sliding_window", 64, 64, lambda b, h, q, k: (q >= k) & (q - k < 16), None,
         {"window_left": 15, "window_right": 0}, {}),
        ("prefix_lm", 64, 64, lambda b, h, q, k: (q >= k) | (k < 10), None, {"window_right": 0, "prefix": 10}, {}),
        ("document_causal", 64, 64, lambda b, h, q, k: (docs[q] == docs[k]) & (q >= k), None,
         {"window_right": 0, "document_ids": "document_ids"}, {"document_ids": docs}),
        ("longformer", 64, 64,
         lambda b, h, q, k: ((q - k).abs() <= 4) | (q == 0) | (k == 0) | (q == 30) | (k == 30), None,
         {"window_left": 4, "window_right": 4, "global_tokens": [0, 30]}, {}),
        ("dilated", 64, 64, lambda b, h, q, k: (q >= k) & (q - k <= 24) & ((q - k) % 4 == 0), None,
         {"window_left": 24, "window_right": 0, "dilation": 4}, {}),
        ("block_pattern", 64, 64, lambda b, h, q, k: pattern[q // 8, k // 8] | (q // 8 == k // 8), None,
         {"block_size": 8, "window_left": 0, "window_right": 0, "block_pattern": "block_pattern"},
         {"block_pattern": pattern}),
        ("alibi", 64, 64, lambda b, h, q, k: q >= k, lambda s, b, h, q, k: s + slopes[h] * (k - q),
         {"window_right": 0, "alibi_slopes": "alibi_slopes"}, {"alibi_slopes": slopes}),
        ("relative_bias", 48, 48, None, lambda s, b, h, q, k: s + rel[h, k - q + 47],
         {"relative_bias": "relative_bias"}, {"relative_bias": rel}),
        ("softcap_window", 64, 64, lambda b, h, q, k: (q - k).abs() <= 8, lambda s, b, h, q, k: 2.0 * torch.tanh(s / 2.0),
         {"window_left": 8, "window_right": 8, "softcap": 2.0}, {}),
    ]
    return out


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, lq, lk, mask_mod, score_mod, fields, extra in configs():
        q = torch.randn(1, H, lq, D, dtype=torch.float64) * 2
        k = torch.randn(1, H, lk, D, dtype=torch.float64)
        v = torch.randn(1, H, lk, D // 2, dtype=torch.float64)
        block_mask = create_block_mask(mask_mod, None, None, lq, lk, device="cpu", BLOCK_SIZE=16) if mask_mod else None
        out, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)
        tensors = {"q": q, "k": k, "v": v, "out": out, "lse": lse}
        if block_mask is not None:  # create_block_mask's 16 x 16 blocks: partial ones, then full ones
            tensors.update(kv_num_blocks=block_mask.kv_num_blocks[0, 0], kv_indices=block_mask.kv_indices[0, 0],
                           full_kv_num_blocks=block_mask.full_kv_num_blocks[0, 0],
                           full_kv_indices=block_mask.full_kv_indices[0, 0])
        tensors = {n: t.contiguous() for n, t in tensors.items()}
        tensors.update({n: t.contiguous() for n, t in extra.items()})
        save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"),
                  metadata={"qkv_mods": json.dumps(fields, sort_keys=True)})
        print(name, tuple(out.shape))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "flex"))
