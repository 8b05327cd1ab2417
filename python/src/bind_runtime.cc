// Threads, version, and the conversion test hook.
#include <nanobind/nanobind.h>

#include "qkv/parallel.h"
#include "tensor_convert.h"

namespace nb = nanobind;

void bind_runtime(nb::module_& m) {
  m.attr("__version__") = QKV_VERSION;

  m.def("set_num_threads", &qkv::set_num_threads, nb::arg("n"),
        "Sets the number of threads qkv's kernels use (n >= 1; ValueError otherwise).\n\n"
        "Global to the process, as torch.set_num_threads. The initial value comes from\n"
        "QKV_NUM_THREADS, else OMP_NUM_THREADS, else the number of cores.");
  m.def("get_num_threads", &qkv::get_num_threads, "The number of threads qkv's kernels use.");

  m.def(
      "_roundtrip",
      [](nb::handle array) { return qkv::python::to_numpy(qkv::python::to_tensor(array, "_roundtrip")); },
      nb::arg("array"), nb::sig("def _roundtrip(array: numpy.typing.ArrayLike) -> numpy.ndarray"),
      "Test hook: array -> qkv::Tensor -> NumPy array, copying only where to_tensor must.");
}
