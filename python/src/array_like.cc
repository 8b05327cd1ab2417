// The array-type rule of array_like.h.
#include "array_like.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "qkv/cuda.h"
#include "tensor_convert.h"

namespace qkv::python {

bool is_torch(nb::handle obj) {
  nb::handle type = obj.type();
  if (!nb::hasattr(type, "__module__")) return false;
  const std::string module = nb::cast<std::string>(nb::str(type.attr("__module__")));
  return module == "torch" || module.rfind("torch.", 0) == 0;
}

nb::object numpy_like(nb::object array, nb::handle like) {
  if (array.is_none() || !is_torch(like)) return array;
  nb::module_ np = numpy();
  nb::module_ torch = nb::module_::import_("torch");
  // torch tensors are always writable: never hand out one over read-only memory.
  if (!nb::cast<bool>(array.attr("flags").attr("writeable"))) array = np.attr("array")(array);
  const nb::object dtype = array.attr("dtype");
  if (nb::cast<std::string>(nb::str(dtype.attr("name"))) == "bfloat16") {
    return torch.attr("from_dlpack")(array.attr("view")(np.attr("uint16"))).attr("view")(torch.attr("bfloat16"));
  }
  return torch.attr("from_dlpack")(array);
}

namespace {

// A result on cuda:N for torch: qkv queued it on the legacy default stream, which
// torch's default stream is; a torch side stream (torch.cuda.stream(s), created
// non-blocking) does not wait for that stream by itself, so it is told to (on the
// device; the host does not wait).
nb::object torch_cuda_result(const Tensor& t) {
  nb::object out = to_cuda_array(t, /*torch=*/true);
  if (qkv::cuda::current_stream() != nullptr) return out;
  nb::object cuda = nb::module_::import_("torch").attr("cuda");
  nb::object current = cuda.attr("current_stream")(t.device().index);
  if (nb::cast<intptr_t>(current.attr("cuda_stream")) != 0) {
    current.attr("wait_stream")(cuda.attr("default_stream")(t.device().index));
  }
  return out;
}

}  // namespace

nb::object to_array_like(const Tensor& t, nb::handle like) {
  if (t.device().kind == DeviceKind::cuda) return is_torch(like) ? torch_cuda_result(t) : to_cuda_array(t, false);
  return numpy_like(to_numpy(t), like);
}

}  // namespace qkv::python
