// Tensor construction, geometry and views. Copies live in copy.cc, text in format.cc.
#include "qkv/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <ostream>

#include "qkv/allocator.h"

namespace qkv {

// ---- Storage -------------------------------------------------------------------------

namespace {
// `nbytes` (already checked against the limit) from `device`'s allocator, or
// null when it refuses. The storage gives the bytes back to the same allocator.
std::shared_ptr<Storage> try_allocate(size_t nbytes, Device device, std::string_view op) {
  Allocator& allocator = allocator_for(device, op);
  void* p = allocator.allocate(nbytes);
  if (p == nullptr) return nullptr;
  std::shared_ptr<void> owner(p, [&allocator, nbytes](void* q) { allocator.deallocate(q, nbytes); });
  return Storage::wrap(p, nbytes, std::move(owner), false, device);
}
}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, std::string_view what, Device device) {
  check_alloc_bytes(nbytes, what, "Storage::allocate");
  auto storage = try_allocate(nbytes, device, "Storage::allocate");
  if (!storage) fail_out_of_memory(nbytes, what, "Storage::allocate");
  return storage;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, std::shared_ptr<void> keep_alive, bool read_only,
                                       Device device) {
  return std::shared_ptr<Storage>(
      new Storage(static_cast<std::byte*>(data), nbytes, std::move(keep_alive), read_only, device));
}

// ---- shape helpers -----------------------------------------------------------------------

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  if (const auto n = checked_numel(shape)) return *n;
  for (int64_t d : shape) {
    if (d < 0) fail<ShapeError>("shape ", shape_str(shape), " has a negative dimension");
  }
  fail<ShapeError>("shape ", shape_str(shape), " has more than 2^62 elements");
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      fail<ShapeError>(op, ": shapes ", shape_str(a), " and ", shape_str(b), " cannot be broadcast together (dim ", i,
                       ": ", da, " vs ", db, ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---- construction ------------------------------------------------------------------------

Tensor::Tensor() : Tensor(Storage::allocate(0), DType::f32, {0}, {1}, 0) {}

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Strides strides, int64_t offset)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      numel_(shape_numel(shape_)) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const size_t nbytes = checked_alloc_bytes(shape, dtype);
  auto storage = try_allocate(nbytes, device, "Tensor::empty");
  if (!storage) fail_out_of_memory(nbytes, allocation_what(shape, dtype, "output"), "Tensor::empty");
  return Tensor(std::move(storage), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, const Strides& strides,
                         std::shared_ptr<void> keep_alive, bool read_only) {
  const int64_t n = shape_numel(shape);
  Strides s = strides.empty() ? contiguous_strides(shape) : strides;
  if (s.size() != shape.size()) {
    fail<ShapeError>("from_blob: ", s.size(), " strides for shape ", shape_str(shape));
  }
  if (data == nullptr && n > 0) fail<ValueError>("from_blob: null data for shape ", shape_str(shape));
  // The buffer must hold every element addressed; negative strides are not supported.
  int64_t span = n > 0 ? 1 : 0;
  bool fits = true;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (s[i] < 0) fail<ShapeError>("from_blob: negative stride ", s[i], " for shape ", shape_str(shape));
    if (n > 0 && fits) {
      const auto extent = checked_mul(shape[i] - 1, s[i]);
      fits = extent && *extent <= kMaxElements - span;
      if (fits) span += *extent;
    }
  }
  const auto nbytes = fits ? checked_nbytes(span, qkv::itemsize(dtype)) : std::nullopt;
  if (!nbytes) {
    fail<ShapeError>("from_blob: shape ", shape_str(shape), " strides ", shape_str(s), " address more than 2^62 ",
                     dtype_name(dtype), " elements");
  }
  auto storage = Storage::wrap(data, *nbytes, std::move(keep_alive), read_only);
  return Tensor(std::move(storage), dtype, shape, std::move(s), 0);
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, DType dtype, const Shape& shape, const Strides& strides,
                       int64_t offset) {
  if (!storage) fail<ValueError>("view_of: null storage");
  if (strides.size() != shape.size()) {
    fail<ShapeError>("view_of: ", strides.size(), " strides for shape ", shape_str(shape));
  }
  const int64_t n = shape_numel(shape);
  int64_t lo = offset, hi = offset;
  bool overflow = false;
  for (size_t i = 0; i < shape.size() && n > 0; ++i) {
    int64_t extent = 0;
    overflow = overflow || __builtin_mul_overflow(shape[i] - 1, strides[i], &extent) ||
               __builtin_add_overflow(extent < 0 ? lo : hi, extent, extent < 0 ? &lo : &hi);
  }
  const int64_t capacity = static_cast<int64_t>(storage->nbytes() / qkv::itemsize(dtype));
  if (n > 0 && (overflow || lo < 0 || hi >= capacity)) {
    fail<IndexError>("view_of: shape ", shape_str(shape), " strides ", shape_str(strides), " offset ", offset,
                     " reach elements [", lo, ", ", hi, "] outside storage of ", capacity, " elements");
  }
  return Tensor(std::move(storage), dtype, shape, strides, offset);
}

// ---- geometry ------------------------------------------------------------------------------

int64_t Tensor::normalize_dim(int64_t d, const char* op, int64_t ndim) const {
  if (d < -ndim || d >= ndim) {
    fail<IndexError>(op, ": dim ", d, " out of range for tensor of shape ", shape_str(shape_));
  }
  return d < 0 ? d + ndim : d;
}

int64_t Tensor::size(int64_t d) const { return shape_[normalize_dim(d, "size", dim())]; }
int64_t Tensor::stride(int64_t d) const { return strides_[normalize_dim(d, "stride", dim())]; }

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const { return storage_->data() + static_cast<size_t>(offset_) * itemsize(); }

void Tensor::check_dtype(DType expected, const char* op) const {
  if (expected != dtype_) {
    fail<DTypeError>(op, ": requested ", dtype_name(expected), " from a ", dtype_name(dtype_), " tensor of shape ",
                     shape_str(shape_));
  }
}

int64_t Tensor::element_offset(std::span<const int64_t> index, const char* op) const {
  require_cpu(op, {this});  // at, item, set_item read host memory
  if (static_cast<int64_t>(index.size()) != dim()) {
    fail<IndexError>(op, ": index ", shape_str(index), " has ", index.size(), " entries for tensor of shape ",
                     shape_str(shape_));
  }
  int64_t off = offset_;
  for (size_t i = 0; i < index.size(); ++i) {
    int64_t j = index[i];
    if (j < -shape_[i] || j >= shape_[i]) {
      fail<IndexError>(op, ": index ", shape_str(index), " out of range for tensor of shape ", shape_str(shape_));
    }
    if (j < 0) j += shape_[i];
    off += j * strides_[i];
  }
  return off;
}

double Tensor::item(std::span<const int64_t> index) const {
  const int64_t off = element_offset(index, "item");
  return dispatch_dtype(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return convert_element<double>(reinterpret_cast<const T*>(storage_->data())[off]);
  });
}

double Tensor::item() const {
  if (numel_ != 1) fail<ShapeError>("item: tensor of shape ", shape_str(shape_), " is not one element");
  return item(Shape(shape_.size(), 0));
}

void Tensor::check_writable(const char* op) const {
  if (is_read_only()) {
    fail<ValueError>(op, ": tensor of shape ", shape_str(shape_),
                     " is read-only (it views a read-only buffer, e.g. a NumPy array with writeable=False)");
  }
}

void Tensor::set_item(std::span<const int64_t> index, double value) const {
  check_writable("set_item");
  const int64_t off = element_offset(index, "set_item");
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reinterpret_cast<T*>(storage_->data())[off] = convert_element<T>(value);
  });
}

// ---- views ------------------------------------------------------------------------------------

Tensor Tensor::permute(std::span<const int64_t> dims) const {
  if (static_cast<int64_t>(dims.size()) != dim()) {
    fail<ShapeError>("permute: dims ", shape_str(dims), " do not match tensor of shape ", shape_str(shape_));
  }
  Shape shape(dims.size());
  Strides strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < -dim() || dims[i] >= dim()) {
      fail<IndexError>("permute: dim ", dims[i], " in ", shape_str(dims), " out of range for tensor of shape ",
                       shape_str(shape_));
    }
    const int64_t d = dims[i] < 0 ? dims[i] + dim() : dims[i];
    if (seen[d]) {
      fail<ShapeError>("permute: dims ", shape_str(dims), " repeat dim ", d, " (tensor of shape ", shape_str(shape_),
                       ")");
    }
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  std::vector<int64_t> dims(shape_.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim(dim0, "transpose", dim())], dims[normalize_dim(dim1, "transpose", dim())]);
  return permute(dims);
}

namespace {
// Resolves one -1 in `shape` so that it has `numel` elements.
Shape infer_shape(const Shape& requested, int64_t numel, const Shape& source, const char* op) {
  Shape shape = requested;
  int64_t known = 1;
  int64_t infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail<ShapeError>(op, ": only one dimension can be -1 in ", shape_str(requested));
      infer_at = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      fail<ShapeError>(op, ": invalid dimension ", shape[i], " in ", shape_str(requested));
    } else {
      const auto product = checked_mul(known, shape[i]);
      if (!product) {
        fail<ShapeError>(op, ": shape ", shape_str(requested), " has more than 2^62 elements (input of shape ",
                         shape_str(source), ")");
      }
      known = *product;
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0) {
      fail<ShapeError>(op, ": shape ", shape_str(requested), " is invalid for input of shape ", shape_str(source), " (",
                       numel, " elements)");
    }
    shape[infer_at] = numel / known;
  }
  if (shape_numel(shape) != numel) {
    fail<ShapeError>(op, ": shape ", shape_str(requested), " is invalid for input of shape ", shape_str(source), " (",
                     numel, " elements)");
  }
  return shape;
}

// Strides that view `shape` over memory laid out as (old_shape, old_strides), or
// nothing when the layout does not allow a view (PyTorch's computeStride).
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& shape) {
  Strides strides(shape.size());
  if (old_shape.empty() || shape_numel(old_shape) == 0) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_base_stride = old_strides[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape resolved = infer_shape(shape, numel_, shape_, "view");
  auto strides = view_strides(shape_, strides_, resolved);
  if (!strides) {
    fail<ShapeError>("view: tensor of shape ", shape_str(shape_), " and strides ", shape_str(strides_),
                     " cannot be viewed as ", shape_str(resolved), " without a copy; use reshape");
  }
  return Tensor(storage_, dtype_, resolved, std::move(*strides), offset_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape resolved = infer_shape(shape, numel_, shape_, "reshape");
  if (auto strides = view_strides(shape_, strides_, resolved)) {
    return Tensor(storage_, dtype_, resolved, std::move(*strides), offset_);
  }
  Tensor copy = contiguous();
  return Tensor(copy.storage_, dtype_, resolved, contiguous_strides(resolved), copy.offset_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t stop, int64_t step) const {
  d = normalize_dim(d, "slice", dim());
  if (step < 1) fail<ValueError>("slice: step ", step, " must be >= 1 (tensor of shape ", shape_str(shape_), ")");
  const int64_t n = shape_[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t b = clamp(start), e = clamp(stop);
  const int64_t len = e > b ? (e - b + step - 1) / step : 0;
  Shape shape = shape_;
  Strides strides = strides_;
  shape[d] = len;
  strides[d] = strides_[d] * step;
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_ + (len > 0 ? b * strides_[d] : 0));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, "select", dim());
  if (index < -shape_[d] || index >= shape_[d]) {
    fail<IndexError>("select: index ", index, " out of range for dim ", d, " of tensor of shape ", shape_str(shape_));
  }
  if (index < 0) index += shape_[d];
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_ + index * strides_[d]);
}

Tensor Tensor::expand(const Shape& shape) const {
  if (shape.size() < shape_.size()) {
    fail<ShapeError>("expand: cannot expand tensor of shape ", shape_str(shape_), " to fewer dims ", shape_str(shape));
  }
  const size_t lead = shape.size() - shape_.size();
  Shape out(shape.size());
  Strides strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0) fail<ShapeError>("expand: -1 not allowed for new leading dim in ", shape_str(shape));
      out[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (want == have) {
      out[i] = have;
      strides[i] = strides_[i - lead];
    } else if (have == 1 && want >= 0) {
      out[i] = want;
      strides[i] = 0;
    } else {
      fail<ShapeError>("expand: tensor of shape ", shape_str(shape_), " cannot expand to ", shape_str(shape), " (dim ",
                       i, ": ", have, " -> ", shape[i], ")");
    }
  }
  return Tensor(storage_, dtype_, std::move(out), std::move(strides), offset_);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, "unsqueeze", dim() + 1);
  Shape shape = shape_;
  Strides strides = strides_;
  const int64_t stride = d < dim() ? shape_[d] * strides_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return Tensor(storage_, dtype_, std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, "squeeze", dim());
  if (shape_[d] != 1) {
    fail<ShapeError>("squeeze: dim ", d, " of tensor of shape ", shape_str(shape_), " has size ", shape_[d], ", not 1");
  }
  return select(d, 0);
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << t.to_string(); }

}  // namespace qkv
