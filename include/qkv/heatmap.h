// Heatmaps of attention weights and mask patterns as PNG images (libpng): `qkv heatmap`,
// `qkv.plot.heatmap`, and the pictures of docs/attention-variants.md and docs/attention-variants-lsh.md.
//
// Layout: one square cell of `cell` pixels per (query row, key column), query i down, key j
// across, colored by viridis (matplotlib's default map: the dark purple of 0 to the yellow
// of vmax); NaN cells are red. With labels, token labels (indices by default, or the given
// tokens, upper-cased in a 3x5 pixel font, every n-th when cells are smaller than a glyph)
// run down the left side for queries and, written top to bottom, along the top for keys.
// Errors: ShapeError for weights of rank < 2 or an index outside the leading dims, ValueError
// for labels of the wrong count, IOError naming the file.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::io {

struct HeatmapOptions {
  std::optional<int64_t> index;           // which [Lq, Lk] slice (leading dims flattened); none: their mean
  int64_t cell = 0;                       // pixels per cell; 0: automatic (about 512 px, 1 to 32)
  bool labels = true;                     // token labels on the axes
  std::vector<std::string> query_labels;  // Lq labels (default: 0, 1, ...)
  std::vector<std::string> key_labels;    // Lk labels (default: 0, 1, ...)
  std::optional<double> vmax;             // value of the top color (default: the largest value; 0 -> 1)
};

struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
  std::array<uint8_t, 3> pixel(int64_t x, int64_t y) const;
};

// Weights [..., Lq, Lk] (any floating or bool dtype) as an image. ValueError for an image
// more than 10^6 pixels wide or tall (libpng's limit: a smaller cell), OutOfMemoryError
// for one past the allocation limit (qkv/size.h), both before any pixel is allocated.
Image render_heatmap(const Tensor& weights, const HeatmapOptions& options = {});
// render_heatmap, written as an 8-bit RGB PNG.
void write_heatmap_png(const std::filesystem::path& path, const Tensor& weights, const HeatmapOptions& options = {});

// ValueError for an extension other than .png (any case) or none.
void write_png(const std::filesystem::path& path, const Image& image);
Image read_png(const std::filesystem::path& path);  // any PNG libpng reads, as 8-bit RGB

// viridis at t in [0, 1] (clamped): matplotlib's map, linear between its 9 stops 1/8 apart.
std::array<uint8_t, 3> viridis(double t);

}  // namespace qkv::io
