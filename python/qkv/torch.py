"""qkv.torch: qkv's attention kernels inside PyTorch's autograd (needs torch; import qkv.torch).

Drop-in replacements, same signatures as PyTorch's:
  qkv.torch.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                         is_causal=False, scale=None, enable_gqa=False)
      = torch.nn.functional.scaled_dot_product_attention, forward and backward on qkv's fused
        kernels (qkv::scaled_dot_product_attention and its FlashAttention-2 backward).
  qkv.torch.MultiheadAttention(embed_dim, num_heads, ...)
      = torch.nn.MultiheadAttention (a subclass: same parameters, initialisation, state_dict and
        forward signature) whose forward and backward run qkv::nn::MultiheadAttention.

Both are torch.library custom ops (qkv::scaled_dot_product_attention, qkv::multihead_attention and
their backward ops), each with a fake (meta) kernel and a registered autograd formula, so
torch.compile traces them and torch.library.opcheck passes. Tensors cross into qkv through DLPack
without copies. The SDPA ops are registered for CPU and CUDA tensors: on CUDA, bfloat16/float16
inputs with head dims 64 or 128 run qkv's GPU forward and backward (docs/cuda.md); the MHA layer
runs on the CPU (CUDA tensors: a ValueError naming the device). Masks are constants: a float
attn_mask that requires grad gets no gradient (torch's would). Dropout seeds are drawn from torch's default generator, so
torch.manual_seed makes a run repeatable; the draws themselves are qkv's (Philox), not torch's.
See docs/python.md, "qkv inside PyTorch autograd".
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _qkv
from ._qkv import nn as _nn

__all__ = ["scaled_dot_product_attention", "MultiheadAttention"]

_EMPTY = (0,)  # shape of the placeholder tensor a custom op returns where it has nothing


def _plain(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Read through DLPack: a tensor that requires grad must be detached first (no copy)."""
    return None if t is None else t.detach()


def _as_torch(x) -> torch.Tensor:
    """A qkv result (torch tensor or NumPy array) as a torch tensor, without copying."""
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)


def _dropout_seed(dropout_p: float) -> int:
    """A seed for qkv's dropout from torch's default generator (0 when there is no dropout)."""
    if dropout_p <= 0.0:
        return 0
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


# ---- scaled_dot_product_attention -------------------------------------------------------------


def _sdpa_out_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> tuple:
    """[..., Hq, Lq, Dv]: leading dims broadcast as qkv (and torch) broadcast them."""
    if enable_gqa and q.dim() >= 3:
        lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]) + (q.shape[-3],)
    else:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return tuple(lead) + (q.shape[-2], v.shape[-1])


# The SDPA ops on both devices: qkv dispatches CUDA tensors to its GPU kernels (bf16/f16,
# D = 64 or 128, no dropout: anything else is qkv's own error naming the device and dtype).
_SDPA_DEVICES = ("cpu", "cuda")


@torch.library.custom_op("qkv::scaled_dot_product_attention", mutates_args=(), device_types=_SDPA_DEVICES)
def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
             dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (output [..., Hq, Lq, Dv], logsumexp [..., Hq, Lq]); the logsumexp is saved for the backward
    out, lse = _qkv.scaled_dot_product_attention(
        _plain(query), _plain(key), _plain(value), _plain(attn_mask), dropout_p, is_causal, scale, enable_gqa,
        seed=seed, return_logsumexp=True)
    return _as_torch(out), _as_torch(lse)


@_sdpa_op.register_fake
def _(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    shape = _sdpa_out_shape(query, key, value, enable_gqa)
    lse_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    return query.new_empty(shape), query.new_empty(shape[:-1], dtype=lse_dtype)


@torch.library.custom_op("qkv::scaled_dot_product_attention_backward", mutates_args=(), device_types=_SDPA_DEVICES)
def _sdpa_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      out: torch.Tensor, logsumexp: torch.Tensor, attn_mask: Optional[torch.Tensor],
                      dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = _qkv.scaled_dot_product_attention_backward(
        _plain(query), _plain(key), _plain(value), _plain(out), _plain(grad_out), _plain(logsumexp),
        _plain(attn_mask), dropout_p, is_causal, scale, enable_gqa, seed=seed)
    return _as_torch(dq), _as_torch(dk), _as_torch(dv)


@_sdpa_backward_op.register_fake
def _(grad_out, query, key, value, out, logsumexp, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _sdpa_setup_context(ctx, inputs, output):
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, attn_mask, out, lse)
    ctx.options = (dropout_p, is_causal, scale, enable_gqa, seed)


def _sdpa_backward(ctx, grad_out, grad_lse):
    # grad_lse is not used: the public function returns the output only
    query, key, value, attn_mask, out, lse = ctx.saved_tensors
    dq, dk, dv = _sdpa_backward_op(grad_out, query, key, value, out, lse, attn_mask, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


_sdpa_op.register_autograd(_sdpa_backward, setup_context=_sdpa_setup_context)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention on qkv's fused kernels, differentiable.

    Same arguments and conventions (bool attn_mask: True = take part; float: added). CPU tensors
    of float32, float64, float16 or bfloat16; CUDA tensors of bfloat16 or float16 with head dim
    64 or 128 and no dropout (qkv's GPU kernels). attn_mask is a constant (no gradient)."""
    out, _ = _sdpa_op(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                      None if scale is None else float(scale), bool(enable_gqa), _dropout_seed(dropout_p))
    return out


# ---- MultiheadAttention -----------------------------------------------------------------------

# The parameters of torch.nn.MultiheadAttention, in the order the custom ops take them
# (absent ones are None); their state_dict names are qkv's names for their gradients.
_PARAMS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v",
           "out_proj.weight", "out_proj.bias")


def _layer(params: Sequence[Optional[torch.Tensor]], num_heads: int, add_zero_attn: bool, dropout_p: float,
           training: bool, batch_first: bool, seed: int):
    """A qkv::nn::MultiheadAttention holding `params` (the shapes give E, kdim, vdim, bias, bias_kv)."""
    sd = {name: _plain(p) for name, p in zip(_PARAMS, params) if p is not None}
    embed_dim = int(sd["out_proj.weight"].shape[0])
    kdim = vdim = None
    if "in_proj_weight" not in sd:
        kdim, vdim = int(sd["k_proj_weight"].shape[1]), int(sd["v_proj_weight"].shape[1])
    layer = _nn._MultiheadAttention(embed_dim, num_heads, dropout_p, "in_proj_bias" in sd, "bias_k" in sd,
                                    add_zero_attn, kdim, vdim, batch_first)
    layer.load_state_dict(sd, True)
    layer.training = training
    layer.dropout_seed = seed
    return layer


@torch.library.custom_op("qkv::multihead_attention", mutates_args=(), device_types="cpu")
def _mha_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            in_proj_weight: Optional[torch.Tensor], q_proj_weight: Optional[torch.Tensor],
            k_proj_weight: Optional[torch.Tensor], v_proj_weight: Optional[torch.Tensor],
            in_proj_bias: Optional[torch.Tensor], bias_k: Optional[torch.Tensor], bias_v: Optional[torch.Tensor],
            out_proj_weight: torch.Tensor, out_proj_bias: Optional[torch.Tensor],
            key_padding_mask: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor], num_heads: int,
            add_zero_attn: bool, dropout_p: float, training: bool, batch_first: bool, need_weights: bool,
            average_attn_weights: bool, is_causal: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (output, weights or an empty placeholder when need_weights is False)
    params = (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v,
              out_proj_weight, out_proj_bias)
    layer = _layer(params, num_heads, add_zero_attn, dropout_p, training, batch_first, seed)
    out, weights = layer.forward(_plain(query), _plain(key), _plain(value), _plain(key_padding_mask), need_weights,
                                 _plain(attn_mask), average_attn_weights, is_causal)
    return _as_torch(out), (_as_torch(weights) if weights is not None else query.new_empty(_EMPTY))


def _mha_weights_shape(query, key, params, num_heads, add_zero_attn, batch_first, average_attn_weights) -> tuple:
    """[N, L, S'] averaged or [N, H, L, S'] (no N unbatched); S' counts bias_kv's and zero_attn's keys."""
    batched = query.dim() == 3
    l_dim, s_dim, n_dim = (1, 1, 0) if (batched and batch_first) else (0, 0, 1)
    extra = int(params[_PARAMS.index("bias_k")] is not None) + int(add_zero_attn)
    shape = (query.shape[l_dim], key.shape[s_dim] + extra)
    if not average_attn_weights:
        shape = (num_heads,) + shape
    return ((query.shape[n_dim],) + shape) if batched else shape


@_mha_op.register_fake
def _(query, key, value, *rest):
    return _mha_fake(query, key, value, rest[:9], *rest[9:])


def _mha_fake(query, key, value, params, key_padding_mask, attn_mask, num_heads, add_zero_attn, dropout_p, training,
             batch_first, need_weights, average_attn_weights, is_causal, seed):
    weights = query.new_empty(_EMPTY)
    if need_weights:
        weights = query.new_empty(
            _mha_weights_shape(query, key, params, num_heads, add_zero_attn, batch_first, average_attn_weights))
    return query.new_empty(query.shape), weights


@torch.library.custom_op("qkv::multihead_attention_backward", mutates_args=(), device_types="cpu")
def _mha_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     in_proj_weight: Optional[torch.Tensor], q_proj_weight: Optional[torch.Tensor],
                     k_proj_weight: Optional[torch.Tensor], v_proj_weight: Optional[torch.Tensor],
                     in_proj_bias: Optional[torch.Tensor], bias_k: Optional[torch.Tensor], bias_v: Optional[torch.Tensor],
                     out_proj_weight: torch.Tensor, out_proj_bias: Optional[torch.Tensor],
                     key_padding_mask: Optional[torch.Tensor],
                     attn_mask: Optional[torch.Tensor], num_heads: int, add_zero_attn: bool, dropout_p: float,
                     training: bool, batch_first: bool, need_weights: bool, is_causal: bool,
                     seed: int) -> list[torch.Tensor]:
    # [d query, d key, d value, d params...] (an empty placeholder for an absent parameter)
    params = (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, bias_k, bias_v,
              out_proj_weight, out_proj_bias)
    layer = _layer(params, num_heads, add_zero_attn, dropout_p, training, batch_first, seed)
    dq, dk, dv, grads = layer.backward(_plain(query), _plain(key), _plain(value), _plain(grad_out),
                                       _plain(key_padding_mask), need_weights, _plain(attn_mask), is_causal)
    dparams = [_as_torch(grads[name]) if p is not None else query.new_empty(_EMPTY) for name, p in zip(_PARAMS, params)]
    return [_as_torch(dq), _as_torch(dk), _as_torch(dv)] + dparams


@_mha_backward_op.register_fake
def _(grad_out, query, key, value, *rest):
    params = rest[:9]
    dparams = [torch.empty_like(p) if p is not None else query.new_empty(_EMPTY) for p in params]
    return [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)] + dparams


def _mha_setup_context(ctx, inputs, output):
    query, key, value, params = inputs[0], inputs[1], inputs[2], inputs[3:12]
    (key_padding_mask, attn_mask, num_heads, add_zero_attn, dropout_p, training, batch_first, need_weights, _average,
     is_causal, seed) = inputs[12:]
    ctx.save_for_backward(query, key, value, key_padding_mask, attn_mask, *params)
    ctx.present = [p is not None for p in params]
    ctx.options = (num_heads, add_zero_attn, dropout_p, training, batch_first, need_weights, is_causal, seed)


def _mha_backward(ctx, grad_out, grad_weights):
    # grad_weights is not propagated: the attention weights are an output for inspection only
    query, key, value, key_padding_mask, attn_mask, *params = ctx.saved_tensors  # absent ones saved as None
    grads = _mha_backward_op(grad_out.contiguous(), query, key, value, *params, key_padding_mask, attn_mask,
                             *ctx.options)
    dparams = tuple(g if present else None for g, present in zip(grads[3:], ctx.present))
    return (grads[0], grads[1], grads[2]) + dparams + (None,) * 11


_mha_op.register_autograd(_mha_backward, setup_context=_mha_setup_context)


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with forward and backward on qkv::nn::MultiheadAttention.

    Same constructor, parameters (in_proj_weight or q/k/v_proj_weight, in_proj_bias, bias_k,
    bias_v, out_proj), initialisation and state_dict as torch's layer, so either loads the
    other's weights; float32 CPU only. forward has torch's signature and results; dropout
    applies in train() mode. The attention weights returned with need_weights=True carry no
    gradient; masks are constants."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        params = [getattr(self, name, None) for name in _PARAMS[:-2]] + [self.out_proj.weight, self.out_proj.bias]
        for name, p in zip(_PARAMS, params):
            if p is not None and p.dtype != torch.float32:
                raise TypeError(f"qkv.torch.MultiheadAttention: {name} is {p.dtype}; qkv's layer is float32 only")
        # qkv::nn runs on the host: say so before torch's dispatcher finds no kernel for the
        # device ("meta" stays: its fake kernel infers shapes).
        for name, t in zip(("query", "key", "value", "in_proj/out_proj weights"), (query, key, value, params[-2])):
            if t.device.type not in ("cpu", "meta"):
                raise ValueError(f"qkv.torch.MultiheadAttention: {name} on {t.device}; qkv's layer runs on the CPU "
                                 "(qkv.torch.scaled_dot_product_attention takes CUDA tensors)")
        dropout_p = float(self.dropout) if self.training else 0.0
        out, weights = _mha_op(query, key, value, *params, key_padding_mask, attn_mask, self.num_heads,
                               bool(self.add_zero_attn), dropout_p, self.training, self.batch_first, need_weights,
                               average_attn_weights, is_causal, _dropout_seed(dropout_p))
        return out, (weights if need_weights else None)
