"""qkv.dist: attention past one process, over MPI (mpi4py communicators).

Run under ``mpiexec -n P python script.py``; every rank calls the same function with
its shard and the same communicator (``mpi4py.MPI.COMM_WORLD`` or one split from it).
The C++ side (qkv/dist, docs/distributed.md) does the transfers through that
communicator's MPI handle; qkv never starts or stops MPI when mpi4py owns it.

- ``ring_attention`` (and ``ring_attention_backward``): sequence-parallel; keys and values
  travel around the ring.
- ``ulysses_attention`` (and ``ulysses_attention_backward``): sequence shards re-split by heads
  with all-to-alls.
- ``TensorParallelAttention``: Megatron's heads-split layer (one all-reduce).
- ``shard_sequence`` / ``unshard_sequence``: the ``contiguous`` and ``zigzag`` layouts.

``available`` is False when qkv was built without MPI.
"""

from __future__ import annotations

import numpy as _np

from ._qkv import dist as _d

available = bool(_d.available)


def _handle(comm):
    """The C MPI_Comm of an mpi4py communicator, as an integer."""
    if not available:
        raise RuntimeError("qkv.dist: this qkv was built without MPI (QKV_MPI=OFF or no MPI found)")
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is in requirements-dev.txt
        raise RuntimeError("qkv.dist needs mpi4py (pip install mpi4py)") from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"qkv.dist: comm must be an mpi4py MPI.Comm, got {type(comm).__name__}")
    return int(MPI._handleof(comm))


def ring_attention(q, k, v, comm, *, is_causal=False, layout="contiguous", scale=None, enable_gqa=False,
                   attn_mask=None, return_logsumexp=False):
    """Ring attention: q [..., Hq, Lq_r, D], k/v [..., Hk, Lk_r, D]: this rank's shards along
    the sequence (``layout``: how they were cut; use ``zigzag`` for balanced causal work).
    attn_mask: this rank's query rows against every key, [..., Lq_r, Lk]. Returns this rank's
    output rows (and their logsumexp with ``return_logsumexp``); equal to
    scaled_dot_product_attention on the whole sequence."""
    return _d.ring_attention(q, k, v, _handle(comm), is_causal=is_causal, layout=layout, scale=scale,
                             enable_gqa=enable_gqa, attn_mask=attn_mask, return_logsumexp=return_logsumexp)


def ring_attention_backward(q, k, v, out, grad_out, logsumexp, comm, *, is_causal=False, layout="contiguous",
                            scale=None, enable_gqa=False, attn_mask=None):
    """(dq, dk, dv) of this rank's shards, from the forward's ``out`` and ``logsumexp``
    (``ring_attention(..., return_logsumexp=True)``) and ``grad_out`` = d loss / d out; the same
    options as the forward. K/V blocks travel the ring again, each with its dK/dV accumulators."""
    return _d.ring_attention_backward(q, k, v, out, grad_out, logsumexp, _handle(comm), is_causal=is_causal,
                                      layout=layout, scale=scale, enable_gqa=enable_gqa, attn_mask=attn_mask)


def ulysses_attention(q, k, v, comm, *, is_causal=False, layout="contiguous", scale=None, enable_gqa=False,
                      attn_mask=None):
    """Ulysses attention: q [B, Hq, Lq_r, D], k/v [B, Hk, Lk_r, D] sequence shards; returns this
    rank's output rows. attn_mask covers the whole sequence ([Lq, Lk] or [..., Hq, Lq, Lk])."""
    return _d.ulysses_attention(q, k, v, _handle(comm), is_causal=is_causal, layout=layout, scale=scale,
                                enable_gqa=enable_gqa, attn_mask=attn_mask)


def ulysses_attention_backward(q, k, v, grad_out, comm, *, is_causal=False, layout="contiguous", scale=None,
                               enable_gqa=False, attn_mask=None):
    """(dq, dk, dv) of this rank's shards given ``grad_out`` (this rank's rows of d loss / d out)
    and the forward's options; each rank recomputes the forward on its heads."""
    return _d.ulysses_attention_backward(q, k, v, grad_out, _handle(comm), is_causal=is_causal, layout=layout,
                                         scale=scale, enable_gqa=enable_gqa, attn_mask=attn_mask)


def _chunks(length, rank, size, layout):
    return _d.sequence_chunks(int(length), int(rank), int(size), layout)


def shard_sequence(x, rank, size, *, layout="contiguous", axis=-2):
    """Rank ``rank``'s shard of ``x`` along ``axis`` (NumPy; the same cut as the C++ side)."""
    x = _np.asarray(x)
    parts = [_np.take(x, _np.arange(s, s + n), axis=axis) for s, n in _chunks(x.shape[axis], rank, size, layout)]
    return parts[0] if len(parts) == 1 else _np.concatenate(parts, axis=axis)


def unshard_sequence(shards, *, layout="contiguous", axis=-2):
    """The whole sequence from every rank's shard (``shards[r]`` from rank r), in position order."""
    shards = [_np.asarray(s) for s in shards]
    if not shards:
        raise ValueError("unshard_sequence: no shards")
    length = sum(s.shape[axis] for s in shards)
    out = _np.empty_like(_np.concatenate(shards, axis=axis))
    for r, s in enumerate(shards):
        chunks = _chunks(length, r, len(shards), layout)
        # A shard of the wrong length would be cut or broadcast into place (a 1-row shard
        # fills a 3-row chunk): refuse it, as the C++ unshard_sequence does.
        if s.shape[axis] != sum(n for _, n in chunks):
            raise ValueError(f"unshard_sequence: rank {r}'s shard is {list(s.shape)}; the {layout} layout of "
                             f"{length} positions over {len(shards)} ranks gives it {sum(n for _, n in chunks)} "
                             f"along axis {axis}")
        at = 0
        for start, n in chunks:
            dst = [slice(None)] * out.ndim
            dst[axis] = slice(start, start + n)
            src = [slice(None)] * s.ndim
            src[axis] = slice(at, at + n)
            out[tuple(dst)] = s[tuple(src)]
            at += n
    return out


class TensorParallelAttention:
    """Megatron tensor-parallel attention: this rank's heads of a layer; ``forward`` returns the
    whole layer's output on every rank (one all-reduce).

    ``TensorParallelAttention.from_torch_mha(state_dict, embed_dim, num_heads, comm)`` splits a
    torch.nn.MultiheadAttention state_dict; ``from_projections(state_dict, embed_dim, num_heads,
    num_kv_heads, comm)`` takes q_proj/k_proj/v_proj/o_proj weights (GQA)."""

    def __init__(self, layer):
        self._layer = layer

    @classmethod
    def from_torch_mha(cls, state_dict, embed_dim, num_heads, comm, *, batch_first=False):
        return cls(_d.TensorParallelAttention.from_torch_mha(state_dict, embed_dim, num_heads, batch_first,
                                                              _handle(comm)))

    @classmethod
    def from_projections(cls, state_dict, embed_dim, num_heads, num_kv_heads, comm, *, head_dim=0,
                         batch_first=False):
        return cls(_d.TensorParallelAttention.from_projections(state_dict, embed_dim, num_heads, num_kv_heads,
                                                                head_dim, batch_first, _handle(comm)))

    @classmethod
    def from_shard(cls, shard, embed_dim, num_heads, num_kv_heads, comm, *, head_dim=0, batch_first=False):
        """A layer from this rank's ``shard_state_dict()`` (saved per rank, e.g. ``qkv.save``)."""
        return cls(_d.TensorParallelAttention.from_shard(shard, embed_dim, num_heads, num_kv_heads, head_dim,
                                                          batch_first, _handle(comm)))

    def shard_state_dict(self):
        """This rank's weights: q_proj/k_proj/v_proj rows and o_proj columns of its heads, o_proj.bias."""
        return self._layer.shard_state_dict()

    @property
    def first_head(self):
        return self._layer.first_head

    @property
    def local_heads(self):
        return self._layer.local_heads

    def forward(self, query, key, value, *, is_causal=False):
        return self._layer.forward(query, key, value, is_causal)

    __call__ = forward
