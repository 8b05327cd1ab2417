"""qkv.plot: PNG heatmaps of attention weights and of mask patterns (qkv/heatmap.h, libpng).

  heatmap(weights, path=None, index=None, tokens=None, key_tokens=None, cell=0, labels=True, vmax=None)
      weights [..., Lq, Lk] (NumPy, torch, bool masks too): query i down, key j across, viridis
      from 0 to vmax (default the largest value), NaN red; `index` picks one [Lq, Lk] slice of
      the leading dims (flattened; default their mean); token labels (default indices, 3x5 pixel
      font, upper case) on the axes. Writes the PNG when `path` is given; returns the image as a
      uint8 array [height, width, 3].
  mask_pattern(mods, lq, lk=None) -> bool [Lq, Lk]
      which keys each query may see under a qkv.AttentionMods (computed by the attention itself).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from . import _qkv
from .mods import AttentionMods

__all__ = ["heatmap", "mask_pattern"]


def heatmap(weights: Any, path: Any = None, index: Optional[int] = None, tokens: Optional[Sequence[str]] = None,
            key_tokens: Optional[Sequence[str]] = None, cell: int = 0, labels: bool = True,
            vmax: Optional[float] = None) -> Any:
    if hasattr(weights, "detach"):
        weights = weights.detach()
    queries = [str(t) for t in tokens] if tokens is not None else []
    keys = [str(t) for t in key_tokens] if key_tokens is not None else queries
    return _qkv._heatmap(weights, "" if path is None else str(path), index, int(cell), bool(labels), queries, keys,
                         vmax)


def mask_pattern(mods: AttentionMods, lq: int, lk: Optional[int] = None) -> Any:
    import numpy as np

    lk = lq if lk is None else lk
    q, k = np.zeros((1, lq, 1), np.float32), np.zeros((1, lk, 1), np.float32)
    _, w = _qkv.scaled_dot_product_attention(q, k, k, mods=mods, return_weights=True)
    return w[0] > 0
