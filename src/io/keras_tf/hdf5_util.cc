// libhdf5 helpers: locking, error text, in-memory images, datasets and attributes.
#include <cstring>

#include "io/keras_tf/hdf5_internal.h"

namespace qkv::io::detail {
namespace {

herr_t collect_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n < 2 && err->desc != nullptr) {  // the innermost two frames say what went wrong
    if (!out->empty()) out->append("; ");
    out->append(err->desc);
  }
  return 0;
}

constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

}  // namespace

std::unique_lock<std::recursive_mutex> hdf5_lock() {
  static std::recursive_mutex mutex;
  std::unique_lock<std::recursive_mutex> lock(mutex);
  static const bool quiet = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)quiet;
  return lock;
}

std::string hdf5_error_text() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "libhdf5 reported an error" : "libhdf5: " + out;
}

hid_t h5_check(hid_t id, const Context& ctx, const std::string& what) {
  if (id < 0) fail_at(ctx, what, ": ", hdf5_error_text());
  return id;
}

namespace {
herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }
}  // namespace

H5Id local_access(hid_t cls, const Context& ctx) {
  H5Id plist(h5_check(H5Pcreate(cls), ctx, "H5Pcreate"));
  if (H5Pset_elink_cb(plist.get(), refuse_external_link, nullptr) < 0) {
    fail_at(ctx, "H5Pset_elink_cb: ", hdf5_error_text());
  }
  return plist;
}

void check_hdf5_signature(std::span<const std::byte> bytes, const Context& ctx) {
  // The superblock may follow a user block of 512 * 2^k bytes.
  bool found = false;
  for (size_t at = 0; at + 8 <= bytes.size() && !found; at = at == 0 ? 512 : at * 2) {
    found = std::memcmp(bytes.data() + at, kSignature, 8) == 0;
  }
  if (!found) fail_at(ctx, "not an HDF5 file (no HDF5 signature)");
}

namespace {
// File image callbacks (H5Pset_file_image_callbacks) that hand libhdf5 the caller's
// buffer wherever it would allocate and copy one: the fapl's image, the fapl copies
// H5Fopen makes and the core driver's image are all `udata`, the caller's bytes.
// Only a copy of the buffer onto itself is "made"; a real copy, a resize or a
// H5Pget_file_image copy is refused (libhdf5 reports the error), so no path copies.
void* image_malloc(size_t, H5FD_file_image_op_t op, void* udata) {
  const bool shared = op == H5FD_FILE_IMAGE_OP_PROPERTY_LIST_SET || op == H5FD_FILE_IMAGE_OP_PROPERTY_LIST_COPY ||
                      op == H5FD_FILE_IMAGE_OP_FILE_OPEN;
  return shared ? udata : nullptr;
}
void* image_memcpy(void* dest, const void* src, size_t, H5FD_file_image_op_t, void* udata) {
  return dest == src && dest == udata ? dest : nullptr;
}
void* image_realloc(void*, size_t, H5FD_file_image_op_t, void*) { return nullptr; }
herr_t image_free(void*, H5FD_file_image_op_t, void*) { return 0; }  // the caller owns the bytes
void* udata_copy(void* udata) { return udata; }
herr_t udata_free(void*) { return 0; }
}  // namespace

H5Id open_hdf5_image(std::span<const std::byte> bytes, const Context& ctx) {
  check_hdf5_signature(bytes, ctx);
  H5Id fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), ctx, "H5Pcreate"));
  h5_check(H5Pset_fapl_core(fapl.get(), 1 << 16, 0), ctx, "H5Pset_fapl_core");
  // Read-only, without a backing store: libhdf5 only reads the image, so the
  // const_cast never leads to a write (the callbacks must come before the image).
  void* image = const_cast<std::byte*>(bytes.data());
  H5FD_file_image_callbacks_t callbacks{image_malloc, image_memcpy, image_realloc, image_free,
                                        udata_copy,   udata_free,   image};
  h5_check(H5Pset_file_image_callbacks(fapl.get(), &callbacks), ctx, "H5Pset_file_image_callbacks");
  h5_check(H5Pset_file_image(fapl.get(), image, bytes.size()), ctx, "H5Pset_file_image");
  return H5Id(h5_check(H5Fopen("image.h5", H5F_ACC_RDONLY, fapl.get()), ctx, "cannot open as HDF5"));
}

H5DatasetInfo dataset_info(hid_t dset, const Context& ctx, const std::string& path) {
  H5DatasetInfo info;
  const std::string what = "dataset " + quote_name(path);
  H5Id space(h5_check(H5Dget_space(dset), ctx, what));
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (ndims < 0 || ndims > 64) fail_at(ctx, what, ": unsupported dataspace (", ndims, " dims)");
  std::vector<hsize_t> dims(static_cast<size_t>(ndims));
  if (ndims > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    fail_at(ctx, what, ": ", hdf5_error_text());
  }
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(kMaxElements)) fail_at(ctx, what, ": dim ", d, " too large");
    info.shape.push_back(static_cast<int64_t>(d));
  }
  if (!checked_numel(info.shape)) fail_at(ctx, what, ": shape ", shape_str(info.shape), " has too many elements");
  H5Id type(h5_check(H5Dget_type(dset), ctx, what));
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  info.little_endian = H5Tget_order(type.get()) != H5T_ORDER_BE;
  if (cls == H5T_FLOAT) {
    info.dtype = size == 2   ? std::optional(DType::f16)
                 : size == 4 ? std::optional(DType::f32)
                 : size == 8 ? std::optional(DType::f64)
                             : std::nullopt;
    info.dtype_name = info.dtype ? std::string(dtype_name(*info.dtype)) : "float" + std::to_string(size * 8);
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
    if (is_signed) {
      info.dtype = size == 1   ? std::optional(DType::i8)
                   : size == 4 ? std::optional(DType::i32)
                   : size == 8 ? std::optional(DType::i64)
                               : std::nullopt;
    }
    info.dtype_name =
        info.dtype ? std::string(dtype_name(*info.dtype)) : (is_signed ? "int" : "uint") + std::to_string(size * 8);
  } else if (cls == H5T_ENUM && size == 1 && H5Tget_nmembers(type.get()) == 2) {
    info.dtype = DType::b8;  // h5py's bool: enum {FALSE = 0, TRUE = 1} over int8
    info.dtype_name = "bool";
  } else {
    info.dtype_name = cls == H5T_STRING ? "string" : "hdf5 class " + std::to_string(static_cast<int>(cls));
  }
  return info;
}

Tensor read_dataset(hid_t dset, const H5DatasetInfo& info, size_t max_bytes, const Context& ctx,
                    const std::string& path) {
  const std::string what = "dataset " + quote_name(path);
  if (!info.dtype) fail_at<DTypeError>(ctx, what, " has dtype ", info.dtype_name, ", which qkv has no type for");
  const DType dt = *info.dtype;
  const auto numel = static_cast<uint64_t>(checked_numel(info.shape).value_or(0));  // checked when read
  if (numel > max_bytes / itemsize(dt)) {
    fail_at(ctx, what, ": shape ", shape_str(info.shape), " needs ", numel, " elements, more than the file can hold");
  }
  // Data stored outside the file (external raw files, virtual datasets mapping other
  // files) would be read from this machine's disk, e.g. /etc/passwd: Keras never
  // writes either.
  H5Id dcpl(h5_check(H5Dget_create_plist(dset), ctx, what));
  const int external = H5Pget_external_count(dcpl.get());
  if (external < 0) fail_at(ctx, what, ": H5Pget_external_count: ", hdf5_error_text());
  if (external != 0 || H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    fail_at(ctx, what, ": its data is stored outside the file (",
            external != 0 ? "external raw data files" : "a virtual dataset", "); qkv reads only data inside it");
  }
  Tensor t = Tensor::empty(info.shape, dt);
  if (numel == 0) return t;
  hid_t mem = H5T_NATIVE_FLOAT;
  H5Id file_type;
  switch (dt) {
    case DType::f64: mem = H5T_NATIVE_DOUBLE; break;
    case DType::i8: mem = H5T_NATIVE_INT8; break;
    case DType::i32: mem = H5T_NATIVE_INT32; break;
    case DType::i64: mem = H5T_NATIVE_INT64; break;
    case DType::f16:
    case DType::b8:
      // No native type: read the stored bytes as they are (little-endian half / enum byte).
      if (dt == DType::f16 && !info.little_endian) fail_at<DTypeError>(ctx, what, ": big-endian float16");
      file_type = H5Id(h5_check(H5Dget_type(dset), ctx, what));
      mem = file_type.get();
      break;
    default: break;
  }
  if (H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw_data()) < 0) {
    fail_at(ctx, what, ": cannot read: ", hdf5_error_text());
  }
  if (dt == DType::b8) normalize_bools(static_cast<std::byte*>(t.raw_data()), t.nbytes());
  return t;
}

bool has_attr(hid_t obj, const char* name, const Context& ctx) {
  const htri_t exists = H5Aexists(obj, name);
  if (exists < 0) fail_at(ctx, "attribute '", name, "': ", hdf5_error_text());
  return exists > 0;
}

std::optional<std::vector<std::string>> read_string_attr(hid_t obj, const char* name, const Context& ctx) {
  if (!has_attr(obj, name, ctx)) return std::nullopt;
  const std::string what = std::string("attribute '") + name + "'";
  H5Id attr(h5_check(H5Aopen(obj, name, H5P_DEFAULT), ctx, what));
  H5Id type(h5_check(H5Aget_type(attr.get()), ctx, what));
  H5Id space(h5_check(H5Aget_space(attr.get()), ctx, what));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > 1000000) fail_at(ctx, what, ": invalid element count ", n);
  std::vector<std::string> out;
  if (n == 0 || H5Tget_class(type.get()) != H5T_STRING) return out;  // e.g. h5py's empty float64 array
  const auto count = static_cast<size_t>(n);
  if (H5Tis_variable_str(type.get()) != 0) return std::nullopt;  // not read: see the header
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (size_t{1} << 20) / count + 1) fail_at(ctx, what, ": invalid string size ", size);
  std::vector<char> buf(size * count);
  if (H5Aread(attr.get(), type.get(), buf.data()) < 0) fail_at(ctx, what, ": ", hdf5_error_text());
  for (size_t i = 0; i < count; ++i) {
    const char* p = buf.data() + i * size;
    out.emplace_back(p, strnlen(p, size));
  }
  return out;
}

namespace {
struct VisitState {
  std::vector<std::string> paths;
  size_t objects = 0;
};
herr_t visit_object(hid_t, const char* name, const H5O_info_t* info, void* data) {
  auto* s = static_cast<VisitState*>(data);
  if (++s->objects > 1000000) return -1;
  if (info->type == H5O_TYPE_DATASET) s->paths.emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_datasets(hid_t file, const Context& ctx) {
  VisitState state;
  if (H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, visit_object, &state, H5O_INFO_BASIC) < 0) {
    fail_at(ctx, "cannot walk the HDF5 groups: ", hdf5_error_text());
  }
  return state.paths;
}

}  // namespace qkv::io::detail
