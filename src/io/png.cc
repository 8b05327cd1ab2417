// write_png / read_png (qkv/heatmap.h) through libpng's simplified API (png_image).
#include <png.h>

#include <cstring>
#include <string>

#include "io/io_internal.h"
#include "qkv/ascii.h"
#include "qkv/error.h"
#include "qkv/heatmap.h"

namespace qkv::io {

std::array<uint8_t, 3> Image::pixel(int64_t x, int64_t y) const {
  if (x < 0 || y < 0 || x >= width || y >= height) {
    fail<IndexError>("Image::pixel: (", x, ", ", y, ") is outside ", width, " x ", height);
  }
  const size_t at = static_cast<size_t>((y * width + x) * 3);
  return {rgb[at], rgb[at + 1], rgb[at + 2]};
}

void write_png(const std::filesystem::path& path, const Image& image) {
  // Another extension is a slip (heatmap -o w.npy wrote PNG bytes into a .npy name, which
  // qkv.load and np.load then refused); none at all is taken as PNG, as matplotlib does.
  const std::string ext = lower_extension(path);
  if (!ext.empty() && ext != ".png") {
    fail<ValueError>("write_png: ", path.string(),
                     ": a PNG image goes to a .png file (or a name without extension), not ", ext);
  }
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width * image.height * 3)) {
    fail<ValueError>("write_png: ", path.string(), ": an image of ", image.width, " x ", image.height, " needs ",
                     image.width * image.height * 3, " RGB bytes, got ", image.rgb.size());
  }
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  // Through a temporary file (io_internal.h): a failed write leaves no partial image.
  io::detail::PendingFile out(path, io::detail::Context{"write_png", path.string()});
  if (png_image_write_to_file(&png, out.temp().c_str(), 0, image.rgb.data(), 0, nullptr) == 0) {
    const std::string why = png.message;
    png_image_free(&png);
    fail<IOError>("write_png: ", path.string(), ": cannot write: ", why);
  }
  out.commit();
}

Image read_png(const std::filesystem::path& path) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_file(&png, path.c_str()) == 0) {
    fail<IOError>("read_png: cannot read ", path.string(), ": ", png.message);
  }
  png.format = PNG_FORMAT_RGB;
  Image out;
  out.width = png.width, out.height = png.height;
  out.rgb.resize(PNG_IMAGE_SIZE(png));
  if (png_image_finish_read(&png, nullptr, out.rgb.data(), 0, nullptr) == 0) {
    const std::string why = png.message;
    png_image_free(&png);
    fail<IOError>("read_png: ", path.string(), ": ", why);
  }
  return out;
}

}  // namespace qkv::io
