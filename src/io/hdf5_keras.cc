// Keras weight files in HDF5: Keras 3 .weights.h5 (every dataset, by path) and
// tf.keras 2.x .h5 (layer_names / weight_names attributes, model or weights-only
// files), read from an in-memory image through libhdf5; the .weights.h5 writer.
#include <algorithm>

#include "io/hdf5_internal.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace detail {
namespace {

// Reads (when `data`) and lists the dataset at `path`.
void add_dataset(hid_t file, const std::string& path, std::string name, bool optimizer, bool data,
                 size_t max_bytes, WeightFile& out, const Context& ctx) {
  H5Id dset(h5_check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), ctx, "dataset " + quote_name(path)));
  const H5DatasetInfo info = dataset_info(dset.get(), ctx, path);
  for (const auto& e : out.entries) {
    if (e.key == path) fail_at(ctx, "dataset ", quote_name(path), " is listed twice");
  }
  out.entries.push_back({path, std::move(name), info.dtype_name, info.shape, optimizer});
  if (data && info.dtype) out.tensors.emplace(path, read_dataset(dset.get(), info, max_bytes, ctx, path));
}

std::string weight_name(std::string name) {
  if (name.ends_with(":0")) name.resize(name.size() - 2);
  return name;
}

// The datasets below `group` ("a/b"), as paths relative to it.
std::vector<std::string> datasets_below(const std::vector<std::string>& all, const std::string& group) {
  std::vector<std::string> out;
  for (const std::string& p : all) {
    if (group.empty() || (p.size() > group.size() + 1 && p.starts_with(group) && p[group.size()] == '/')) {
      out.push_back(group.empty() ? p : p.substr(group.size() + 1));
    }
  }
  return out;
}

// tf.keras 2.x: `base` holds layer_names; each layer group holds weight_names, the
// datasets' paths relative to it. Where those attributes hold variable-length
// strings (Keras 3's legacy writer), the layers and weights are the groups and
// datasets below `base` instead (same names, HDF5's order).
void read_legacy(hid_t file, const std::string& base, bool data, size_t max_bytes, WeightFile& out,
                 const Context& ctx) {
  const std::vector<std::string> all = list_datasets(file, ctx);
  H5Id group(h5_check(H5Gopen2(file, base.empty() ? "/" : base.c_str(), H5P_DEFAULT), ctx, "group /" + base));
  const std::string prefix = base.empty() ? "" : base + "/";
  auto layers = read_string_attr(group.get(), "layer_names", ctx);
  if (!layers) {
    layers.emplace();
    for (const std::string& p : datasets_below(all, base)) {
      const std::string layer = p.substr(0, p.find('/'));
      if (layer == p || (base.empty() && layer == "optimizer_weights")) continue;
      if (std::find(layers->begin(), layers->end(), layer) == layers->end()) layers->push_back(layer);
    }
  }
  for (const std::string& layer : *layers) {
    const std::string lpath = prefix + layer;
    H5Id lg(h5_check(H5Gopen2(file, lpath.c_str(), H5P_DEFAULT), ctx, "layer group " + quote_name(lpath)));
    if (!has_attr(lg.get(), "weight_names", ctx)) fail_at(ctx, "layer group ", quote_name(lpath), " has no weight_names attribute");
    const auto names = read_string_attr(lg.get(), "weight_names", ctx).value_or(datasets_below(all, lpath));
    for (const std::string& w : names) add_dataset(file, lpath + "/" + w, weight_name(w), false, data, max_bytes, out, ctx);
  }
  if (H5Lexists(file, "optimizer_weights", H5P_DEFAULT) > 0) {
    H5Id og(h5_check(H5Gopen2(file, "optimizer_weights", H5P_DEFAULT), ctx, "group optimizer_weights"));
    const auto names = read_string_attr(og.get(), "weight_names", ctx).value_or(datasets_below(all, "optimizer_weights"));
    for (const std::string& w : names) {
      add_dataset(file, "optimizer_weights/" + w, weight_name(w), true, data, max_bytes, out, ctx);
    }
  }
}

}  // namespace

// Runs in the reader process (hdf5_reader_process.cc) without hdf5_lock().
WeightFile read_keras_h5(std::span<const std::byte> bytes, bool data, const Context& ctx) {
  H5Id file = open_hdf5_image(bytes, ctx);
  // A hostile header may claim huge datasets; real weights never exceed the file
  // (Keras does not compress them), so allow 64x the file plus 1 MiB.
  const size_t max_bytes = bytes.size() * 64 + (size_t{1} << 20);
  WeightFile out;
  H5Id root(h5_check(H5Gopen2(file.get(), "/", H5P_DEFAULT), ctx, "root group"));
  if (has_attr(root.get(), "layer_names", ctx)) {
    read_legacy(file.get(), "", data, max_bytes, out, ctx);  // tf.keras save_weights("x.h5")
  } else if (H5Lexists(file.get(), "model_weights", H5P_DEFAULT) > 0) {
    read_legacy(file.get(), "model_weights", data, max_bytes, out, ctx);  // tf.keras model.save("x.h5")
  } else {
    for (const std::string& path : list_datasets(file.get(), ctx)) {  // Keras 3 .weights.h5
      add_dataset(file.get(), path, path, path.starts_with("optimizer/"), data, max_bytes, out, ctx);
    }
  }
  return out;
}

namespace {

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
  H5Id dset(H5Dcreate2(file, name.c_str(), type, space.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
  if (!dset.valid()) fail_at<IOError>(ctx, "cannot create dataset ", quote_name(name), ": ", hdf5_error_text());
  const Tensor c = tensor.contiguous();
  if (c.numel() > 0 && H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.raw_data()) < 0) {
    fail_at<IOError>(ctx, "cannot write dataset ", quote_name(name), ": ", hdf5_error_text());
  }
}

}  // namespace
}  // namespace detail

WeightFile parse_keras_h5(std::span<const std::byte> bytes, const std::string& source) {
  return detail::read_keras_h5_isolated(bytes, true, detail::Context{"parse_keras_h5", source});
}

WeightFile load_keras_h5(const std::filesystem::path& path) {
  const detail::Context ctx{"load_keras_h5", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_keras_h5_isolated({file->data(), file->nbytes()}, true, ctx);
}

std::vector<CheckpointEntry> inspect_keras_h5(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect_keras_h5", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_keras_h5_isolated({file->data(), file->nbytes()}, false, ctx).entries;
}

void save_keras_weights_h5(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  const detail::Context ctx{"save_keras_weights_h5", path.string()};
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos) {
      detail::fail_at<ValueError>(ctx, "invalid dataset path ", detail::quote_name(name));
    }
    (void)t;
  }
  auto lock = detail::hdf5_lock();
  detail::H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!file.valid()) detail::fail_at<IOError>(ctx, "cannot create: ", detail::hdf5_error_text());
  detail::H5Id lcpl(detail::h5_check(H5Pcreate(H5P_LINK_CREATE), ctx, "H5Pcreate"));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  for (const auto& [name, t] : tensors) detail::write_dataset(file.get(), lcpl.get(), name, t, ctx);
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) detail::fail_at<IOError>(ctx, detail::hdf5_error_text());
}

}  // namespace qkv::io
