// Keras weight files in HDF5: Keras 3 .weights.h5 (every dataset, by path) and
// tf.keras 2.x .h5 (layer_names / weight_names attributes, model or weights-only
// files), read from an in-memory image through libhdf5. The writers are in
// hdf5_keras_writer.cc.
#include <algorithm>

#include "io/keras_tf/hdf5_internal.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace detail {
namespace {

// How groups and datasets are opened: never through an external link (local_access).
struct Access {
  H5Id group, dataset;
};

// Reads (when `data`) and lists the dataset at `path`.
void add_dataset(hid_t file, const Access& access, const std::string& path, std::string name, bool optimizer, bool data,
                 size_t max_bytes, WeightFile& out, const Context& ctx) {
  const hid_t id = H5Dopen2(file, path.c_str(), access.dataset.get());
  H5L_info_t link;
  if (id < 0 && H5Lget_info(file, path.c_str(), &link, access.dataset.get()) >= 0 && link.type == H5L_TYPE_EXTERNAL) {
    fail_at(ctx, "dataset ", quote_name(path), " is an external link to another file; qkv reads only data inside it");
  }
  H5Id dset(h5_check(id, ctx, "dataset " + quote_name(path)));
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
void read_legacy(hid_t file, const Access& access, const std::string& base, bool data, size_t max_bytes,
                 WeightFile& out, const Context& ctx) {
  const std::vector<std::string> all = list_datasets(file, ctx);
  H5Id group(h5_check(H5Gopen2(file, base.empty() ? "/" : base.c_str(), access.group.get()), ctx, "group /" + base));
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
    H5Id lg(h5_check(H5Gopen2(file, lpath.c_str(), access.group.get()), ctx, "layer group " + quote_name(lpath)));
    if (!has_attr(lg.get(), "weight_names", ctx))
      fail_at(ctx, "layer group ", quote_name(lpath), " has no weight_names attribute");
    const auto names = read_string_attr(lg.get(), "weight_names", ctx).value_or(datasets_below(all, lpath));
    for (const std::string& w : names)
      add_dataset(file, access, lpath + "/" + w, weight_name(w), false, data, max_bytes, out, ctx);
  }
  if (H5Lexists(file, "optimizer_weights", H5P_DEFAULT) > 0) {
    H5Id og(h5_check(H5Gopen2(file, "optimizer_weights", access.group.get()), ctx, "group optimizer_weights"));
    const auto names =
        read_string_attr(og.get(), "weight_names", ctx).value_or(datasets_below(all, "optimizer_weights"));
    for (const std::string& w : names) {
      add_dataset(file, access, "optimizer_weights/" + w, weight_name(w), true, data, max_bytes, out, ctx);
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
  const Access access{local_access(H5P_GROUP_ACCESS, ctx), local_access(H5P_DATASET_ACCESS, ctx)};
  H5Id root(h5_check(H5Gopen2(file.get(), "/", access.group.get()), ctx, "root group"));
  if (has_attr(root.get(), "layer_names", ctx)) {
    read_legacy(file.get(), access, "", data, max_bytes, out, ctx);  // tf.keras save_weights("x.h5")
  } else if (H5Lexists(file.get(), "model_weights", H5P_DEFAULT) > 0) {
    read_legacy(file.get(), access, "model_weights", data, max_bytes, out, ctx);  // tf.keras model.save("x.h5")
  } else {
    for (const std::string& path : list_datasets(file.get(), ctx)) {  // Keras 3 .weights.h5
      add_dataset(file.get(), access, path, path, path.starts_with("optimizer/"), data, max_bytes, out, ctx);
    }
  }
  return out;
}

}  // namespace detail

WeightFile parse_keras_h5(std::span<const std::byte> bytes, const std::string& source) {
  return detail::read_keras_h5_isolated(bytes, true, detail::Context{"parse_keras_h5", source});
}

WeightFile load_keras_h5(const std::filesystem::path& path) {
  const detail::Context ctx{"load_keras_h5", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_keras_h5_isolated({file->data(), file->nbytes()}, true, ctx);
}

std::vector<TensorInfo> inspect_keras_h5(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect_keras_h5", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_keras_h5_isolated({file->data(), file->nbytes()}, false, ctx).entries;
}

}  // namespace qkv::io
