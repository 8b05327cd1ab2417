// Threads, version, and the conversion test hook.
#include <nanobind/nanobind.h>

#include <climits>

#include "args.h"
#include "array_like.h"
#include "qkv/parallel.h"
#include "tensor_convert.h"

namespace nb = nanobind;

void bind_runtime(nb::module_& m) {
  m.attr("__version__") = QKV_VERSION;

  m.def(
      "set_num_threads",
      [](nb::handle n) {
        qkv::set_num_threads(static_cast<int>(qkv::python::int_arg(n, "set_num_threads: n", INT_MIN, INT_MAX)));
      },
      nb::arg("n").none(), nb::sig("def set_num_threads(n: int) -> None"),
      "Sets the number of threads qkv's kernels use (n >= 1; ValueError otherwise).\n\n"
      "Global to the process, as torch.set_num_threads. The initial value comes from\n"
      "QKV_NUM_THREADS, else OMP_NUM_THREADS, else the number of cores.");
  m.def("get_num_threads", &qkv::get_num_threads, "The number of threads qkv's kernels use.");

  m.def(
      "_roundtrip", [](nb::handle array) { return qkv::python::to_numpy(qkv::python::to_tensor(array, "_roundtrip")); },
      nb::arg("array"), nb::sig("def _roundtrip(array: numpy.typing.ArrayLike) -> numpy.ndarray"),
      "Test hook: array -> qkv::Tensor -> NumPy array, copying only where to_tensor must.");
  m.def("_array_like", &qkv::python::numpy_like, nb::arg("array").none(), nb::arg("like").none(),
        nb::sig("def _array_like(array: numpy.ndarray | None, like: typing.Any) -> typing.Any"),
        "The NumPy result `array` in the array type of `like` (torch in, torch out; python/src/array_like.h).");
}
