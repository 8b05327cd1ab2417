// qkv.load, qkv.save, qkv.inspect: .npy and .safetensors files (qkv/io.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "args.h"
#include "interrupt.h"
#include "qkv/ascii.h"
#include "qkv/device.h"
#include "qkv/io.h"
#include "tensor_convert.h"

namespace nb = nanobind;
namespace fs = std::filesystem;
using qkv::python::to_numpy;
using qkv::python::to_tensor;

namespace {

// A name as Python str: UTF-8, with surrogate escapes for other bytes (os.fsdecode),
// e.g. a .npy file's stem that is not UTF-8 (nb::str raised 'conversion error').
nb::object name_str(const std::string& name) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  if (s == nullptr) throw nb::python_error();
  return nb::steal(s);
}

// Runs `read` without the GIL; an IOError on a path that does not exist becomes
// FileNotFoundError (errno ENOENT, qkv's message, the path), as open() raises.
template <class Fn>
auto read_file(const fs::path& path, Fn&& read) {
  try {
    qkv::python::InterruptibleRelease release;
    return read();
  } catch (const qkv::IOError& e) {
    std::error_code ec;
    if (fs::exists(path, ec) || ec) throw;
    nb::object error = nb::handle(PyExc_FileNotFoundError)(ENOENT, name_str(e.what()), name_str(path.string()));
    PyErr_SetObject(PyExc_FileNotFoundError, error.ptr());
    throw nb::python_error();
  }
}

nb::dict load(nb::handle path_arg) {
  const fs::path path = qkv::python::path_arg(path_arg, "load: path");
  const std::map<std::string, qkv::Tensor> tensors = read_file(path, [&] { return qkv::io::load(path); });
  for (const auto& [name, tensor] : tensors) {
    if (tensor.dim() > qkv::python::numpy_max_dims()) {
      qkv::fail<qkv::ShapeError>("load: ", path.string(), ": tensor '", name, "' has ", tensor.dim(),
                                 " dims; a NumPy array has at most ", qkv::python::numpy_max_dims());
    }
  }
  nb::dict out;
  for (const auto& [name, tensor] : tensors) out[name_str(name)] = to_numpy(tensor);
  return out;
}

void save(nb::handle path_arg, nb::handle arrays, nb::handle metadata_arg) {
  const fs::path path = qkv::python::path_arg(path_arg, "save: path");
  const auto metadata = qkv::python::str_dict_arg(metadata_arg, "save: metadata");
  std::map<std::string, qkv::Tensor> tensors;
  if (nb::isinstance<nb::dict>(arrays)) {
    for (auto [key, value] : nb::borrow<nb::dict>(arrays)) {
      if (!nb::isinstance<nb::str>(key)) {
        qkv::fail<qkv::DTypeError>("save: tensor names must be str, got ", nb::cast<std::string>(nb::repr(key)));
      }
      const std::string name = qkv::python::str_arg(key, "save: tensor name");
      tensors.emplace(name, to_tensor(value, ("save: " + name).c_str()));
    }
  } else {  // one array: the natural call for .npy
    tensors.emplace(path.stem().string(), to_tensor(arrays, "save: array"));
  }
  const bool safetensors = qkv::lower_extension(path) == ".safetensors";  // any case, as io::save picks the format
  if (metadata && !safetensors) {
    qkv::fail<qkv::ValueError>("save: metadata needs a .safetensors file, got ", path.string());
  }
  // GPU arrays are copied to the host by the writers (qkv::io), as torch.save would.
  qkv::python::InterruptibleRelease release;
  if (metadata) {
    qkv::io::save_safetensors(path, tensors, *metadata);
  } else {
    qkv::io::save(path, tensors);
  }
}

nb::list inspect(nb::handle path_arg) {
  const fs::path path = qkv::python::path_arg(path_arg, "inspect: path");
  const std::vector<qkv::io::TensorInfo> infos = read_file(path, [&] { return qkv::io::inspect(path); });
  nb::list out;
  for (const qkv::io::TensorInfo& info : infos) {
    nb::list shape;
    for (int64_t d : info.shape) shape.append(d);
    out.append(nb::make_tuple(name_str(info.key), info.dtype, nb::tuple(shape)));
  }
  return out;
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def("load", &load, nb::arg("path").none(),
        nb::sig("def load(path: str | os.PathLike[str]) -> dict[str, numpy.ndarray]"),
        "Reads every tensor of a .npy file (one, named after the file stem), a\n"
        ".safetensors file, a Keras .h5 / .weights.h5 / .keras file or a TensorFlow\n"
        "checkpoint into a dict of NumPy arrays, in name order.\n\n"
        "The arrays are views into one qkv buffer holding the file (no further copy).\n"
        "bfloat16 tensors come back as ml_dtypes.bfloat16 arrays. Errors: FileNotFoundError,\n"
        "OSError, ValueError for a malformed file (the message names the file and the\n"
        "fault), TypeError for a .npy or .safetensors tensor of a dtype qkv has no type for;\n"
        "a Keras or TensorFlow file's entries of such dtypes (uint8, strings) are left out\n"
        "(qkv.inspect lists them).");
  m.def("save", &save, nb::arg("path").none(), nb::arg("arrays").none(), nb::arg("metadata").none() = nb::none(),
        nb::sig("def save(path: str | os.PathLike[str], arrays: dict[str, numpy.typing.ArrayLike] | "
                "numpy.typing.ArrayLike, metadata: dict[str, str] | None = None) -> None"),
        "Writes arrays to path, by extension: .npy takes exactly one array (a dict with one\n"
        "entry, or the array itself), .safetensors any number, plus optional string metadata\n"
        "(the __metadata__ entry). The bytes are those np.save and safetensors write.\n"
        ".h5 writes a Keras 3 style weights file (datasets at the names' paths) and\n"
        "PREFIX.index a TensorFlow checkpoint (PREFIX.index + PREFIX.data-00000-of-00001,\n"
        "names as keys) that tf.train.load_checkpoint reads.\n"
        "Arrays are read in place (NumPy or DLPack, no copy).");
  m.def("inspect", &inspect, nb::arg("path").none(),
        nb::sig("def inspect(path: str | os.PathLike[str]) -> list[tuple[str, str, tuple[int, ...]]]"),
        "Lists (name, dtype, shape) of every tensor of a .npy or .safetensors file without\n"
        "reading the data; dtypes are numpy's names where qkv knows them, the file's own\n"
        "otherwise.");
}
