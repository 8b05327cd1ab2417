// The .keras archive writer: a zip of metadata.json, config.json and
// model.weights.h5, members stored (uncompressed) in that order as Keras 3's
// saving_lib writes them, with crc32 from zlib. No zip64: the archive must stay
// under 4 GiB.
#include <zlib.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "io/io_internal.h"
#include "io/keras_tf/keras_config.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace detail {
namespace {

constexpr uint32_t kEndOfCentralDir = 0x06054b50, kCentralHeader = 0x02014b50, kLocalHeader = 0x04034b50;
constexpr uint32_t kDosDate1980 = 0x21;  // 1980-01-01, what Python's zipfile writes for writestr

struct Member {
  std::string name;
  std::span<const std::byte> data;
};

void put(std::string& out, uint32_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// The fields local and central headers share: version 2.0, no flags, stored,
// the date, crc32, sizes, name length, no extra field.
void common_fields(std::string& out, const Member& m, uint32_t crc) {
  put(out, 20, 2);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, kDosDate1980, 2);
  put(out, crc, 4);
  put(out, static_cast<uint32_t>(m.data.size()), 4);
  put(out, static_cast<uint32_t>(m.data.size()), 4);
  put(out, static_cast<uint32_t>(m.name.size()), 2);
  put(out, 0, 2);
}

std::string zip(const std::vector<Member>& members, const Context& ctx) {
  std::string out, central;
  for (const Member& m : members) {
    if (m.data.size() >= 0xffffffffu || out.size() + m.data.size() >= 0xffffffffu - 1024) {
      fail_at<ValueError>(ctx, "member ", quote_name(m.name),
                          " would take the archive past 4 GiB (zip64 is not written)");
    }
    const auto crc = static_cast<uint32_t>(
        ::crc32(0L, reinterpret_cast<const Bytef*>(m.data.data()), static_cast<uInt>(m.data.size())));
    const auto offset = static_cast<uint32_t>(out.size());
    put(out, kLocalHeader, 4);
    common_fields(out, m, crc);
    out += m.name;
    out.append(reinterpret_cast<const char*>(m.data.data()), m.data.size());
    put(central, kCentralHeader, 4);
    put(central, 20, 2);  // version made by
    common_fields(central, m, crc);
    put(central, 0, 2);  // comment length
    put(central, 0, 2);  // disk number
    put(central, 0, 2);  // internal attributes
    put(central, 0, 4);  // external attributes
    put(central, offset, 4);
    central += m.name;
  }
  const auto cd_offset = static_cast<uint32_t>(out.size());
  out += central;
  put(out, kEndOfCentralDir, 4);
  put(out, 0, 4);  // this disk, the directory's disk
  put(out, static_cast<uint32_t>(members.size()), 2);
  put(out, static_cast<uint32_t>(members.size()), 2);
  put(out, static_cast<uint32_t>(central.size()), 4);
  put(out, cd_offset, 4);
  put(out, 0, 2);  // comment length
  return out;
}

std::string default_metadata() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &utc);
  return nlohmann::ordered_json{{"keras_version", "3.15.1"}, {"date_saved", date}}.dump();
}

std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace
}  // namespace detail

void save_keras_archive(const std::filesystem::path& path, const std::map<std::string, Tensor>& weights,
                        const std::string& config_json, const std::string& metadata_json) {
  const detail::Context ctx{"save_keras_archive", path.string()};
  // Checked as load_keras_archive checks it, so that no archive is written that qkv then
  // refuses to read: past 1000 levels, a ValueError naming the limit.
  detail::check_keras_config<ValueError>(config_json, "config_json", ctx);
  // metadata.json too: Keras 3.15's load_model does not read it, but its KerasFileEditor
  // json.loads it (Python's json: about 1000 levels), and qkv writes none Keras cannot open.
  const std::string metadata = metadata_json.empty() ? detail::default_metadata() : metadata_json;
  detail::check_keras_config<ValueError>(metadata, "metadata_json", ctx);
  const std::vector<std::byte> h5 = serialize_keras_weights_h5(weights);
  const std::string archive = detail::zip({{"metadata.json", detail::as_bytes(metadata)},
                                           {"config.json", detail::as_bytes(config_json)},
                                           {"model.weights.h5", h5}},
                                          ctx);
  const std::span<const std::byte> chunks[] = {detail::as_bytes(archive)};
  detail::write_file(path, chunks, ctx);
}

}  // namespace qkv::io
