"""einops' API on qkv: ``from qkv import einops`` ports einops code unchanged.

rearrange, reduce, repeat, pack, unpack, parse_shape and einsum have einops'
signatures, grammar and error messages; the work runs in qkv's C++ library
(include/qkv/einops.h). Results have the array type of the first tensor (NumPy, or torch
for torch tensors; views of the input where einops would return views). Errors raise ``EinopsError``, a subclass of ValueError and of
RuntimeError (einops.EinopsError's base). Grammar and examples: docs/einops.md.
"""
from typing import List, Sequence, Tuple, Union

import numpy as np

from ._qkv import (EinopsError, _einops_einsum, _einops_pack, _einops_parse_shape, _einops_unpack,
                   rearrange, reduce, repeat)

__all__ = ["EinopsError", "asnumpy", "einsum", "pack", "parse_shape", "rearrange", "reduce", "repeat", "unpack"]

Shape = Union[Tuple[int, ...], List[int]]


def pack(tensors: Sequence, pattern: str) -> Tuple[np.ndarray, List[Shape]]:
    """Packs tensors into one along the ``*`` of ``pattern`` ("i j * k"); returns (packed, packed_shapes)."""
    return tuple(_einops_pack(list(tensors), pattern))


def unpack(tensor, packed_shapes: List[Shape], pattern: str) -> List[np.ndarray]:
    """Splits ``tensor`` along the ``*`` of ``pattern`` into arrays of the packed shapes (one may hold -1)."""
    return _einops_unpack(tensor, [list(s) for s in packed_shapes], pattern)


def parse_shape(x, pattern: str) -> dict:
    """Maps the axis names of ``pattern`` ("batch _ h w", "... c") to the lengths of x's dims."""
    return _einops_parse_shape(x, pattern)


def einsum(*tensors_and_pattern) -> np.ndarray:
    """einsum with named axes, tensors first: ``einsum(q, k, "b h q d, b h k d -> b h q k")``."""
    if len(tensors_and_pattern) <= 1:
        raise ValueError(
            "`einops.einsum` takes at minimum two arguments: the tensors (at least one), followed by the pattern."
        )
    pattern = tensors_and_pattern[-1]
    if not isinstance(pattern, str):
        raise ValueError(
            "The last argument passed to `einops.einsum` must be a string, representing the einsum pattern."
        )
    return _einops_einsum(list(tensors_and_pattern[:-1]), pattern)


def asnumpy(tensor) -> np.ndarray:
    """The tensor as a NumPy array (qkv results already are)."""
    return np.asarray(tensor)
