// qkv._qkv.cuda: the CUDA backend's runtime (qkv/cuda.h) for python/qkv/cuda.py, and
// two test hooks of the CUDA DLPack conversion (tensor_convert.h). A build without the
// backend has the same functions: is_built() False, device_count() 0.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>

#include "args.h"
#include "array_like.h"
#include "qkv/cuda.h"
#include "tensor_convert.h"

namespace nb = nanobind;

namespace {

int device_arg(nb::handle index, const char* op) {
  return static_cast<int>(qkv::python::int_arg(index, (std::string(op) + ": device").c_str(), 0, INT_MAX));
}

nb::dict properties(nb::handle index) {
  const qkv::cuda::DeviceProperties p = qkv::cuda::properties(device_arg(index, "get_device_properties"));
  nb::dict d;
  d["name"] = p.name;
  d["major"] = p.major;
  d["minor"] = p.minor;
  d["multiprocessors"] = p.multiprocessors;
  d["total_memory"] = p.total_memory;
  d["l2_cache_bytes"] = p.l2_cache_bytes;
  d["shared_memory_per_block_optin"] = p.shared_memory_per_block_optin;
  d["driver_version"] = p.driver_version;
  d["runtime_version"] = p.runtime_version;
  return d;
}

// What to_tensor made of `array`: where it lives and its geometry, without reading it.
nb::dict describe(nb::handle array) {
  const qkv::Tensor t = qkv::python::to_tensor(array, "_describe");
  nb::dict d;
  d["device"] = t.device().to_string();
  d["data_ptr"] = reinterpret_cast<uintptr_t>(t.raw_data());
  d["dtype"] = std::string(qkv::dtype_name(t.dtype()));
  d["shape"] = nb::tuple(nb::cast(t.shape()));  // stl/vector.h: a list, made a tuple
  d["strides"] = nb::tuple(nb::cast(t.strides()));
  d["read_only"] = t.is_read_only();
  d["storage_bytes"] = t.storage()->nbytes();
  return d;
}

}  // namespace

void bind_cuda(nb::module_& m) {
  nb::module_ c = m.def_submodule("cuda", "The CUDA backend's runtime (qkv/cuda.h; python/qkv/cuda.py wraps it).");
  c.def("is_built", &qkv::cuda::built, "True when this qkv has the CUDA backend (whether or not a GPU is present).");
  c.def("device_count", &qkv::cuda::device_count,
        "The number of GPUs the CUDA runtime sees (0 without the backend, a driver or a GPU).");
  c.def("get_device_properties", &properties, nb::arg("device").none() = 0,
        nb::sig("def get_device_properties(device: int = 0) -> dict[str, typing.Any]"),
        "Properties of cuda:<device> as a dict; RuntimeError naming the index when there is no such GPU.");
  c.def(
      "synchronize",
      [](nb::handle device) {
        const int index = device_arg(device, "synchronize");
        nb::gil_scoped_release release;
        qkv::cuda::synchronize(index);
      },
      nb::arg("device").none() = 0, nb::sig("def synchronize(device: int = 0) -> None"),
      "Waits for the work qkv queued on cuda:<device> (the legacy default stream); RuntimeError with\n"
      "the CUDA error text when a kernel before it failed.");
  c.def(
      "empty_cache",
      [](nb::handle device) {
        const int index = device_arg(device, "empty_cache");
        nb::gil_scoped_release release;
        qkv::cuda::empty_cache(index);
      },
      nb::arg("device").none() = 0, nb::sig("def empty_cache(device: int = 0) -> None"),
      "Returns cuda:<device>'s cached, unused memory to the device after waiting for its work.");
  c.def(
      "memory_stats",
      [](nb::handle device) {
        const qkv::cuda::MemoryStats s = qkv::cuda::memory_stats(device_arg(device, "memory_stats"));
        nb::dict d;
        d["caching"] = s.caching;
        d["allocated"] = s.allocated;
        d["reserved"] = s.reserved;
        return d;
      },
      nb::arg("device").none() = 0, nb::sig("def memory_stats(device: int = 0) -> dict[str, typing.Any]"),
      "Bytes of cuda:<device>'s memory pool: allocated (live tensors), reserved (live and cached).");
  c.def("_describe", &describe, nb::arg("array").none(),
        nb::sig("def _describe(array: typing.Any) -> dict[str, typing.Any]"),
        "Test hook: the qkv::Tensor an array becomes (device, data_ptr, dtype, shape, strides in\n"
        "elements, read_only, storage_bytes), zero-copy and without reading its elements.");
  c.def(
      "_roundtrip",
      [](nb::handle array) { return qkv::python::to_array_like(qkv::python::to_tensor(array, "_roundtrip"), array); },
      nb::arg("array").none(), nb::sig("def _roundtrip(array: typing.Any) -> typing.Any"),
      "Test hook: array -> qkv::Tensor -> the array type of the input, as a result would be.");
}
