// Arrays <-> qkv::Tensor at the Python boundary, without copying where possible.
//
// Python -> C++: a NumPy array, a DLPack capsule or any object with __dlpack__
// (a torch tensor, ...) on the CPU becomes a Tensor over the same memory
// (Tensor::from_blob); the Tensor keeps the Python object alive. Copied instead:
// arrays (NumPy or DLPack) with negative strides or data not aligned to the
// itemsize, NumPy arrays with strides that are not a multiple of the itemsize or
// non-native byte order, and torch tensors with the negative bit set (torch's DLPack
// export leaves the negation out). Other objects (lists, scalars) go through
// numpy.asarray. ml_dtypes.bfloat16 arrays are read as bf16. A producer whose
// __dlpack__ refuses (numpy: big-endian data) is a TypeError that quotes its refusal.
//
// C++ -> Python: a NumPy array over the Tensor's storage (same strides, no
// copy) that keeps the storage alive; bf16 gives an ml_dtypes.bfloat16 array.
//
// CUDA: an object whose __dlpack_device__() is kDLCUDA (a torch CUDA tensor, CuPy,
// JAX on a GPU) or such a capsule becomes a Tensor on cuda:<device_id> over the same
// device memory (Storage::wrap; never read on the host here), keeping the capsule
// and so the producer's memory alive. The producer is asked with
// __dlpack__(stream=1), the legacy default stream qkv queues its work on, so that
// its pending writes are ordered before qkv reads. Such tensors come back through
// to_cuda_array (array_like.h); to_numpy refuses them (DeviceError), so functions
// that return NumPy arrays give a clear error for CUDA inputs instead of reading
// device memory on the host.
//
// Read-only stays read-only: a NumPy array with writeable=False (np.load with
// mmap_mode='r', np.broadcast_to, ...) or a DLPack tensor flagged read-only
// (versioned capsules, DLPack 1.0) becomes a read-only Tensor, and every view
// of it comes back as a NumPy array with writeable=False.
//
// Every binding converts with these; they hold the GIL (call them outside
// nb::gil_scoped_release).
#pragma once

#include <nanobind/nanobind.h>

#include <map>
#include <optional>
#include <string>

#include "qkv/tensor.h"

namespace qkv::python {

namespace nb = nanobind;

// `what` names the argument in error messages, e.g. "attention_reference: q".
// TypeError (via DTypeError) for objects that are not arrays and for dtypes qkv lacks.
Tensor to_tensor(nb::handle obj, const char* what);
// None -> nullopt, otherwise to_tensor.
std::optional<Tensor> to_optional_tensor(nb::handle obj, const char* what);

// A NumPy array viewing `t` (shares memory; writeable=False when t is read-only).
// DeviceError for a tensor that is not on the CPU; ShapeError for one with more dims
// than NumPy takes (numpy_max_dims) or more bytes than it can address.
nb::object to_numpy(const Tensor& t);

// A tensor on cuda:N as a DLPack array on the device, sharing its memory and keeping
// its storage alive: a torch.Tensor when `torch` (a read-only tensor is cloned by
// torch, whose tensors are always writable), else nanobind's ndarray, which has
// __dlpack__ and __dlpack_device__ (torch/CuPy/JAX from_dlpack take it zero-copy).
nb::object to_cuda_array(const Tensor& t, bool torch);

// A dict {name: array} as tensors (errors name `op` and the key), and back as NumPy arrays.
std::map<std::string, Tensor> to_tensor_map(nb::handle d, const std::string& op);
nb::dict to_dict(const std::map<std::string, Tensor>& tensors);

// NumPy's most dims per array (NPY_MAXDIMS: 32 before NumPy 2.0, 64 since).
int64_t numpy_max_dims();

// numpy, imported once (lazily: importing _qkv does not import numpy).
nb::module_ numpy();

}  // namespace qkv::python
