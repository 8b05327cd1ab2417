"""qkv.nn: multi-head attention layers with PyTorch's and Keras' semantics (inference only).

Every computation runs in C++ (qkv::nn, the _qkv extension); this module only gives the
layers the frameworks' signatures. Inputs are NumPy arrays or CPU torch tensors (read in
place through DLPack); results are NumPy arrays, or torch tensors when the query was one
(`torch.from_dlpack`, no copy). Dropout applies only with `layer.training = True`
(default: eval, as torch's `.eval()`). See docs/nn.md.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Mapping, Optional, Sequence

from ._qkv import _array_like
from ._qkv import nn as _nn

LazyMultiHeadAttention = _nn.LazyMultiHeadAttention
MultiHeadSelfAttention = _nn.MultiHeadSelfAttention
SelfAttention = _nn.SelfAttention
SeparateHeadsAttention = _nn.SeparateHeadsAttention
Adam = _nn.Adam
SGD = _nn.SGD
binary_cross_entropy_with_logits = _nn.binary_cross_entropy_with_logits
cross_entropy = _nn.cross_entropy
mse_loss = _nn.mse_loss

__all__ = ["MultiheadAttention", "KerasMultiHeadAttention", "SelfAttention", "MultiHeadSelfAttention",
           "SeparateHeadsAttention", "LazyMultiHeadAttention", "keras_to_torch", "torch_to_keras", "quantize_dynamic", "int8_weight_bits",
           "Adam", "SGD", "binary_cross_entropy_with_logits", "cross_entropy", "mse_loss", "keras_adam_state"]


def _array(x: Any) -> Any:
    """A torch tensor that requires grad is read through .detach() (no copy)."""
    if x is not None and hasattr(x, "detach") and getattr(x, "requires_grad", False):
        return x.detach()
    return x


def _arrays(d: Mapping[str, Any]) -> dict:
    return {str(k): _array(v) for k, v in dict(d).items()}


class _hybridmethod:
    """A method that works on the class (a constructor) and on an instance (loads into it)."""

    def __init__(self, on_class, on_instance):
        self.on_class, self.on_instance = on_class, on_instance

    def __get__(self, obj, cls):
        return types.MethodType(self.on_class, cls) if obj is None else types.MethodType(self.on_instance, obj)


def _like(result: Any, like: Any) -> Any:
    """Results as torch tensors when the input was one, else NumPy arrays (one rule for
    the package: python/src/array_like.h)."""
    return _array_like(result, like)


class MultiheadAttention:
    """torch.nn.MultiheadAttention's semantics and state_dict names; see docs/nn.md."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False) -> None:
        self._layer = _nn._MultiheadAttention(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
                                              kdim, vdim, batch_first)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.batch_first = batch_first

    @classmethod
    def _sized_for(cls, sd: Mapping[str, Any], num_heads: int, dropout: float, add_zero_attn: bool,
                   batch_first: bool) -> "MultiheadAttention":
        """A layer whose embed_dim, kdim, vdim, bias and add_bias_kv are read from state_dict keys and shapes."""
        embed_dim = int(sd["out_proj.weight"].shape[0])
        kdim = vdim = None
        if "in_proj_weight" not in sd:
            kdim, vdim = int(sd["k_proj_weight"].shape[1]), int(sd["v_proj_weight"].shape[1])
        return cls(embed_dim, num_heads, dropout=dropout, bias="in_proj_bias" in sd, add_bias_kv="bias_k" in sd,
                   add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first)

    def _new_from_state_dict(cls, state_dict: Mapping[str, Any], num_heads: int, *, prefix: str | None = None,
                             dropout: float = 0.0, add_zero_attn: bool = False,
                             batch_first: bool = False) -> "MultiheadAttention":
        """MultiheadAttention.from_state_dict(sd, num_heads, ...): a layer with PyTorch's state_dict
        (dict of arrays or tensors); embed_dim, kdim, vdim, bias and add_bias_kv are read from the
        keys and shapes. sd may be a whole model's, or qkv.load of `qkv convert --to torch`'s file
        ("multi_head_attention.in_proj_weight", ...): the one MultiheadAttention's keys are taken,
        or those under `prefix` when there are several. layer.from_state_dict(sd): loads into this
        layer and returns it."""
        sd = _nn._mha_state_dict(_arrays(state_dict), prefix or "")
        layer = cls._sized_for(sd, num_heads, dropout, add_zero_attn, batch_first)
        layer.load_state_dict(sd)
        return layer

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], *, prefix: str | None = None) -> "MultiheadAttention":
        self.load_state_dict(_nn._mha_state_dict(_arrays(state_dict), prefix or ""))
        return self

    from_state_dict = _hybridmethod(_new_from_state_dict, _load_from_state_dict)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        self._layer.load_state_dict(_arrays(state_dict), strict)

    def state_dict(self) -> dict:
        return self._layer.state_dict()

    def quantize_dynamic(self, weight_bits: Optional[int] = None) -> "MultiheadAttention":
        """A copy whose projections are dynamically int8-quantized: int8 weights per output channel,
        activations per token at run time, int8 GEMMs with int32 accumulation; attention stays
        float32 (docs/nn_quantization.md). state_dict() still returns the float32 parameters. weight_bits: 8, 7
        (weights in [-63, 63]) or None for this CPU's choice (qkv.nn.int8_weight_bits())."""
        layer = object.__new__(MultiheadAttention)
        layer.__dict__.update(self.__dict__)
        layer._layer = self._layer.quantize_dynamic(_weight_bits(weight_bits))
        return layer

    def quantize_static(self, batches: Sequence[Any], observer: str = "minmax", percentile: float = 99.99,
                        weight_bits: Optional[int] = None) -> "MultiheadAttention":
        """A copy with int8 projections whose activation scales are fixed by calibration: the
        float32 layer runs `batches` (each an array for self-attention, or (query, key, value)),
        observers record the projections' inputs ('minmax': the largest |x|; 'percentile': that
        percentile of |x|), and each projection quantizes its input with one scale (docs/nn_quantization.md).
        weight_bits as quantize_dynamic's."""
        layer = object.__new__(MultiheadAttention)
        layer.__dict__.update(self.__dict__)
        items = [tuple(_array(t) for t in b) if isinstance(b, (tuple, list)) else _array(b) for b in batches]
        layer._layer = self._layer.quantize_static(items, observer, percentile, _weight_bits(weight_bits))
        return layer

    @property
    def weight_bits(self) -> int:
        """8 or 7: the bits of the int8 projections' weights; 0 when not quantized."""
        return self._layer.weight_bits

    def quantized_state_dict(self) -> dict:
        """The quantized layer as a file holds it (qkv.save(path, sd) writes safetensors): each
        projection weight int8 [out, in] with "<name>.scale" float32 [out], biases float32, and
        "activation_scales" [4] for static quantization (docs/nn_quantization.md)."""
        return self._layer.quantized_state_dict()

    def _new_from_quantized(cls, state_dict: Mapping[str, Any], num_heads: int, *, dropout: float = 0.0,
                            add_zero_attn: bool = False, batch_first: bool = False) -> "MultiheadAttention":
        """MultiheadAttention.from_quantized_state_dict(sd, num_heads): the quantized layer of
        quantized_state_dict() (the same int8 weights and scales); sizes read from the shapes."""
        sd = _arrays(state_dict)
        # the sizes come from these keys: without them a bare KeyError('out_proj.weight') said nothing
        sizes = ("out_proj.weight",) + (() if "in_proj_weight" in sd else ("k_proj_weight", "v_proj_weight"))
        for key in sizes:
            if key not in sd:
                raise ValueError(f"MultiheadAttention.from_quantized_state_dict: no '{key}' (the layer's own keys, "
                                 f"without a prefix, as quantized_state_dict() gives them); keys: {sorted(sd)}")
        layer = cls._sized_for(sd, num_heads, dropout, add_zero_attn, batch_first)
        layer._layer = layer._layer.from_quantized(sd)
        return layer

    from_quantized_state_dict = classmethod(_new_from_quantized)

    @property
    def quantized(self) -> bool:
        return self._layer.quantized

    @property
    def training(self) -> bool:
        return self._layer.training

    @training.setter
    def training(self, mode: bool) -> None:
        """`mha.training = True` as on a torch module (and qkv's Keras flavour); it had no setter."""
        self._layer.training = bool(mode)

    def train(self, mode: bool = True) -> "MultiheadAttention":
        self._layer.training = mode
        return self

    @property
    def dropout_seed(self) -> int:
        """The seed of the attention dropout (training): forward draws its mask from it and backward
        redraws the same one, so a training loop sets a new seed each step (torch draws a fresh mask
        every call; qkv.torch does this for you). Only the Keras flavour had it in Python."""
        return self._layer.dropout_seed

    @dropout_seed.setter
    def dropout_seed(self, seed: int) -> None:
        self._layer.dropout_seed = int(seed)

    def eval(self) -> "MultiheadAttention":
        return self.train(False)

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None, need_weights: bool = True,
                attn_mask: Any = None, average_attn_weights: bool = True, is_causal: bool = False,
                cache: Any = None, mods: Any = None, attention: str | None = None,
                attention_options: Mapping[str, Any] | None = None) -> tuple:
        """(attn_output, attn_output_weights or None), as torch: output [L, N, E] ([N, L, E] with
        batch_first), weights [N, L, S] averaged over heads or [N, H, L, S]. With cache=qkv.KVCache
        ([N, H, capacity, E/H]): self-attention of the new tokens `query` (key and value must be
        the same array) appended to the cache, causal over everything cached (prefill, then
        decode token by token; docs/decode.md); returns (output, None). mods=qkv.AttentionMods(...):
        sliding windows, global tokens, ALiBi, ... on the layer's attention (docs/attention-variants.md).
        attention="linear" | "performer" | "lsh" (default "softmax") runs that variant between the
        projections, with attention_options = qkv.attention.linear's / qkv.attention.lsh's keywords
        (is_causal, feature_map, num_features, seed, chunk / n_hashes, n_buckets, chunk_length, ...);
        "lsh" takes the query projection as Reformer's shared query-key (self-attention only).
        Forward only, need_weights=False, no masks, mods or dropout (docs/nn.md). The softmax
        attention takes attention_options={"matmul_precision": "highest" | "high" | "medium"}
        (scaled_dot_product_attention's: "medium" runs the heads through bf16 tiles where the CPU
        has a native bf16 GEMM; forward only, the backward stays float32)."""
        if cache is not None:
            if key is not query or value is not query:
                raise ValueError("MultiheadAttention.forward: with a cache, key and value must be the query itself")
            return _like(self._layer.forward_cached(_array(query), cache), query), None
        q, k, v = _array(query), _array(key), _array(value)
        k = q if key is query else k
        v = q if value is query else (k if value is key else v)
        out, w = self._layer.forward(q, k, v, _array(key_padding_mask), need_weights, _array(attn_mask),
                                     average_attn_weights, is_causal, mods, attention, attention_options)
        return _like(out, query), _like(w, query)

    __call__ = forward

    def backward(self, query: Any, key: Any, value: Any, grad_output: Any, key_padding_mask: Any = None,
                 need_weights: bool = True, attn_mask: Any = None, is_causal: bool = False, mods: Any = None,
                 attention: str | None = None, attention_options: Mapping[str, Any] | None = None) -> tuple:
        """(d_query, d_key, d_value, grads): the gradients of a loss through forward(query, key, value,
        ...) given grad_output = d loss / d output, and grads = {state_dict name: gradient} for every
        parameter (docs/nn.md). Same arguments as forward (need_weights and is_causal select the same
        attention path). When query, key and value are one array, its gradient is the sum of the three.
        With add_bias_kv, grads has "bias_k" and "bias_v" ([1, 1, E]); add_zero_attn's zero row has no
        parameter. attention other than "softmax" has no backward (ValueError)."""
        q, k, v = _array(query), _array(key), _array(value)
        k = q if key is query else k
        v = q if value is query else (k if value is key else v)
        dq, dk, dv, grads = self._layer.backward(q, k, v, _array(grad_output), _array(key_padding_mask),
                                                 need_weights, _array(attn_mask), is_causal, mods, attention,
                                                 attention_options)
        return _like(dq, query), _like(dk, query), _like(dv, query), {n: _like(g, query) for n, g in grads.items()}


@contextlib.contextmanager
def _training_for_the_call(layer: Any, training: bool | None):
    """Keras' `training=` holds for one call: a later call without it runs in inference mode, as
    Keras' does outside fit (it stayed set, so `layer(x, training=True)` left dropout on for every
    later `layer(x)`). None leaves the layer's own flag."""
    before = layer.training
    if training is not None:
        layer.training = bool(training)
    try:
        yield
    finally:
        layer.training = before


class KerasMultiHeadAttention:
    """keras.layers.MultiHeadAttention's semantics (Keras 3) and weights; see docs/nn.md."""

    def __init__(self, num_heads: int, key_dim: int, value_dim: int | None = None, use_bias: bool = True,
                 output_shape: int | Sequence[int] | None = None,
                 attention_axes: int | Sequence[int] | None = None, dropout: float = 0.0,
                 sliding_window: int | None = None, use_gate: bool = False) -> None:
        # None, an int or a sequence of ints: the binding checks them (errors name the argument)
        self._layer = _nn._KerasMultiHeadAttention(num_heads, key_dim, value_dim, use_bias, output_shape,
                                                   attention_axes, dropout, sliding_window, use_gate)
        self.num_heads, self.key_dim = num_heads, key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.use_bias, self.output_shape, self.attention_axes = use_bias, output_shape, attention_axes
        self.sliding_window, self.use_gate = sliding_window, use_gate

    def _new_from_weights(cls, weights: Sequence[Any] | Mapping[str, Any], num_heads: int | None = None,
                          key_dim: int | None = None, *, layer: str | None = None,
                          **kwargs: Any) -> "KerasMultiHeadAttention":
        """KerasMultiHeadAttention.from_weights(weights, num_heads, key_dim, ...): a layer with Keras'
        weights: the list of layer.get_weights(), or a dict: qkv.load of any weight file (Keras 3
        .weights.h5 / .keras, tf.keras .h5, TF checkpoint, safetensors; the one MultiHeadAttention
        layer, or the one named `layer`) or variable paths ("mha/query/kernel", ...). With a dict,
        num_heads, key_dim, value_dim, use_bias, output_shape and use_gate default to what the kernels
        say.
        layer.from_weights(weights): loads into this layer, returns it."""
        if isinstance(weights, Mapping):
            found, implied = _nn._keras_mha_weights(_arrays(weights), layer or "")
            for name in ("value_dim", "use_bias", "output_shape", "use_gate"):
                kwargs.setdefault(name, implied[name])
            num_heads = implied["num_heads"] if num_heads is None else num_heads
            key_dim = implied["key_dim"] if key_dim is None else key_dim
            return cls(num_heads, key_dim, **kwargs).from_weights(found)
        if num_heads is None or key_dim is None:
            raise TypeError("KerasMultiHeadAttention.from_weights: a list of weights needs num_heads and key_dim")
        return cls(num_heads, key_dim, **kwargs).from_weights(weights)

    def _load_weights_into(self, weights: Sequence[Any] | Mapping[str, Any], *,
                           layer: str | None = None) -> "KerasMultiHeadAttention":
        if isinstance(weights, Mapping):
            self.load_weights(weights, layer=layer)
        else:
            self.set_weights(weights)
        return self

    from_weights = _hybridmethod(_new_from_weights, _load_weights_into)

    def set_weights(self, weights: Sequence[Any] | Mapping[str, Any]) -> None:
        if isinstance(weights, Mapping):
            self.load_weights(weights)
        else:
            self._layer.set_weights([_array(w) for w in weights])

    def load_weights(self, weights: Mapping[str, Any], layer: str | None = None) -> None:
        """Weights by name, from any key scheme qkv.load gives (see from_weights)."""
        self._layer.load_weights(_arrays(weights), layer or "")

    def get_weights(self) -> list:
        return self._layer.get_weights()

    @property
    def built(self) -> bool:
        return self._layer.built

    @property
    def training(self) -> bool:
        """Dropout for calls without `training=` (default False); a call's `training=` holds for that call only."""
        return self._layer.training

    @training.setter
    def training(self, mode: bool) -> None:
        self._layer.training = bool(mode)

    def quantize_dynamic(self, weight_bits: Optional[int] = None) -> "KerasMultiHeadAttention":
        """A copy whose projections are dynamically int8-quantized (as MultiheadAttention's, same
        weight_bits); attention stays float32, get_weights() keeps the float32 weights, backward refuses."""
        layer = object.__new__(KerasMultiHeadAttention)
        layer.__dict__.update(self.__dict__)
        layer._layer = self._layer.quantize_dynamic(_weight_bits(weight_bits))
        return layer

    @property
    def quantized(self) -> bool:
        return self._layer.quantized

    def __call__(self, query: Any, value: Any, key: Any = None, query_mask: Any = None, value_mask: Any = None,
                 key_mask: Any = None, attention_mask: Any = None, return_attention_scores: bool = False,
                 use_causal_mask: bool = False, training: bool | None = None, mods: Any = None,
                 attention: str | None = None, attention_options: Mapping[str, Any] | None = None) -> Any:
        """output [B, T..., *output_shape], or (output, scores [B.., N, T.., S..]) as Keras.
        mods=qkv.AttentionMods(...) modifies the attention over the (flattened) attended axes;
        attention="linear" | "performer" | "lsh" with attention_options as MultiheadAttention.forward
        (forward only; no masks, scores or sliding_window; use_causal_mask makes it causal)."""
        q = _array(query)
        v = q if value is query else _array(value)
        k = q if key is query else _array(key)
        with _training_for_the_call(self._layer, training):
            r = self._layer.forward(q, v, k, _array(query_mask), _array(value_mask), _array(key_mask),
                                    _array(attention_mask), return_attention_scores, use_causal_mask, mods, attention,
                                    attention_options)
        if return_attention_scores:
            return _like(r[0], query), _like(r[1], query)
        return _like(r, query)

    def backward(self, query: Any, value: Any, grad_output: Any, key: Any = None, query_mask: Any = None,
                 value_mask: Any = None, key_mask: Any = None, attention_mask: Any = None,
                 return_attention_scores: bool = False, use_causal_mask: bool = False,
                 training: bool | None = None, mods: Any = None, attention: str | None = None,
                 attention_options: Mapping[str, Any] | None = None) -> tuple:
        """(d_query, d_value, d_key or None, grads): the gradients of a loss through
        layer(query, value, key=key, ...) given grad_output = d loss / d output, and grads =
        {Keras weight name ("query/kernel", ..., "attention_output/bias"): gradient}. Same arguments
        as the call (return_attention_scores selects Keras' path for fully masked rows); masks are
        constants, dropout (training) is redrawn from dropout_seed. Without key the value is also
        the key and d_value holds both uses; when query and value are one array its gradient is
        d_query + d_value (docs/nn.md). training= as the call's: a training call's backward needs
        training=True too (or layer.training set), since training= holds for one call. mods as in
        the call; attention other than "softmax" has no backward (ValueError)."""
        q = _array(query)
        v = q if value is query else _array(value)
        with _training_for_the_call(self._layer, training):
            dq, dv, dk, grads = self._layer.backward(q, v, _array(grad_output), _array(key), _array(query_mask),
                                                     _array(value_mask), _array(key_mask), _array(attention_mask),
                                                     return_attention_scores, use_causal_mask, mods, attention,
                                                     attention_options)
        return (_like(dq, query), _like(dv, query), None if dk is None else _like(dk, query),
                {n: _like(g, query) for n, g in grads.items()})

    @property
    def dropout_seed(self) -> int:
        """The seed of the attention dropout (training); backward redraws the same mask from it."""
        return self._layer.dropout_seed

    @dropout_seed.setter
    def dropout_seed(self, seed: int) -> None:
        self._layer.dropout_seed = int(seed)


def keras_to_torch(weights: Mapping[str, Any]) -> dict:
    """Keras MultiHeadAttention / Dense weights in PyTorch's layout, as `qkv convert --to torch`
    writes them: "<layer>.in_proj_weight" [3E, E], "<layer>.in_proj_bias", "<layer>.out_proj.*",
    Dense "<layer>.weight" [out, in], "<layer>.bias". `weights` is any weight file's dict
    (qkv.load) or variable paths ("mha/query/kernel"). ValueError where PyTorch has no such
    layout (num_heads * key_dim != E, value_dim != key_dim, ...)."""
    return _nn._keras_to_torch(_arrays(weights))


def torch_to_keras(state_dict: Mapping[str, Any], num_heads: int) -> dict:
    """The inverse, as `qkv convert --to keras --heads N` runs it: each MultiheadAttention
    ("<p>.in_proj_weight" or separate q/k/v_proj_weight, with or without biases) becomes
    "<p>/query/kernel" [E_in, N, E/N], ..., "<p>/attention_output/bias"; "<p>.weight" +
    "<p>.bias" become "<p>/kernel", "<p>/bias". KerasMultiHeadAttention.from_weights takes it."""
    return _nn._torch_to_keras(_arrays(state_dict), int(num_heads))


def _weight_bits(weight_bits: Optional[int]) -> int:
    if weight_bits is None:
        return 0
    if isinstance(weight_bits, bool) or not isinstance(weight_bits, int):
        raise TypeError(f"quantize: weight_bits must be 8, 7 or None, got {weight_bits!r}")
    return weight_bits


def int8_weight_bits() -> int:
    """The weight bits quantize_dynamic picks on this CPU when not told: 8 where its int8 GEMMs run
    at int8 speed for any int8 weight (VNNI, AMX), 7 elsewhere (AVX2: oneDNN's int8 kernel is exact
    there only for weights in [-64, 63]; docs/nn_quantization.md)."""
    return _nn._int8_weight_bits()


def quantize_dynamic(layer: Any, weight_bits: Optional[int] = None) -> Any:
    """qkv.nn.quantize_dynamic(mha), as torch.ao.quantization.quantize_dynamic(model): a copy of the
    layer with int8 projections (MultiheadAttention.quantize_dynamic; weight_bits as there)."""
    if not isinstance(layer, (MultiheadAttention, KerasMultiHeadAttention)):
        raise TypeError("quantize_dynamic: expected a qkv.nn.MultiheadAttention or KerasMultiHeadAttention, got "
                        f"{type(layer).__name__}")
    return layer.quantize_dynamic(weight_bits)


def keras_adam_state(path: str, variables: Sequence[tuple[str, str]]) -> tuple[dict, int, float | None]:
    """Keras' saved Adam state, to resume a Keras training run with qkv.nn.Adam(convention="keras"):
    (state, iterations, learning_rate) for Adam.load_state(state, iterations). `path` is any file
    Keras saves the optimizer in (TF checkpoint, .keras, .weights.h5, legacy .h5); `variables` lists
    the model's trainable variables in Keras' trainable_variables order as (Keras path, qkv name),
    e.g. [("multi_head_attention/query/kernel", "query_kernel"), ...]; state holds "m/<name>",
    "v/<name>". OSError/ValueError naming the file and the missing slot (docs/nn.md)."""
    return _nn._keras_adam_state(str(path), [(str(p), str(n)) for p, n in variables])
