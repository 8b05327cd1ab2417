// qkv::Tensor: an n-dimensional strided view over shared, 64-byte-aligned storage.
//
// A Tensor is cheap to copy (it shares storage). Views (permute, slice, expand,
// reshape when strides allow) share storage with their source; contiguous(),
// clone() and to() copy. Strides and offsets count elements, not bytes.
// Misuse throws a qkv::Error subclass whose message names the op and shapes.
// Sizes are checked (qkv/size.h): a tensor too large to allocate is an
// OutOfMemoryError naming the operation, the shapes and the bytes.
//
// Read-only storage (a wrapped buffer the owner does not let us write: a NumPy
// array with writeable=False, a read-only DLPack tensor, a read-only mmap) stays
// read-only in every view of it; set_item, fill, copy_from and at<T> (non-const T)
// on such a tensor are a ValueError. data<T>() and raw_data() are raw access: the
// caller must not write through them into a read-only tensor (qkv's ops only write
// into tensors they allocated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "qkv/device.h"
#include "qkv/dtype.h"
#include "qkv/error.h"
#include "qkv/size.h"

namespace qkv {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// Bytes shared by tensors, on one device (qkv/device.h). Either owned (64-byte
// aligned, from the device's allocator, qkv/allocator.h) or a wrapped external
// buffer kept alive by `keep_alive`, possibly read-only.
class Storage {
 public:
  static constexpr size_t kAlignment = 64;

  // Uninitialized, 64-byte-aligned bytes on `device`. OutOfMemoryError past
  // max_alloc_bytes() or when the device refuses; `what` names the bytes in that
  // message. DeviceError when no allocator serves `device`.
  static std::shared_ptr<Storage> allocate(size_t nbytes, std::string_view what = "buffer",
                                           Device device = Device::cpu());
  // Wraps memory owned elsewhere (on `device`); `keep_alive` (may be null) is
  // held while any tensor uses the storage.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, std::shared_ptr<void> keep_alive,
                                       bool read_only = false, Device device = Device::cpu());

  std::byte* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  bool read_only() const { return read_only_; }
  Device device() const { return device_; }

 private:
  Storage(std::byte* data, size_t nbytes, std::shared_ptr<void> owner, bool read_only, Device device)
      : data_(data), nbytes_(nbytes), owner_(std::move(owner)), read_only_(read_only), device_(device) {}
  std::byte* data_;
  size_t nbytes_;
  std::shared_ptr<void> owner_;
  bool read_only_;
  Device device_;
};

// Contiguous (row-major) strides for `shape`.
Strides contiguous_strides(const Shape& shape);
// Product of the dims; ShapeError on negative dims or more than kMaxElements (qkv/size.h).
int64_t shape_numel(const Shape& shape);
// numpy broadcasting of two shapes; ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

class Tensor {
 public:
  // An empty f32 tensor of shape [0].
  Tensor();

  // ---- construction -------------------------------------------------------
  // Uninitialized; on `device` (its allocator, qkv/allocator.h). The other
  // constructors make CPU tensors.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor ones(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
  // 0, 1, ..., n-1.
  static Tensor arange(int64_t n, DType dtype = DType::f32);
  // Standard normal values; element i depends only on (seed, i).
  static Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::f32);
  // Uniform values in [low, high); element i depends only on (seed, i).
  static Tensor uniform(const Shape& shape, uint64_t seed, double low = 0.0, double high = 1.0,
                        DType dtype = DType::f32);
  // Zero-copy view of an external buffer. `strides` empty = contiguous.
  // `keep_alive` is held as long as any view of the buffer lives; `read_only`
  // marks a buffer qkv must not write (see the top of this file).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, const Strides& strides = {},
                          std::shared_ptr<void> keep_alive = nullptr, bool read_only = false);
  // Copies `values` into a new contiguous tensor of `shape` (numel must match).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  // A view with explicit geometry over existing storage (checked to stay in bounds).
  static Tensor view_of(std::shared_ptr<Storage> storage, DType dtype, const Shape& shape, const Strides& strides,
                        int64_t offset);

  // ---- geometry -----------------------------------------------------------
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  // Size / stride of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const { return offset_; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t itemsize() const { return qkv::itemsize(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Where the elements live. Views, data<T>() and raw_data() work on any device;
  // element access, to(dtype), fill and to_string run on the CPU and are a
  // DeviceError for a tensor elsewhere; clone, contiguous and copy_from (same dtype)
  // also run on a GPU, and to(Device) moves between devices.
  Device device() const { return storage_->device(); }
  // True when the storage must not be written (a read-only buffer, and every view of it).
  bool is_read_only() const { return storage_->read_only(); }
  // True when both tensors view the same storage.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // ---- data ---------------------------------------------------------------
  // Pointer to element [0, ..., 0]; T (or const T) must match the dtype (DTypeError
  // otherwise). Raw access: no read-only check (see the top of this file).
  template <class T>
  T* data() const;
  void* raw_data() const;

  // Reference to one element; index length must equal dim(), negative indices count
  // from the end. IndexError when out of range, DTypeError when T is not the dtype,
  // ValueError for a non-const T on a read-only tensor (read those with at<const T>).
  template <class T>
  T& at(std::span<const int64_t> index) const;
  template <class T>
  T& at(std::initializer_list<int64_t> index) const {
    return at<T>(std::span<const int64_t>(index.begin(), index.size()));
  }
  // Element value converted to double, whatever the dtype.
  double item(std::span<const int64_t> index) const;
  double item(std::initializer_list<int64_t> index) const {
    return item(std::span<const int64_t>(index.begin(), index.size()));
  }
  // Value of a one-element tensor as double.
  double item() const;
  // Stores `value` converted to the dtype (ValueError on a read-only tensor).
  void set_item(std::span<const int64_t> index, double value) const;
  void set_item(std::initializer_list<int64_t> index, double value) const {
    set_item(std::span<const int64_t>(index.begin(), index.size()), value);
  }
  // All elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- views --------------------------------------------------------------
  // Reorders dims: result.shape[i] = shape[dims[i]]. dims must be a permutation.
  Tensor permute(std::span<const int64_t> dims) const;
  Tensor permute(std::initializer_list<int64_t> dims) const {
    return permute(std::span<const int64_t>(dims.begin(), dims.size()));
  }
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  // New shape with one optional -1 inferred. A view when the strides allow it
  // (as torch.reshape / numpy.reshape), otherwise a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  // Like reshape but never copies: ShapeError when no view exists.
  Tensor view(const Shape& shape) const;
  // Python slicing start:stop:step on one dim (negative indices, clamping; step >= 1).
  Tensor slice(int64_t dim, int64_t start, int64_t stop, int64_t step = 1) const;
  // Removes dim `dim` by taking position `index`.
  Tensor select(int64_t dim, int64_t index) const;
  // Broadcast view with zero strides (torch.expand): dims of size 1 may grow,
  // new leading dims may be added, -1 keeps a dim.
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t dim) const;
  // Removes dim `dim`, which must have size 1.
  Tensor squeeze(int64_t dim) const;

  // ---- copies -------------------------------------------------------------
  // This tensor if already contiguous, else a contiguous copy.
  Tensor contiguous() const;
  // Always a new contiguous copy.
  Tensor clone() const;
  // Converted copy (this tensor itself when the dtype already matches).
  Tensor to(DType dtype) const;
  // Contiguous copy on `device` (this tensor itself when already there): host to GPU,
  // GPU to host (returns once the bytes are there), GPU to GPU (qkv/cuda.h).
  // DeviceError when no backend serves the device.
  Tensor to(Device device) const;
  // Writes `src` into this tensor, broadcasting src and converting its dtype
  // (ValueError when this tensor is read-only).
  void copy_from(const Tensor& src) const;
  // Sets every element to `value` (ValueError when read-only).
  void fill(double value) const;

  // numpy-style text: "array([[1., 2.],\n       [3., 4.]], dtype=float32)".
  std::string to_string() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Strides strides, int64_t offset);
  int64_t normalize_dim(int64_t d, const char* op, int64_t ndim) const;
  int64_t element_offset(std::span<const int64_t> index, const char* op) const;
  void check_dtype(DType expected, const char* op) const;
  void check_writable(const char* op) const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::f32;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Tensor& t);

// ---- template definitions ---------------------------------------------------

template <class T>
T* Tensor::data() const {
  check_dtype(dtype_v<std::remove_const_t<T>>, "data");
  return reinterpret_cast<T*>(storage_->data()) + offset_;
}

template <class T>
T& Tensor::at(std::span<const int64_t> index) const {
  check_dtype(dtype_v<std::remove_const_t<T>>, "at");
  if constexpr (!std::is_const_v<T>) check_writable("at");
  return reinterpret_cast<T*>(storage_->data())[element_offset(index, "at")];
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
    fail<ShapeError>("from_vector: ", values.size(), " values do not fill shape ", shape_str(shape));
  }
  Tensor out = empty(shape, dtype_v<T>);
  T* p = out.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];  // also works for vector<bool>
  return out;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  require_cpu("to_vector", {this});
  Tensor converted = to(dtype_v<T>).contiguous();
  const T* p = converted.data<T>();
  return std::vector<T>(p, p + numel_);
}

}  // namespace qkv
