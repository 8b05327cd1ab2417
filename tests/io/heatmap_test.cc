// Heatmaps (qkv/heatmap.h): cell geometry and colors against matplotlib's viridis stops,
// PNG round trips through libpng's reader, labels' margins, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "common/expect.h"
#include "qkv/heatmap.h"
#include "qkv/size.h"

namespace qkv::io {
namespace {

using Rgb = std::array<uint8_t, 3>;

// matplotlib.cm.viridis at 0, 0.25, 0.5, 0.75, 1 (its hex codes #440154 #3b528b #21918c #5ec962 #fde725).
TEST(Heatmap, ViridisHitsMatplotlibsStops) {
  EXPECT_EQ(viridis(0.0), (Rgb{68, 1, 84}));
  EXPECT_EQ(viridis(0.25), (Rgb{59, 82, 139}));
  EXPECT_EQ(viridis(0.5), (Rgb{33, 145, 140}));
  EXPECT_EQ(viridis(0.75), (Rgb{94, 201, 98}));
  EXPECT_EQ(viridis(1.0), (Rgb{253, 231, 37}));
  EXPECT_EQ(viridis(-3.0), viridis(0.0));
  EXPECT_EQ(viridis(7.0), viridis(1.0));
}

TEST(Heatmap, CellsAreSquaresOfTheirValueColor) {
  // [2, 3]: values 0 .. 1 in steps of 0.2, NaN last
  const Tensor w = Tensor::from_vector<double>({0.0, 0.25, 0.5, 0.75, 1.0, NAN}, {2, 3});
  HeatmapOptions o;
  o.cell = 4;
  o.labels = false;
  const Image im = render_heatmap(w, o);
  ASSERT_EQ(im.width, 12);
  ASSERT_EQ(im.height, 8);
  const std::vector<Rgb> want = {viridis(0), viridis(0.25), viridis(0.5), viridis(0.75), viridis(1), {255, 0, 0}};
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t p = 0; p < 16; ++p) EXPECT_EQ(im.pixel(j * 4 + p % 4, i * 4 + p / 4), want[i * 3 + j]);
    }
  }
}

TEST(Heatmap, LeadingDimsAreAveragedOrIndexed) {
  const Tensor w = Tensor::from_vector<float>({0, 1, 1, 1, /* slice 1 */ 1, 1, 1, 1}, {2, 2, 2});
  HeatmapOptions o;
  o.cell = 1;
  o.labels = false;
  EXPECT_EQ(render_heatmap(w, o).pixel(0, 0), viridis(0.5));  // mean of 0 and 1
  o.index = 1;
  EXPECT_EQ(render_heatmap(w, o).pixel(0, 0), viridis(1.0));
  o.index = 2;
  EXPECT_THROW_WITH(render_heatmap(w, o), ShapeError, "heatmap: index 2 is outside the 2 [Lq, Lk] slices of [2, 2, 2]");
}

TEST(Heatmap, LabelsAddMarginsAndInk) {
  const Tensor w = Tensor::from_vector<double>({0, 1, 1, 0}, {2, 2});
  HeatmapOptions o;
  o.cell = 10;
  o.query_labels = {"the", "cat"};
  o.key_labels = {"a", "bb"};
  const Image im = render_heatmap(w, o);
  EXPECT_EQ(im.width, 3 * 4 + 2 + 20);   // 3 chars of 4 px, then 2 cells
  EXPECT_EQ(im.height, 2 * 6 + 2 + 20);  // 2 stacked chars of 6 px, then 2 rows
  EXPECT_EQ(im.pixel(14, 14), viridis(0));
  EXPECT_EQ(im.pixel(24, 14), viridis(1));
  int64_t ink = 0;  // black pixels of the labels
  for (int64_t y = 0; y < im.height; ++y) {
    for (int64_t x = 0; x < im.width; ++x) ink += im.pixel(x, y) == Rgb{0, 0, 0};
  }
  EXPECT_GT(ink, 20);
  o.key_labels = {"one"};
  EXPECT_THROW_WITH(render_heatmap(w, o), ValueError, "heatmap: 1 labels for 2 keys");
  EXPECT_THROW_WITH(render_heatmap(Tensor::zeros({3}), o), ShapeError, "heatmap: weights must be [..., Lq, Lk]");
}

TEST(Heatmap, PngRoundTripsThroughLibpng) {
  const Tensor w = Tensor::uniform({5, 7}, 3);
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "qkv_heatmap_test.png";
  write_heatmap_png(path, w);
  const Image back = read_png(path), want = render_heatmap(w);
  EXPECT_EQ(back.width, want.width);
  EXPECT_EQ(back.height, want.height);
  EXPECT_EQ(back.rgb, want.rgb);
  std::filesystem::remove(path);
  EXPECT_THROW_WITH(write_heatmap_png("/nonexistent-dir/x.png", w), IOError,
                    "write_png: /nonexistent-dir/x.png: cannot open for writing: No such file or directory");
  EXPECT_THROW_WITH(read_png("/nonexistent-dir/x.png"), IOError, "read_png: cannot read");
}

// An image wider or taller than libpng writes (10^6 pixels) is a ValueError naming the
// cells and --cell, before any pixel is allocated: 1 x 200000 cells of 6 pixels failed in
// libpng ('write_png: ... Invalid IHDR data'), of 256 pixels with std::bad_alloc.
TEST(Heatmap, ImagesPastPngsLimitAreRefusedByTheirSize) {
  const Tensor wide = Tensor::ones({1, 200000});
  HeatmapOptions o;
  o.labels = false;
  o.cell = 5;  // 10^6 pixels exactly: written
  EXPECT_EQ(render_heatmap(wide, o).width, 1'000'000);
  for (const int64_t cell : {6, 256}) {
    o.cell = cell;
    EXPECT_THROW_WITH((void)render_heatmap(wide, o), ValueError, "heatmap: 1 x 200000 cells of");
    EXPECT_THROW_WITH((void)render_heatmap(wide.reshape({200000, 1}), o), ValueError, "pixels tall");
  }
  // 2 key cells whose product passes int64, or checked_mul's 2^62; and one cell that fits
  // but passes the limit with the query labels' margin (10 pixels): the same refusal.
  o.labels = true;
  for (const int64_t cell : {std::numeric_limits<int64_t>::max(), (int64_t{1} << 61) + 1}) {
    o.cell = cell;
    EXPECT_THROW_WITH(
        (void)render_heatmap(Tensor::ones({1, 2}), o), ValueError,
        "heatmap: 1 x 2 cells of " + std::to_string(cell) + " pixels make an image more than 1000000 pixels wide");
  }
  o.cell = 999'995;
  EXPECT_THROW_WITH((void)render_heatmap(Tensor::ones({2, 1}), o), ValueError,
                    "heatmap: 2 x 1 cells of 999995 pixels make an image more than 1000000 pixels wide");
  o.labels = false;
  o.cell = 256;  // 2000 x 2000 cells: sides within the limit, bytes past the allocation limit
  set_max_alloc_bytes(size_t{1} << 30);
  EXPECT_THROW_WITH((void)render_heatmap(Tensor::ones({2000, 2000}), o), OutOfMemoryError,
                    "render_heatmap: image of 512000 x 512000 pixels");
  set_max_alloc_bytes(std::nullopt);
}

}  // namespace
}  // namespace qkv::io
