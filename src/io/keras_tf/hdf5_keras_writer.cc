// Keras weight files written through libhdf5: Keras 3 .weights.h5 (one dataset per
// tensor at its path) and tf.keras 2.x .h5 as model.save_weights("x.h5") writes it
// (layer_names / weight_names fixed-length string attributes, datasets at
// <layer>/<layer>/query/kernel:0). Both can be built in memory (core driver) for
// the .keras zip writer.
#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include "io/keras_tf/hdf5_internal.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace detail {
namespace {

// The tf_keras release whose save_weights layout this follows. tf_keras reads the
// attribute only to convert files of Keras 1 (a leading "1").
constexpr const char* kLegacyKerasVersion = "2.21.0";

bool hdf5_holds(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::i8 || dt == DType::i32 || dt == DType::i64 ||
         dt == DType::f16 || dt == DType::b8;
}

hid_t h5_file_type(DType dt, H5Id& owned, const Context& ctx, const std::string& name) {
  switch (dt) {
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::i8: return H5T_STD_I8LE;
    case DType::i32: return H5T_STD_I32LE;
    case DType::i64: return H5T_STD_I64LE;
    case DType::f16: {  // IEEE half as h5py defines it
      owned = H5Id(h5_check(H5Tcopy(H5T_IEEE_F32LE), ctx, "H5Tcopy"));
      H5Tset_fields(owned.get(), 15, 10, 5, 0, 10);
      H5Tset_size(owned.get(), 2);
      H5Tset_ebias(owned.get(), 15);
      return owned.get();
    }
    case DType::b8: {  // h5py's bool
      owned = H5Id(h5_check(H5Tenum_create(H5T_NATIVE_INT8), ctx, "H5Tenum_create"));
      const int8_t f = 0, t = 1;
      H5Tenum_insert(owned.get(), "FALSE", &f);
      H5Tenum_insert(owned.get(), "TRUE", &t);
      return owned.get();
    }
    default:
      fail_at<DTypeError>(ctx, "tensor ", quote_name(name), " is ", dtype_name(dt),
                          ", which HDF5 weight files cannot hold");
  }
}

void write_dataset(hid_t file, hid_t lcpl, const std::string& name, const Tensor& tensor, const Context& ctx) {
  H5Id owned;
  const hid_t type = h5_file_type(tensor.dtype(), owned, ctx, name);
  std::vector<hsize_t> dims(tensor.shape().begin(), tensor.shape().end());
  H5Id space(dims.empty() ? H5Screate(H5S_SCALAR)
                          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  h5_check(space.get(), ctx, "dataspace of " + quote_name(name));
  // No modification times in the object headers: the same weights give the same bytes
  // (tests/python/test_py_writers.py compares them with the files TF/Keras loaded).
  H5Id dcpl(h5_check(H5Pcreate(H5P_DATASET_CREATE), ctx, "H5Pcreate"));
  H5Pset_obj_track_times(dcpl.get(), 0);
  H5Id dset(H5Dcreate2(file, name.c_str(), type, space.get(), lcpl, dcpl.get(), H5P_DEFAULT));
  if (!dset.valid()) fail_at<IOError>(ctx, "cannot create dataset ", quote_name(name), ": ", hdf5_error_text());
  const Tensor c = tensor.to(Device::cpu()).contiguous();  // a GPU tensor is copied to the host first
  if (c.numel() > 0 && H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.raw_data()) < 0) {
    fail_at<IOError>(ctx, "cannot write dataset ", quote_name(name), ": ", hdf5_error_text());
  }
}

// Whether HDF5 stores `name` as that path: no empty component ('/a', 'a/', 'a//b'), no
// '.' component (libhdf5 reads 'a/./b' as 'a/b' and cannot create '.') and no NUL
// (libhdf5 ends the name there: 'a\0b' was written as 'a').
bool valid_dataset_path(const std::string& name) {
  if (name.find('\0') != std::string::npos) return false;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part(name.data() + begin, end - begin);
    if (part.empty() || part == ".") return false;
    if (end == name.size()) return true;
    begin = end + 1;
  }
}

// Everything the writer can refuse, before the file is created: a refused save used to
// truncate an existing file and leave the tensors written before the refusal in it.
void check_tensors(const std::map<std::string, Tensor>& tensors, const Context& ctx) {
  std::set<std::string> groups;  // every proper prefix of a path: a group, which no dataset may be
  for (const auto& [name, t] : tensors) {
    if (!valid_dataset_path(name)) fail_at<ValueError>(ctx, "invalid dataset path ", quote_name(name));
    if (!hdf5_holds(t.dtype())) {
      fail_at<DTypeError>(ctx, "tensor ", quote_name(name), " is ", dtype_name(t.dtype()),
                          ", which HDF5 weight files cannot hold");
    }
    for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1)) {
      groups.insert(name.substr(0, slash));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (groups.count(name) != 0) {
      fail_at<ValueError>(ctx, "tensor ", quote_name(name), " is a dataset, but another tensor's path (",
                          quote_name(name + "/..."), ") needs it as a group");
    }
  }
}

// A new HDF5 file in memory (core driver, no backing store): the writers below write
// its image to disk themselves.
H5Id create_file(const Context& ctx) {
  H5Id fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), ctx, "H5Pcreate"));
  H5Pset_fapl_core(fapl.get(), size_t{1} << 16, 0);
  H5Id file(H5Fcreate("qkv-in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!file.valid()) fail_at<IOError>(ctx, "cannot create: ", hdf5_error_text());
  return file;
}

void flush(hid_t file, const Context& ctx) {
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) fail_at<IOError>(ctx, hdf5_error_text());
}

// The image of an in-memory file.
std::vector<std::byte> file_image(hid_t file, const Context& ctx) {
  flush(file, ctx);
  const ssize_t n = H5Fget_file_image(file, nullptr, 0);
  if (n < 0) fail_at<IOError>(ctx, "cannot get the file image: ", hdf5_error_text());
  std::vector<std::byte> out(static_cast<size_t>(n));
  if (H5Fget_file_image(file, out.data(), out.size()) != n)
    fail_at<IOError>(ctx, "cannot get the file image: ", hdf5_error_text());
  return out;
}

// The image of a new in-memory file after write(file) filled it, made under the HDF5 lock
// (released on return, before any disk I/O).
template <class Write>
std::vector<std::byte> image_of(const Context& ctx, Write&& write) {
  auto lock = hdf5_lock();
  H5Id file = create_file(ctx);
  write(file.get());
  return file_image(file.get(), ctx);
}

// The image to `path`, whole or not at all (write_file).
void save_image(const std::filesystem::path& path, const std::vector<std::byte>& image, const Context& ctx) {
  const std::span<const std::byte> chunks[] = {image};
  write_file(path, chunks, ctx);
}

void write_weights(hid_t file, const std::map<std::string, Tensor>& tensors, const Context& ctx) {
  H5Id lcpl(h5_check(H5Pcreate(H5P_LINK_CREATE), ctx, "H5Pcreate"));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  for (const auto& [name, t] : tensors) write_dataset(file, lcpl.get(), name, t, ctx);
}

// A fixed-length string attribute as numpy writes an array of bytes (dtype 'S<n>',
// null-padded): a 1-d array when `array`, else a scalar. An empty array is
// written as h5py writes np.asarray([]): float64 of shape (0,), as tf_keras does
// for layers without weights.
void write_string_attr(hid_t obj, const char* name, const std::vector<std::string>& values, bool array,
                       const Context& ctx) {
  const std::string what = std::string("attribute '") + name + "'";
  if (array && values.empty()) {
    const hsize_t zero = 0;
    H5Id space(h5_check(H5Screate_simple(1, &zero, nullptr), ctx, what));
    H5Id attr(h5_check(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), ctx, what));
    return;
  }
  size_t width = 1;
  for (const std::string& v : values) width = std::max(width, v.size());
  std::vector<char> buf(width * values.size(), '\0');
  for (size_t i = 0; i < values.size(); ++i) std::memcpy(buf.data() + i * width, values[i].data(), values[i].size());
  H5Id type(h5_check(H5Tcopy(H5T_C_S1), ctx, what));
  H5Tset_size(type.get(), width);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  const hsize_t n = values.size();
  H5Id space(h5_check(array ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_SCALAR), ctx, what));
  H5Id attr(h5_check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), ctx, what));
  if (H5Awrite(attr.get(), type.get(), buf.data()) < 0)
    fail_at<IOError>(ctx, "cannot write ", what, ": ", hdf5_error_text());
}

H5Id create_group(hid_t parent, const std::string& name, const Context& ctx) {
  H5Id g(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) fail_at<IOError>(ctx, "cannot create group ", quote_name(name), ": ", hdf5_error_text());
  return g;
}

// What write_legacy can refuse, checked before the file is created (as check_tensors).
void check_legacy(const std::vector<LegacyH5Layer>& layers, const Context& ctx) {
  std::set<std::string> seen;
  for (const LegacyH5Layer& layer : layers) {
    if (layer.name.empty() || layer.name.find('/') != std::string::npos || layer.name == "top_level_model_weights" ||
        !valid_dataset_path(layer.name)) {
      fail_at<ValueError>(ctx, "invalid layer name ", quote_name(layer.name));
    }
    if (!seen.insert(layer.name).second) fail_at<ValueError>(ctx, "two layers are named ", quote_name(layer.name));
    std::map<std::string, Tensor> weights;  // at their paths in the layer's group
    for (const auto& [w, t] : layer.weights) {
      if (!weights.emplace(layer.name + "/" + w + ":0", t).second) {
        fail_at<ValueError>(ctx, "layer ", quote_name(layer.name), " has two weights named ", quote_name(w));
      }
    }
    check_tensors(weights, ctx);
  }
}

// tf_keras' save_weights_to_hdf5_group: root attributes, then one group per layer
// holding weight_names and the datasets, then an empty top_level_model_weights.
void write_legacy(hid_t file, const std::vector<LegacyH5Layer>& layers, const Context& ctx) {
  std::vector<std::string> names;
  for (const LegacyH5Layer& layer : layers) names.push_back(layer.name);
  H5Id root(h5_check(H5Gopen2(file, "/", H5P_DEFAULT), ctx, "root group"));
  write_string_attr(root.get(), "layer_names", names, true, ctx);
  write_string_attr(root.get(), "backend", {"tensorflow"}, false, ctx);
  write_string_attr(root.get(), "keras_version", {kLegacyKerasVersion}, false, ctx);
  H5Id lcpl(h5_check(H5Pcreate(H5P_LINK_CREATE), ctx, "H5Pcreate"));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  for (const LegacyH5Layer& layer : layers) {
    H5Id g = create_group(file, layer.name, ctx);
    std::vector<std::string> weight_names;
    for (const auto& [w, t] : layer.weights) {
      weight_names.push_back(layer.name + "/" + w + ":0");
      write_dataset(g.get(), lcpl.get(), weight_names.back(), t, ctx);
    }
    write_string_attr(g.get(), "weight_names", weight_names, true, ctx);
  }
  H5Id top = create_group(file, "top_level_model_weights", ctx);
  write_string_attr(top.get(), "weight_names", {}, true, ctx);
}

}  // namespace
}  // namespace detail

// The writers build the file in memory (core driver, no backing store) and write its
// image through write_file: whole or not at all, and libhdf5 never writes to disk. It
// did: a write that failed (a full disk) left the file open inside libhdf5, which then
// crashed at exit closing it (SIGSEGV in H5F__close_cb from H5_term_library; libhdf5
// 1.10.8, in the qkv tool and in Python alike). The cost: the image is held in memory
// twice (the core driver's buffer and its copy) while it is written.
void save_keras_weights_h5(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  const detail::Context ctx{"save_keras_weights_h5", path.string()};
  detail::check_tensors(tensors, ctx);
  detail::save_image(path, detail::image_of(ctx, [&](hid_t file) { detail::write_weights(file, tensors, ctx); }), ctx);
}

std::vector<std::byte> serialize_keras_weights_h5(const std::map<std::string, Tensor>& tensors) {
  const detail::Context ctx{"serialize_keras_weights_h5", "<memory>"};
  detail::check_tensors(tensors, ctx);
  return detail::image_of(ctx, [&](hid_t file) { detail::write_weights(file, tensors, ctx); });
}

void save_keras_legacy_h5(const std::filesystem::path& path, const std::vector<LegacyH5Layer>& layers) {
  const detail::Context ctx{"save_keras_legacy_h5", path.string()};
  detail::check_legacy(layers, ctx);
  detail::save_image(path, detail::image_of(ctx, [&](hid_t file) { detail::write_legacy(file, layers, ctx); }), ctx);
}

}  // namespace qkv::io
