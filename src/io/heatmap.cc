// render_heatmap (qkv/heatmap.h): cells in viridis, labels in a 3x5 pixel font.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "qkv/error.h"
#include "qkv/heatmap.h"
#include "qkv/size.h"

namespace qkv::io {

namespace {

constexpr const char* kOp = "heatmap";

// 3x5 glyphs, rows top to bottom, 3 bits each (4 = left pixel): digits, letters, punctuation.
struct Glyph {
  char c;
  uint8_t rows[5];
};
constexpr Glyph kFont[] = {
    {'0', {7, 5, 5, 5, 7}},  {'1', {2, 6, 2, 2, 7}}, {'2', {7, 1, 7, 4, 7}}, {'3', {7, 1, 7, 1, 7}},
    {'4', {5, 5, 7, 1, 1}},  {'5', {7, 4, 7, 1, 7}}, {'6', {7, 4, 7, 5, 7}}, {'7', {7, 1, 1, 1, 1}},
    {'8', {7, 5, 7, 5, 7}},  {'9', {7, 5, 7, 1, 7}}, {'A', {2, 5, 7, 5, 5}}, {'B', {6, 5, 6, 5, 6}},
    {'C', {3, 4, 4, 4, 3}},  {'D', {6, 5, 5, 5, 6}}, {'E', {7, 4, 6, 4, 7}}, {'F', {7, 4, 6, 4, 4}},
    {'G', {3, 4, 5, 5, 3}},  {'H', {5, 5, 7, 5, 5}}, {'I', {7, 2, 2, 2, 7}}, {'J', {1, 1, 1, 5, 2}},
    {'K', {5, 5, 6, 5, 5}},  {'L', {4, 4, 4, 4, 7}}, {'M', {5, 7, 7, 5, 5}}, {'N', {6, 5, 5, 5, 5}},
    {'O', {2, 5, 5, 5, 2}},  {'P', {6, 5, 6, 4, 4}}, {'Q', {2, 5, 5, 6, 3}}, {'R', {6, 5, 6, 5, 5}},
    {'S', {3, 4, 2, 1, 6}},  {'T', {7, 2, 2, 2, 2}}, {'U', {5, 5, 5, 5, 7}}, {'V', {5, 5, 5, 5, 2}},
    {'W', {5, 5, 7, 7, 5}},  {'X', {5, 5, 2, 5, 5}}, {'Y', {5, 5, 2, 2, 2}}, {'Z', {7, 1, 2, 4, 7}},
    {' ', {0, 0, 0, 0, 0}},  {'.', {0, 0, 0, 0, 2}}, {',', {0, 0, 0, 2, 4}}, {'-', {0, 0, 7, 0, 0}},
    {'_', {0, 0, 0, 0, 7}},  {':', {0, 2, 0, 2, 0}}, {'/', {1, 1, 2, 4, 4}}, {'<', {1, 2, 4, 2, 1}},
    {'>', {4, 2, 1, 2, 4}},  {'#', {5, 7, 5, 7, 5}}, {'?', {7, 1, 2, 0, 2}}, {'!', {2, 2, 2, 0, 2}},
    {'\'', {2, 2, 0, 0, 0}}, {'(', {1, 2, 2, 2, 1}}, {')', {4, 2, 2, 2, 4}}, {'[', {3, 2, 2, 2, 3}},
    {']', {6, 2, 2, 2, 6}},  {'=', {0, 7, 0, 7, 0}}, {'+', {0, 2, 7, 2, 0}}, {'*', {0, 5, 2, 5, 0}},
};

const Glyph& glyph(char c) {
  const char u = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  for (const Glyph& g : kFont) {
    if (g.c == u) return g;
  }
  return glyph('?');
}

struct Canvas {
  Image& im;
  void set(int64_t x, int64_t y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= im.width || y >= im.height) return;
    std::copy(c.begin(), c.end(), im.rgb.begin() + (y * im.width + x) * 3);
  }
  void text_char(int64_t x, int64_t y, char ch, int64_t scale) {
    const Glyph& g = glyph(ch);
    for (int64_t r = 0; r < 5; ++r) {
      for (int64_t c = 0; c < 3; ++c) {
        if (!((g.rows[r] >> (2 - c)) & 1)) continue;
        for (int64_t a = 0; a < scale * scale; ++a)
          set(x + c * scale + a % scale, y + r * scale + a / scale, {0, 0, 0});
      }
    }
  }
};

// The [Lq, Lk] values to draw: one slice of the leading dims, or their mean.
std::vector<double> slice_values(const Tensor& w, const HeatmapOptions& o, int64_t& lq, int64_t& lk) {
  if (w.dim() < 2) fail<ShapeError>(kOp, ": weights must be [..., Lq, Lk], got ", shape_str(w.shape()));
  lq = w.size(-2), lk = w.size(-1);
  const int64_t n = lq * lk, slices = lq * lk == 0 ? 0 : w.numel() / n;
  if (o.index && (*o.index < 0 || *o.index >= slices)) {
    fail<ShapeError>(kOp, ": index ", *o.index, " is outside the ", slices, " [Lq, Lk] slices of ",
                     shape_str(w.shape()));
  }
  const std::vector<double> all = w.contiguous().to_vector<double>();
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t s = 0; s < slices; ++s) {
    if (o.index && s != *o.index) continue;
    for (int64_t e = 0; e < n; ++e) out[e] += all[s * n + e] / (o.index ? 1.0 : static_cast<double>(slices));
  }
  return out;
}

std::vector<std::string> labels_of(const std::vector<std::string>& given, int64_t n, const char* what) {
  if (given.empty()) {
    std::vector<std::string> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(std::to_string(i));
    return out;
  }
  if (static_cast<int64_t>(given.size()) != n) {
    fail<ValueError>(kOp, ": ", given.size(), " labels for ", n, " ", what);
  }
  return given;
}

size_t longest(const std::vector<std::string>& v) {
  size_t n = 0;
  for (const std::string& s : v) n = std::max(n, s.size());
  return n;
}

}  // namespace

std::array<uint8_t, 3> viridis(double t) {
  // matplotlib's viridis at 0, 1/8, ..., 1 (#440154 #472d7b #3b528b #2c728e #21918c #28ae80
  // #5ec962 #addc30 #fde725).
  static constexpr uint8_t kStops[9][3] = {{68, 1, 84},    {71, 45, 123},  {59, 82, 139},
                                           {44, 114, 142}, {33, 145, 140}, {40, 174, 128},
                                           {94, 201, 98},  {173, 220, 48}, {253, 231, 37}};
  const double x = std::clamp(std::isnan(t) ? 0.0 : t, 0.0, 1.0) * 8.0;
  const int i = std::min(7, static_cast<int>(x));
  const double f = x - i;
  std::array<uint8_t, 3> c{};
  for (int k = 0; k < 3; ++k) c[k] = static_cast<uint8_t>(std::lround(kStops[i][k] * (1 - f) + kStops[i + 1][k] * f));
  return c;
}

namespace {

// One side of the image: the labels' margin plus n cells, at most libpng's 10^6 pixels
// (its default user limit; above it png_set_IHDR failed with 'Invalid IHDR data', and
// a larger --cell ran out of memory first, 'std::bad_alloc').
// n * cell through checked_mul (qkv/size.h), nullopt past 2^62; the margin (label text,
// a few pixels a character) is then compared, not added, so nothing can overflow.
int64_t image_side(int64_t margin, int64_t n, int64_t cell, const char* side, int64_t lq, int64_t lk) {
  constexpr int64_t kMaxSide = 1'000'000;
  const std::optional<int64_t> cells = checked_mul(n, cell);
  if (!cells || *cells > kMaxSide - margin) {
    fail<ValueError>("heatmap: ", lq, " x ", lk, " cells of ", cell, " pixels make an image more than ", kMaxSide,
                     " pixels ", side, " (PNG writers' limit); give a smaller cell size (--cell)");
  }
  return std::max<int64_t>(*cells + margin, 1);
}

}  // namespace

Image render_heatmap(const Tensor& weights, const HeatmapOptions& o) {
  int64_t lq = 0, lk = 0;
  const std::vector<double> v = slice_values(weights, o, lq, lk);
  const auto qlabels = o.labels ? labels_of(o.query_labels, lq, "queries") : std::vector<std::string>{};
  const auto klabels = o.labels ? labels_of(o.key_labels, lk, "keys") : std::vector<std::string>{};
  const int64_t cell = o.cell > 0 ? o.cell : std::clamp<int64_t>(512 / std::max<int64_t>({lq, lk, 1}), 1, 32);
  const int64_t fs = cell >= 12 ? 2 : 1;  // font scale
  const int64_t left = o.labels ? static_cast<int64_t>(longest(qlabels)) * 4 * fs + 2 : 0;
  const int64_t top = o.labels ? static_cast<int64_t>(longest(klabels)) * 6 * fs + 2 : 0;
  double vmax = o.vmax.value_or(0.0);
  if (!o.vmax) {
    for (double x : v) vmax = std::isnan(x) ? vmax : std::max(vmax, x);
  }
  if (vmax <= 0.0) vmax = 1.0;
  Image im;
  im.width = image_side(left, lk, cell, "wide", lq, lk);
  im.height = image_side(top, lq, cell, "tall", lq, lk);
  const auto nbytes = static_cast<size_t>(im.width) * static_cast<size_t>(im.height) * 3;  // each side <= 10^6
  check_alloc_bytes(nbytes,
                    "image of " + std::to_string(im.width) + " x " + std::to_string(im.height) + " pixels (RGB)",
                    "render_heatmap");
  im.rgb.assign(nbytes, 255);
  Canvas cv{im};
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t j = 0; j < lk; ++j) {
      const double x = v[i * lk + j];
      const auto c = std::isnan(x) ? std::array<uint8_t, 3>{255, 0, 0} : viridis(x / vmax);
      for (int64_t p = 0; p < cell * cell; ++p) cv.set(left + j * cell + p % cell, top + i * cell + p / cell, c);
    }
  }
  const int64_t row_step = (5 * fs + 1 + cell - 1) / cell, col_step = (3 * fs + 1 + cell - 1) / cell;
  for (int64_t i = 0; i < static_cast<int64_t>(qlabels.size()); i += row_step) {
    for (size_t c = 0; c < qlabels[i].size(); ++c)
      cv.text_char(1 + static_cast<int64_t>(c) * 4 * fs, top + i * cell, qlabels[i][c], fs);
  }
  for (int64_t j = 0; j < static_cast<int64_t>(klabels.size()); j += col_step) {
    for (size_t c = 0; c < klabels[j].size(); ++c)
      cv.text_char(left + j * cell, 1 + static_cast<int64_t>(c) * 6 * fs, klabels[j][c], fs);
  }
  return im;
}

void write_heatmap_png(const std::filesystem::path& path, const Tensor& weights, const HeatmapOptions& options) {
  write_png(path, render_heatmap(weights, options));
}

}  // namespace qkv::io
