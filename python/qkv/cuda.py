"""qkv.cuda: the CUDA backend's runtime, as ``torch.cuda`` names it.

qkv's functions take CUDA arrays (torch CUDA tensors, CuPy, JAX on a GPU: any
DLPack producer whose ``__dlpack_device__()`` is CUDA) zero-copy and give their
results on the same device, zero-copy: torch tensors for torch inputs, else arrays
with ``__dlpack__`` (docs/python.md, "CUDA tensors"). What runs on the GPU:
``scaled_dot_product_attention`` on bfloat16/float16 inputs (docs/cuda.md); other
functions raise RuntimeError naming the device.

- ``is_built()``: this qkv has the CUDA backend (whether or not a GPU is present).
- ``device_count()`` / ``is_available()``: the GPUs the CUDA runtime sees.
- ``get_device_properties(device)``: name, compute capability, memory, ...
- ``synchronize(device)``: waits for the work qkv queued (the legacy default stream).
"""

from __future__ import annotations

from typing import NamedTuple

from ._qkv import cuda as _c


class DeviceProperties(NamedTuple):
    """What ``get_device_properties`` reports of one GPU (qkv::cuda::DeviceProperties)."""

    name: str  # "NVIDIA H100 80GB HBM3"
    major: int  # compute capability (9.0 on Hopper)
    minor: int
    multiprocessors: int
    total_memory: int  # bytes
    l2_cache_bytes: int
    shared_memory_per_block_optin: int  # the most shared memory a block may ask for
    driver_version: int  # CUDA driver API version, e.g. 13000
    runtime_version: int  # the CUDA runtime qkv was linked with


def _index(device) -> int:
    """The N of an int N, "cuda:N", "cuda" (0) or a torch.device("cuda", N)."""
    if hasattr(device, "type") and hasattr(device, "index"):  # torch.device, without importing torch
        if device.type != "cuda":
            raise ValueError(f"qkv.cuda: expected a CUDA device, got {device}")
        return 0 if device.index is None else int(device.index)
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            raise ValueError(f"qkv.cuda: expected 'cuda' or 'cuda:N', got {device!r}")
        return int(index or 0)
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"qkv.cuda: device must be an int, 'cuda:N' or a torch.device, got {type(device).__name__}")
    return device


def is_built() -> bool:
    """True when this qkv was built with the CUDA backend (QKV_CUDA; whether or not a GPU is present)."""
    return bool(_c.is_built())


def device_count() -> int:
    """The number of GPUs the CUDA runtime sees (0 without the backend, a driver or a GPU)."""
    return int(_c.device_count())


def is_available() -> bool:
    """True when qkv can run on a GPU: device_count() > 0."""
    return device_count() > 0


def get_device_properties(device=0) -> DeviceProperties:
    """Properties of cuda:<device>; RuntimeError naming the index when there is no such GPU."""
    return DeviceProperties(**_c.get_device_properties(_index(device)))


def synchronize(device=0) -> None:
    """Waits until the work qkv queued on cuda:<device> has finished (RuntimeError with CUDA's text
    if a kernel failed; also RuntimeError without the backend)."""
    _c.synchronize(_index(device))


def empty_cache(device=0) -> None:
    """Returns the memory qkv keeps cached on cuda:<device> (freed tensors' blocks) to the device,
    after waiting for its work, as ``torch.cuda.empty_cache`` does."""
    _c.empty_cache(_index(device))


def memory_allocated(device=0) -> int:
    """Bytes of cuda:<device> in live qkv tensors (0 with plain allocations: QKV_CUDA_ALLOC=plain)."""
    return int(_c.memory_stats(_index(device))["allocated"])


def memory_reserved(device=0) -> int:
    """Bytes qkv's memory pool holds on cuda:<device>: live tensors and cached blocks."""
    return int(_c.memory_stats(_index(device))["reserved"])
