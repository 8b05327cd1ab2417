// Arrays <-> qkv::Tensor; see tensor_convert.h for the rules.
#include "tensor_convert.h"
#include "args.h"
#include "array_like.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/cuda.h"
#include "qkv/error.h"

namespace qkv::python {

namespace {

namespace dlpack = nb::dlpack;
using dlpack::dtype_code;

// Read-only so that read-only NumPy arrays (np.broadcast_to, frombuffer) are
// accepted too; qkv only writes into tensors it allocated. Any device: CUDA
// memory is wrapped as a tensor on cuda:N (never read on the host here).
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<nb::numpy>;

DType dtype_from_dlpack(dlpack::dtype t, const char* what) {
  const auto code = static_cast<dtype_code>(t.code);
  if (t.lanes == 1) {
    if (code == dtype_code::Float && t.bits == 32) return DType::f32;
    if (code == dtype_code::Float && t.bits == 64) return DType::f64;
    if (code == dtype_code::Float && t.bits == 16) return DType::f16;
    if (code == dtype_code::Bfloat && t.bits == 16) return DType::bf16;
    if (code == dtype_code::Int && t.bits == 8) return DType::i8;
    if (code == dtype_code::Int && t.bits == 32) return DType::i32;
    if (code == dtype_code::Int && t.bits == 64) return DType::i64;
    if (code == dtype_code::Bool && t.bits == 8) return DType::b8;
  }
  // DLPack's type codes (dlpack.h, 1.1); the narrow floats' names hold their width.
  static constexpr const char* kNames[] = {"int",
                                           "uint",
                                           "float",
                                           "opaque",
                                           "bfloat",
                                           "complex",
                                           "bool",
                                           "float8_e3m4",
                                           "float8_e4m3",
                                           "float8_e4m3b11fnuz",
                                           "float8_e4m3fn",
                                           "float8_e4m3fnuz",
                                           "float8_e5m2",
                                           "float8_e5m2fnuz",
                                           "float8_e8m0fnu",
                                           "float6_e2m3fn",
                                           "float6_e3m2fn",
                                           "float4_e2m1fn"};
  std::string name =
      t.code < std::size(kNames) ? kNames[t.code] : "of DLPack type code " + std::to_string(t.code) + " ";
  if (t.code <= static_cast<uint8_t>(dtype_code::Bool) || t.code >= std::size(kNames)) name += std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  fail<DTypeError>(what, ": dtype ", name,
                   " is not supported (qkv has float32, float64, float16, bfloat16, int8, int32, int64, bool)");
}

dlpack::dtype dtype_to_dlpack(DType t) {
  switch (t) {
    case DType::f32: return nb::dtype<float>();
    case DType::f64: return nb::dtype<double>();
    case DType::f16: return {static_cast<uint8_t>(dtype_code::Float), 16, 1};
    case DType::bf16: return nb::dtype<uint16_t>();  // exported as uint16, then viewed as bfloat16
    case DType::i8: return nb::dtype<int8_t>();
    case DType::i32: return nb::dtype<int32_t>();
    case DType::i64: return nb::dtype<int64_t>();
    case DType::b8: return nb::dtype<bool>();
  }
  fail<DTypeError>("to_numpy: invalid dtype code ", static_cast<int>(t));
}

bool is_ml_dtypes_bfloat16(nb::handle dtype) {
  return nb::cast<size_t>(dtype.attr("itemsize")) == 2 && nb::cast<std::string>(dtype.attr("name")) == "bfloat16";
}

// A NumPy array that qkv can view as is, or a copy of it that qkv can view.
nb::object normalize_numpy(nb::object array, bool& bf16) {
  nb::module_ np = numpy();
  nb::object dtype = array.attr("dtype");
  if (is_ml_dtypes_bfloat16(dtype)) {  // no DLPack code for it in NumPy: view the bits
    array = array.attr("view")(np.attr("uint16"));
    bf16 = true;
  } else if (!nb::cast<bool>(dtype.attr("isnative"))) {  // '>f4' on a little-endian machine
    array = array.attr("astype")(dtype.attr("newbyteorder")("="));
  }
  // Misaligned data (np.frombuffer at an odd offset): qkv's kernels load whole
  // elements, so they get an aligned copy (UBSan, fuzz/python/api_fuzzer.py).
  if (!nb::cast<bool>(array.attr("flags").attr("aligned"))) return np.attr("array")(array);
  const auto itemsize = nb::cast<int64_t>(array.attr("itemsize"));
  for (nb::handle s : nb::tuple(array.attr("strides"))) {
    const auto stride = nb::cast<int64_t>(s);
    // A copy, always: ascontiguousarray returns the array itself when numpy's flags call
    // it contiguous, e.g. a negative stride on a size-1 dim, which qkv does not take.
    if (stride < 0 || stride % itemsize != 0) return np.attr("array")(array, nb::arg("order") = "C");
  }
  return array;
}

std::string python_type_name(nb::handle obj) { return nb::cast<std::string>(nb::type_name(obj.type())); }

// The head of DLPack 1.0's DLManagedTensorVersioned, up to its flags (dlpack.h):
// what a "dltensor_versioned" capsule points at.
struct DLPackVersionedHead {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(void*);
  uint64_t flags;
};
constexpr uint64_t kDLPackReadOnly = uint64_t{1} << 0;  // DLPACK_FLAG_BITMASK_READ_ONLY

// True for a versioned DLPack capsule whose producer marked the memory read-only
// (an unversioned capsule cannot say so).
bool dlpack_capsule_read_only(nb::handle capsule) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) return false;
  const auto* head = static_cast<const DLPackVersionedHead*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
  return head != nullptr && (head->flags & kDLPackReadOnly) != 0;
}

// The DLPack device type of a producer's __dlpack_device__() (kDLCPU without one).
int dlpack_device_type(nb::handle src) {
  if (!nb::hasattr(src, "__dlpack_device__")) return nb::device::cpu::value;
  try {
    return nb::cast<int>(nb::tuple(src.attr("__dlpack_device__")())[0]);
  } catch (nb::python_error&) {
    return nb::device::cpu::value;  // then nanobind's import decides
  }
}

// The `stream` argument of __dlpack__ for a CUDA producer: the stream qkv queues
// its work on, so that the producer orders its pending writes before it. The
// protocol's 1 is the legacy default stream (qkv's unless a StreamGuard is alive).
nb::object consumer_stream() {
  const qkv::cuda::Stream stream = qkv::cuda::current_stream();
  return stream == nullptr ? nb::int_(1) : nb::int_(reinterpret_cast<intptr_t>(stream));
}

// A non-NumPy DLPack producer (torch, CuPy, jax, a wrapper): ask it for a versioned
// capsule, which carries the read-only flag, and let nanobind import that; a
// producer without max_version (or that refuses) is left to nanobind as before.
// A CUDA producer is always asked here, with the stream (nanobind would pass none).
// `refusal` gets the producer's own error, e.g. numpy's "BufferError: DLPack only
// supports native byte order.", for the message if nanobind cannot import it either.
nb::object dlpack_capsule_of(nb::object src, std::string& refusal) {
  const bool cuda = dlpack_device_type(src) == nb::device::cuda::value;
  nb::object dlpack = src.attr("__dlpack__");
  try {
    nb::object capsule =
        cuda ? dlpack(nb::arg("stream") = consumer_stream(), nb::arg("max_version") = nb::make_tuple(1, 0))
             : dlpack(nb::arg("max_version") = nb::make_tuple(1, 0));
    if (PyCapsule_CheckExact(capsule.ptr())) return capsule;
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) {
      refusal = python_type_name(e.value()) + ": " + nb::cast<std::string>(nb::str(e.value()));
    }  // TypeError: no max_version before DLPack 1.0
  }
  if (!cuda) return src;
  return dlpack(nb::arg("stream") = consumer_stream());  // a producer before DLPack 1.0: its error, if any
}

const char* dlpack_device_name(int type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    default: return "device";
  }
}

// A tensor on cuda:N over a CUDA DLPack array's memory, zero-copy: the storage spans
// the elements the strides reach (negative strides too) and keeps `array` alive.
Tensor device_tensor(InArray array, bool read_only, const char* what) {
  if (array.device_type() != nb::device::cuda::value) {
    fail<DeviceError>(what, ": an array on DLPack device ", dlpack_device_name(array.device_type()), " (type ",
                      array.device_type(), "):", array.device_id(),
                      " is not supported (qkv reads CPU and CUDA memory)");
  }
  const DType dtype = dtype_from_dlpack(array.dtype(), what);
  Shape shape(array.ndim());
  Strides strides(array.ndim());
  int64_t lo = 0, hi = 0;  // the lowest and highest element reached, from element [0, ..., 0]
  bool overflow = false;
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(array.shape(i));
    strides[i] = array.stride(i);
    int64_t extent = 0;
    if (shape[i] > 0) {
      overflow = overflow || __builtin_mul_overflow(shape[i] - 1, strides[i], &extent) ||
                 __builtin_add_overflow(extent < 0 ? lo : hi, extent, extent < 0 ? &lo : &hi);
    }
  }
  const int64_t numel = shape_numel(shape);
  int64_t span = 0;
  const auto itemsize = static_cast<int64_t>(qkv::itemsize(dtype));
  if (numel > 0 && (overflow || __builtin_sub_overflow(hi, lo, &span) || __builtin_add_overflow(span, 1, &span) ||
                    __builtin_mul_overflow(span, itemsize, &span))) {
    fail<ShapeError>(what, ": a CUDA array of shape ", shape_str(shape), " strides ", shape_str(strides),
                     " addresses more bytes than fit in 64 bits");
  }
  auto* first = static_cast<std::byte*>(const_cast<void*>(array.data()));  // byte_offset included
  std::byte* base = numel > 0 ? first + lo * itemsize : first;
  const int device = array.device_id();
  auto keep_alive = std::make_shared<InArray>(std::move(array));  // holds the capsule's producer
  auto storage = Storage::wrap(base, static_cast<size_t>(numel > 0 ? span : 0), std::move(keep_alive), read_only,
                               Device::cuda(device));
  return Tensor::view_of(std::move(storage), dtype, shape, strides, numel > 0 ? -lo : 0);
}

// NumPy refuses an array whose itemsize times its non-zero dims passes 2^63 - 1
// ("array is too big"), even when another dim is 0, and nanobind's buffer export
// multiplies those dims unchecked first (signed overflow under UBSan: the api_python
// fuzzer's unpack to [2^62, 0]). Such a result gets a qkv error instead.
void check_numpy_size(const Tensor& t) {
  int64_t bytes = static_cast<int64_t>(t.itemsize());
  for (const int64_t d : t.shape()) {
    if (d != 0 && __builtin_mul_overflow(bytes, d, &bytes))
      fail<ShapeError>("to_numpy: a ", dtype_name(t.dtype()), " result of shape ", shape_str(t.shape()),
                       " is too big for NumPy (itemsize times the non-zero dims passes 2^63 - 1)");
  }
}

// A torch tensor with its negative bit set (a lazy negation: x.conj().imag, x._neg_view())
// exports its memory through DLPack without the negation, so torch.from_dlpack and
// np.from_dlpack read the values negated back; qkv takes torch's resolved copy instead.
nb::object resolve_torch_negation(nb::object src) {
  if (is_torch(src) && nb::hasattr(src, "is_neg") && nb::cast<bool>(src.attr("is_neg")())) {
    return src.attr("resolve_neg")();
  }
  return src;
}

// A CPU tensor over an imported array's memory, keeping the array (and so the Python
// object) alive; nanobind takes the GIL itself when the last reference goes.
Tensor host_tensor(InArray array, DType dtype, bool read_only) {
  Shape shape(array.ndim());
  Strides strides(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(array.shape(i));
    strides[i] = array.stride(i);
  }
  void* data = const_cast<void*>(array.data());
  auto keep_alive = std::make_shared<InArray>(std::move(array));
  return Tensor::from_blob(data, shape, dtype, strides, std::move(keep_alive), read_only);
}

bool needs_copy(const InArray& array, DType dtype) {
  if (reinterpret_cast<uintptr_t>(array.data()) % qkv::itemsize(dtype) != 0) return true;
  for (size_t i = 0; i < array.ndim(); ++i) {
    if (array.stride(i) < 0) return true;
  }
  return false;
}

// A C-contiguous, aligned copy of a CPU array, made by NumPy from a view of its memory
// (which works for any producer, a bare capsule too; bfloat16 travels as its uint16 bits).
InArray aligned_copy(InArray array, DType dtype) {
  std::vector<size_t> shape(array.ndim());
  std::vector<int64_t> strides(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) {
    shape[i] = array.shape(i);
    strides[i] = array.stride(i);
  }
  const void* data = array.data();
  auto* holder = new InArray(std::move(array));
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<InArray*>(p); });
  const nb::object view = nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), owner, strides.data(),
                                                         dtype_to_dlpack(dtype), nb::device::cpu::value)
                              .cast();
  InArray copy;
  if (!nb::try_cast(numpy().attr("array")(view, nb::arg("order") = "C"), copy, /*convert=*/false)) {
    fail<DTypeError>("to_tensor: NumPy's copy of a ", dtype_name(dtype), " array could not be read back");
  }
  return copy;
}

// More dims than NumPy takes: nanobind's export then made a 0-d array of a 65-dim
// result (and aborted the interpreter on a 10,000-dim .safetensors entry).
void check_numpy_dims(const Tensor& t) {
  const int64_t max_dims = numpy_max_dims();
  if (t.dim() > max_dims) {
    fail<ShapeError>("to_numpy: a ", dtype_name(t.dtype()), " result with ", t.dim(),
                     " dims cannot become a NumPy array (NumPy ", nb::cast<std::string>(numpy().attr("__version__")),
                     " takes at most ", max_dims, ")");
  }
}

}  // namespace

int64_t numpy_max_dims() {
  static int64_t max_dims = 0;  // NPY_MAXDIMS: 32 before NumPy 2.0, 64 since
  if (max_dims == 0) {
    const std::string version = nb::cast<std::string>(numpy().attr("__version__"));
    max_dims = version.rfind("1.", 0) == 0 ? 32 : 64;
  }
  return max_dims;
}

nb::module_ numpy() {
  static nb::module_* np = nullptr;  // leaked on purpose: outlives the interpreter's teardown order
  if (np == nullptr) np = new nb::module_(nb::module_::import_("numpy"));
  return *np;
}

Tensor to_tensor(nb::handle obj, const char* what) {
  nb::module_ np = numpy();
  nb::object src = nb::borrow(obj);
  bool bf16 = false;
  std::string refusal;  // a DLPack producer's own error
  if (nb::isinstance(src, np.attr("ndarray"))) {
    src = normalize_numpy(std::move(src), bf16);
  } else if (nb::hasattr(src, "__dlpack__")) {
    src = dlpack_capsule_of(resolve_torch_negation(std::move(src)), refusal);
  } else if (!PyCapsule_CheckExact(src.ptr())) {
    // Lists, scalars, objects with __array__ or the buffer protocol: numpy's rules.
    nb::object converted;
    try {
      converted = np.attr("asarray")(src);
    } catch (nb::python_error&) {
      fail<DTypeError>(what, ": expected an array (NumPy, DLPack or array-like), got ", python_type_name(obj));
    }
    src = normalize_numpy(std::move(converted), bf16);
  }
  // Read-only memory (np.load(mmap_mode='r'), writeable=False, np.asarray of bytes,
  // a read-only DLPack tensor) gives a read-only Tensor: its views stay read-only.
  const bool read_only = nb::isinstance(src, np.attr("ndarray")) ? !nb::cast<bool>(src.attr("flags").attr("writeable"))
                                                                 : dlpack_capsule_read_only(src);

  InArray array;
  if (!nb::try_cast(src, array, /*convert=*/false)) {
    std::string detail = python_type_name(obj);
    if (nb::hasattr(src, "dtype")) {
      const nb::object dtype = src.attr("dtype");
      detail += " of dtype " + nb::cast<std::string>(nb::str(nb::handle(dtype)));  // str(), not a cast
    }
    if (!refusal.empty()) detail += " (its __dlpack__ refused: " + refusal + ")";
    fail<DTypeError>(what, ": expected an array (NumPy or DLPack, CPU or CUDA) of a dtype qkv supports, got ", detail);
  }
  if (array.device_type() != nb::device::cpu::value) return device_tensor(std::move(array), read_only, what);
  const DType dtype = bf16 ? DType::bf16 : dtype_from_dlpack(array.dtype(), what);
  // DLPack producers may export what NumPy arrays never reach here with: negative
  // strides, or data not aligned to the itemsize (torch.frombuffer at an odd offset).
  if (needs_copy(array, dtype)) return host_tensor(aligned_copy(std::move(array), dtype), dtype, false);
  return host_tensor(std::move(array), dtype, read_only);
}

std::optional<Tensor> to_optional_tensor(nb::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return to_tensor(obj, what);
}

namespace {

// A capsule owning a reference to t's storage: what keeps qkv's memory alive in an array.
// GPU memory goes back to qkv's pool on the stream it was allocated on (qkv/cuda.h),
// but the consumer may still read it on streams of its own (a torch side stream):
// the last reference is dropped only after the device's work, as cudaFree would.
nb::capsule storage_owner(const Tensor& t) {
  auto* holder = new std::shared_ptr<Storage>(t.storage());
  if (t.device().kind != DeviceKind::cuda) {
    return nb::capsule(holder, [](void* p) noexcept { delete static_cast<std::shared_ptr<Storage>*>(p); });
  }
  return nb::capsule(holder, [](void* p) noexcept {
    auto* storage = static_cast<std::shared_ptr<Storage>*>(p);
    if (storage->use_count() == 1) {
      // Without the GIL while the device drains: a host callback queued on a stream
      // (CuPy's launch_host_func) may need it to finish.
#if PY_VERSION_HEX >= 0x030D0000
      const bool finalizing = Py_IsFinalizing() != 0;
#else
      const bool finalizing = _Py_IsFinalizing() != 0;
#endif
      PyThreadState* released = PyGILState_Check() != 0 && !finalizing ? PyEval_SaveThread() : nullptr;
      try {
        qkv::cuda::synchronize_device((*storage)->device().index);
      } catch (...) {  // a failed kernel before: the memory is freed all the same
      }
      if (released != nullptr) PyEval_RestoreThread(released);
    }
    delete storage;
  });
}

template <class... Config>
nb::object cuda_array(const Tensor& t) {
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  const dlpack::dtype dtype = t.dtype() == DType::bf16 ? dlpack::dtype{static_cast<uint8_t>(dtype_code::Bfloat), 16, 1}
                                                       : dtype_to_dlpack(t.dtype());
  return nb::ndarray<Config...>(t.raw_data(), shape.size(), shape.data(), storage_owner(t), t.strides().data(), dtype,
                                nb::device::cuda::value, t.device().index)
      .cast();
}

}  // namespace

nb::object to_cuda_array(const Tensor& t, bool torch) {
  if (t.device().kind != DeviceKind::cuda) {
    fail<DeviceError>("to_cuda_array: a tensor on ", t.device().to_string(), " is not on a CUDA device");
  }
  if (torch) {
    nb::object out = cuda_array<nb::pytorch>(t);
    // torch tensors are always writable: a read-only result is copied (on the device, by torch).
    return t.is_read_only() ? out.attr("clone")() : out;
  }
  return t.is_read_only() ? cuda_array<nb::ro, nb::array_api>(t) : cuda_array<nb::array_api>(t);
}

nb::object to_numpy(const Tensor& t) {
  if (!t.device().is_cpu()) {
    fail<DeviceError>("qkv: a result on ", t.device().to_string(),
                      " cannot become a NumPy array (NumPy reads host memory); this function returns NumPy "
                      "arrays, so it takes CPU inputs only");
  }
  check_numpy_dims(t);
  check_numpy_size(t);
  // The capsule owns a reference to the storage; NumPy keeps the capsule.
  nb::capsule owner = storage_owner(t);
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  OutArray array(t.raw_data(), shape.size(), shape.data(), owner, t.strides().data(), dtype_to_dlpack(t.dtype()),
                 nb::device::cpu::value);
  nb::object result = array.cast();
  if (t.dtype() == DType::bf16) {
    nb::object ml_dtypes;
    try {
      ml_dtypes = nb::module_::import_("ml_dtypes");
    } catch (nb::python_error&) {
      fail<DTypeError>(
          "bfloat16 results need the ml_dtypes package (pip install ml_dtypes; "
          "or pip install qkv[bfloat16])");
    }
    result = result.attr("view")(ml_dtypes.attr("bfloat16"));
  }
  if (t.is_read_only()) nb::setattr(result.attr("flags"), "writeable", nb::bool_(false));
  return result;
}

std::map<std::string, Tensor> to_tensor_map(nb::handle d, const std::string& op) {
  std::map<std::string, Tensor> out;
  for (auto [key, value] : nb::borrow<nb::dict>(d)) {
    const std::string name = str_arg(key, op + ": tensor name");
    out.emplace(name, to_tensor(value, (op + ": " + name).c_str()));
  }
  return out;
}

nb::dict to_dict(const std::map<std::string, Tensor>& tensors) {
  nb::dict out;
  for (const auto& [name, t] : tensors) out[nb::str(name.c_str(), name.size())] = to_numpy(t);
  return out;
}

}  // namespace qkv::python
