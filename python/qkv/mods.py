"""qkv.AttentionMods: mask and score modifiers of scaled_dot_product_attention (FlexAttention's
idea on the CPU; C++ qkv/attention_mods.h has the definitions, docs/attention-variants.md the
pictures). Pass one as `mods=` to qkv.scaled_dot_product_attention, attention_reference and
scaled_dot_product_attention_backward.

Which keys query i may see (i < Lq, j < Lk; b the batch index, h the head):
  allowed = D(i, j) and (W(i, j) or P(j) or G(i, j) or R(i, j)), over the OR terms that are set
  d(i) = i (align="top_left") or i + Lk - Lq ("bottom_right"), the diagonal key
  W: with u = block_size, delta = j // u - d(i) // u: -window_left <= delta <= window_right and
     delta % dilation == 0 (a missing side is unbounded; window_right=0 is causal)
  P: j < prefix (prefix-LM);  G: i or j in global_tokens (Longformer)
  R: block_pattern[i // u, j // u] (bool [ceil(Lq/u), ceil(Lk/u)]; or [Hq, ceil(Lq/u), ceil(Lk/u)]
     per head, block_pattern[h, i // u, j // u]) or one of random_blocks key blocks drawn for
     query block i // u from random_seed (BigBird)
  D: document_ids[i] == key_document_ids[j] (key ids default to the query ids when Lq == Lk)
Keys not allowed score -inf, or masked_fill (finite: a row with no allowed key gets uniform
weights, as seed 002's masked_fill(mask == 0, -1e9)). Scores: s = scale q.k, then
softcap * tanh(s / softcap), + alibi_slopes[h] * (j - d(i)), + relative_bias[h or 0, j - i + Lq - 1],
then attn_mask / is_causal as usual, then the mask above. Gradients flow through every modifier
but masked_fill; biases and slopes are constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

__all__ = ["AttentionMods"]


@dataclass
class AttentionMods:
    align: str = "top_left"
    window_left: Optional[int] = None
    window_right: Optional[int] = None
    dilation: int = 1
    block_size: int = 1
    prefix: int = 0
    global_tokens: Sequence[int] = field(default_factory=tuple)
    block_pattern: Any = None
    random_blocks: int = 0
    random_seed: int = 0
    document_ids: Any = None
    key_document_ids: Any = None
    softcap: float = 0.0
    alibi_slopes: Any = None
    relative_bias: Any = None
    masked_fill: Optional[float] = None

    @classmethod
    def causal(cls, align: str = "top_left") -> "AttentionMods":
        return cls(align=align, window_right=0)

    @classmethod
    def sliding_window(cls, left: int, right: int, align: str = "top_left") -> "AttentionMods":
        """Keys at most `left` before and `right` after the diagonal."""
        return cls(align=align, window_left=left, window_right=right)

    @classmethod
    def prefix_lm(cls, prefix: int) -> "AttentionMods":
        """Causal, plus the first `prefix` keys for every query."""
        return cls(window_right=0, prefix=prefix)

    @classmethod
    def longformer(cls, left: int, right: int, global_tokens: Sequence[int]) -> "AttentionMods":
        return cls(window_left=left, window_right=right, global_tokens=tuple(global_tokens))

    @classmethod
    def bigbird(cls, block: int, window_blocks: int, random: int, seed: int, length: int) -> "AttentionMods":
        """Blocks of `block`, `window_blocks` blocks each side, first and last block global,
        `random` random key blocks per query block (seeded)."""
        first = range(min(block, length))
        last = range(max(block, length - block), length)
        return cls(block_size=block, window_left=window_blocks, window_right=window_blocks,
                   global_tokens=tuple(first) + tuple(last), random_blocks=random, random_seed=seed)
