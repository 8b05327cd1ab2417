"""qkv.attention: the attention family of seed 002 as functions (docs/attention-variants.md).

  scaled_dot_product(q, k, v, ...)        qkv.scaled_dot_product_attention (torch's arguments, mods=)
  window(q, k, v, left, right=0, ...)     a sliding window around the diagonal (right=0: causal)
  longformer(q, k, v, left, right, global_tokens, ...)
  prefix_lm(q, k, v, prefix, ...)         causal, plus the first `prefix` keys for every query
  bigbird(q, k, v, block, window_blocks=1, random=2, seed=0, ...)
  linear(q, k, v, is_causal=False, feature_map="elu", ...)   O(L) linear attention / Performer FAVOR+
  favor_random_features(d, m, seed=0)     the W [m, d] that linear(feature_map="favor", ...) draws
  additive(q, k, v, scale=None, value_mask=None, use_causal_mask=False)   Bahdanau, Keras' semantics
  dot_product(q, k, v, scale=1.0, ...)    Luong's (unscaled) dot-product attention
  lsh(qk, v, n_hashes=1, n_buckets=None, chunk_length=64, ...)   Reformer's LSH attention (shared QK)
  lsh_buckets(qk, ...)                    the buckets lsh hashes each position into, per round
The windowed ones take scaled_dot_product_attention's keywords (is_causal excepted: it is their
window's right side), softcap= and alibi_slopes= among the modifiers (qkv.AttentionMods).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ._qkv import additive_attention as additive  # noqa: F401
from ._qkv import favor_random_features  # noqa: F401
from ._qkv import linear_attention as linear  # noqa: F401
from ._qkv import lsh_attention as lsh  # noqa: F401
from ._qkv import lsh_buckets  # noqa: F401
from ._qkv import scaled_dot_product_attention as scaled_dot_product
from .mods import AttentionMods

__all__ = ["scaled_dot_product", "window", "longformer", "prefix_lm", "bigbird", "linear", "additive",
           "dot_product", "lsh", "lsh_buckets", "favor_random_features"]

_MOD_KEYWORDS = ("softcap", "alibi_slopes", "relative_bias", "document_ids", "key_document_ids", "masked_fill")


def _with_mods(q: Any, k: Any, v: Any, mods: AttentionMods, kwargs: dict) -> Any:
    extra = {name: kwargs.pop(name) for name in _MOD_KEYWORDS if name in kwargs}
    return scaled_dot_product(q, k, v, mods=replace(mods, **extra), **kwargs)


def window(q: Any, k: Any, v: Any, left: int, right: int = 0, align: str = "top_left", **kwargs: Any) -> Any:
    """Keys j with d(i) - left <= j <= d(i) + right (d(i) = i, or i + Lk - Lq with align="bottom_right")."""
    return _with_mods(q, k, v, AttentionMods.sliding_window(left, right, align), kwargs)


def longformer(q: Any, k: Any, v: Any, left: int, right: int, global_tokens: Sequence[int], **kwargs: Any) -> Any:
    """A window plus global tokens (they attend to and are attended by every position)."""
    return _with_mods(q, k, v, AttentionMods.longformer(left, right, global_tokens), kwargs)


def prefix_lm(q: Any, k: Any, v: Any, prefix: int, **kwargs: Any) -> Any:
    return _with_mods(q, k, v, AttentionMods.prefix_lm(prefix), kwargs)


def bigbird(q: Any, k: Any, v: Any, block: int, window_blocks: int = 1, random: int = 2, seed: int = 0,
            **kwargs: Any) -> Any:
    """Blocks of `block`: ±window_blocks, the first and last block global, `random` seeded random blocks."""
    length = int(getattr(k, "shape")[-2])
    return _with_mods(q, k, v, AttentionMods.bigbird(block, window_blocks, random, seed, length), kwargs)


def dot_product(q: Any, k: Any, v: Any, scale: float = 1.0, **kwargs: Any) -> Any:
    """Luong's dot-product attention: softmax(scale q k^T) v, scale 1 (unscaled) by default; Keras'
    Attention(score_mode="dot", use_scale=True) is this with its learned scale."""
    return scaled_dot_product(q, k, v, scale=scale, **kwargs)
