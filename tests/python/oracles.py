"""numpy float64 oracles shared by the pytest files (imported as `oracles`)."""
import numpy as np


def sdpa_float64(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    """PyTorch SDPA semantics in float64 numpy: returns (output, weights).

    Fully masked rows give 0; `gqa` repeats each k/v head Hq // Hk times
    (torch's repeat_interleave on dim -3).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64))
    m = s.max(axis=-1, keepdims=True)
    dead = np.isneginf(m)
    e = np.exp(s - np.where(dead, 0.0, m))
    w = np.where(dead, 0.0, e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True)))
    return w @ v, w


def data_ptr(array):
    """Address of element [0, ..., 0] of a NumPy array."""
    return array.__array_interface__["data"][0]
