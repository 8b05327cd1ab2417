// qkv._qkv's heatmaps (qkv/heatmap.h); python/qkv/plot.py gives them their signature.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "interrupt.h"
#include "qkv/heatmap.h"
#include "tensor_convert.h"

namespace nb = nanobind;

namespace {

// The image as a NumPy uint8 array [height, width, 3]; written to `path` unless it is empty.
nb::object heatmap(nb::handle weights, const std::string& path, std::optional<int64_t> index, int64_t cell, bool labels,
                   const std::vector<std::string>& query_labels, const std::vector<std::string>& key_labels,
                   std::optional<double> vmax) {
  const qkv::Tensor w = qkv::python::to_tensor(weights, "heatmap: weights");
  qkv::io::HeatmapOptions o;
  o.index = index, o.cell = cell, o.labels = labels, o.vmax = vmax;
  o.query_labels = query_labels, o.key_labels = key_labels;
  qkv::io::Image im;
  {
    qkv::python::InterruptibleRelease release;
    im = qkv::io::render_heatmap(w, o);
    if (!path.empty()) qkv::io::write_png(path, im);
  }
  qkv::Tensor rgb = qkv::Tensor::empty({im.height, im.width, 3}, qkv::DType::i32);
  std::copy(im.rgb.begin(), im.rgb.end(), rgb.data<int32_t>());
  return qkv::python::numpy().attr("asarray")(qkv::python::to_numpy(rgb), "uint8");
}

}  // namespace

void bind_plot(nb::module_& m) {
  m.def("_heatmap", &heatmap, nb::arg("weights"), nb::arg("path"), nb::arg("index").none(), nb::arg("cell"),
        nb::arg("labels"), nb::arg("query_labels"), nb::arg("key_labels"), nb::arg("vmax").none());
}
