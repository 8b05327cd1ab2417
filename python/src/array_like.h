// The array type of results: one rule for every function of the package.
//
// A result has the array type of the call's first array argument: a torch tensor in
// gives torch tensors out, anything else (NumPy, lists, other DLPack producers)
// NumPy arrays. torch results share qkv's memory through DLPack (no copy); two
// exceptions copy, because torch has neither: a read-only result (a view of a
// read-only input) and bfloat16 results (NumPy cannot export ml_dtypes' bfloat16
// through DLPack, so its bits travel as uint16 and are viewed back, still no copy).
//
// A result on a CUDA device (from CUDA inputs) stays there, zero-copy: a torch
// CUDA tensor when the first array argument is a torch tensor, else an array with
// __dlpack__ / __dlpack_device__ (tensor_convert.h's to_cuda_array) that
// cupy.from_dlpack, jax.dlpack.from_dlpack or torch.from_dlpack take as is.
#pragma once

#include <nanobind/nanobind.h>

#include "qkv/tensor.h"

namespace qkv::python {

namespace nb = nanobind;

// Whether obj is a torch.Tensor (checked by module name: torch is never imported here).
bool is_torch(nb::handle obj);

// `t` as the array type of `like` (see above).
nb::object to_array_like(const Tensor& t, nb::handle like);

// A NumPy result (or None) converted to the array type of `like`.
nb::object numpy_like(nb::object array, nb::handle like);

}  // namespace qkv::python
