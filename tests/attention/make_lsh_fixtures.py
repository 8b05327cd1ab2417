"""Hugging Face transformers' Reformer LSHSelfAttention fixtures for qkv's lsh_attention (issue 16
item 4): a small ReformerConfig layer (eval mode, dropout 0) with fixed random weights, run on
random hidden states; torch.randn is wrapped while the layer hashes so that the random rotations
it draws are recorded.

Each OUT_DIR/<name>.safetensors holds hidden [B, L, hidden], the layer's weights w_qk and w_v
[H * D, hidden], the rotations [H, D, n_hashes, sum(n_buckets) / 2], the projected shared
query-key qk and values v [B, H, L, D] (as the layer splits them), its output out [B, L, H * D],
its buckets [B, H, n_hashes, L] (with Reformer's round offsets; absent when L <= chunk_length,
where the layer does not hash) and attention_mask [B, L] when there is one, with one metadata key
"options": the JSON of the config (n_hashes, n_buckets, chunk_length, num_chunks_before/after,
is_decoder, dtype). tests/attention/lsh_attention_test.cc runs qkv on them.
A rerun with the same torch and transformers writes the same bytes.
Run: .venv-fixtures/bin/python tests/attention/make_lsh_fixtures.py tests/fixtures/lsh
"""
import json
import os
import sys
import warnings

import torch
from safetensors.torch import save_file
from transformers import ReformerConfig
from transformers.models.reformer.modeling_reformer import LSHSelfAttention

warnings.filterwarnings("ignore")
B, H, D, HIDDEN = 2, 2, 8, 16


def configs():
    """(name, L, dtype, padding per batch row, ReformerConfig fields)."""
    base = dict(lsh_attn_chunk_length=8, num_hashes=1, num_buckets=4, lsh_num_chunks_before=1,
                lsh_num_chunks_after=0, is_decoder=False)
    return [
        ("hashes1", 32, torch.float32, None, dict(base)),
        ("hashes2", 32, torch.float32, None, dict(base, num_hashes=2)),
        ("hashes2_f64", 48, torch.float64, None, dict(base, num_hashes=2)),
        ("causal_hashes2", 32, torch.float32, None, dict(base, num_hashes=2, is_decoder=True)),
        ("mask_hashes2", 32, torch.float32, [0, 5], dict(base, num_hashes=2)),
        ("factors_hashes3", 48, torch.float64, None, dict(base, num_hashes=3, num_buckets=[2, 4])),
        ("before_after", 40, torch.float32, None, dict(base, num_hashes=2, lsh_num_chunks_after=1)),
        ("causal_mask_hashes4", 64, torch.float64, [3, 0],
         dict(base, lsh_attn_chunk_length=16, num_buckets=8, num_hashes=4, is_decoder=True)),
        ("standard_causal", 8, torch.float32, [0, 2], dict(base, is_decoder=True)),
    ]


class RecordRandn:
    """Wraps torch.randn while the layer runs and keeps what it drew (the rotations)."""

    def __init__(self):
        self.drawn, self.real = [], torch.randn

    def __enter__(self):
        def randn(*args, **kwargs):
            out = self.real(*args, **kwargs)
            self.drawn.append(out.detach().clone())
            return out
        torch.randn = randn
        return self

    def __exit__(self, *exc):
        torch.randn = self.real


def run(name, length, dtype, padding, fields):
    config = ReformerConfig(hidden_size=HIDDEN, num_attention_heads=H, attention_head_size=D, attn_layers=["lsh"],
                            lsh_attention_probs_dropout_prob=0.0, hash_seed=None, max_position_embeddings=256,
                            **fields)
    layer = LSHSelfAttention(config).to(dtype).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, dtype=dtype) / HIDDEN ** 0.5)
    hidden = torch.randn(B, length, HIDDEN, dtype=dtype) * 2
    mask = None
    if padding is not None:
        mask = torch.ones(B, length, dtype=torch.long)
        for b, n in enumerate(padding):
            if n:
                mask[b, -n:] = 0
    with torch.no_grad(), RecordRandn() as rec:
        res = layer(hidden, attention_mask=mask)
    qk = layer.query_key(hidden).view(B, length, H, D).transpose(1, 2)
    v = layer.value(hidden).view(B, length, H, D).transpose(1, 2)
    half = sum(fields["num_buckets"]) // 2 if isinstance(fields["num_buckets"], list) else fields["num_buckets"] // 2
    assert len(rec.drawn) == (1 if res.buckets is not None else 0), len(rec.drawn)
    rotations = rec.drawn[0] if rec.drawn else torch.randn(H, D, fields["num_hashes"], half, dtype=dtype)
    tensors = {"hidden": hidden, "w_qk": layer.query_key.weight, "w_v": layer.value.weight, "rotations": rotations,
               "qk": qk, "v": v, "out": res.hidden_states}
    if res.buckets is not None:
        tensors["buckets"] = res.buckets
    if mask is not None:
        tensors["attention_mask"] = mask
    tensors = {n: t.detach().contiguous() for n, t in tensors.items()}
    options = {"n_hashes": fields["num_hashes"], "chunk_length": fields["lsh_attn_chunk_length"],
               "n_buckets": fields["num_buckets"] if isinstance(fields["num_buckets"], list)
               else [fields["num_buckets"]], "num_chunks_before": fields["lsh_num_chunks_before"],
               "num_chunks_after": fields["lsh_num_chunks_after"], "is_decoder": fields["is_decoder"],
               "dtype": str(dtype).replace("torch.", "")}
    return tensors, options


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    for name, length, dtype, padding, fields in configs():
        tensors, options = run(name, length, dtype, padding, fields)
        save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"),
                  metadata={"options": json.dumps(options, sort_keys=True)})
        print(name, tuple(tensors["out"].shape), {k: tuple(t.shape) for k, t in tensors.items() if k == "rotations"})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "lsh"))
