// The .keras archive: a zip (stored or deflated members) of config.json,
// metadata.json and model.weights.h5. The central directory is parsed here with
// every offset and size checked; deflate goes through zlib; crc32s are checked.
#include <zlib.h>

#include <algorithm>

#include "io/io_internal.h"
#include "io/keras_tf/hdf5_internal.h"
#include "io/keras_tf/keras_config.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace detail {
namespace {

constexpr uint32_t kEndOfCentralDir = 0x06054b50, kCentralHeader = 0x02014b50, kLocalHeader = 0x04034b50;

uint32_t le(std::span<const std::byte> b, size_t at, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(b[at + static_cast<size_t>(i)]);
  return v;
}

struct ZipMember {
  std::string name;
  uint32_t method = 0, flags = 0, crc = 0, compressed = 0, size = 0, local_offset = 0;
};

// The central directory's entries, after locating and checking the end record.
std::vector<ZipMember> central_directory(std::span<const std::byte> zip, const Context& ctx) {
  if (zip.size() < 22) fail_at(ctx, "not a zip file (", zip.size(), " bytes, shorter than an end record)");
  size_t eocd = zip.size() - 22;
  const size_t lowest = zip.size() > 22 + 65535 ? zip.size() - 22 - 65535 : 0;
  while (le(zip, eocd, 4) != kEndOfCentralDir) {
    if (eocd == lowest) fail_at(ctx, "not a zip file (no end of central directory record)");
    --eocd;
  }
  const uint32_t count = le(zip, eocd + 10, 2), cd_size = le(zip, eocd + 12, 4), cd_offset = le(zip, eocd + 16, 4);
  if (le(zip, eocd + 4, 2) != 0 || le(zip, eocd + 6, 2) != 0 || le(zip, eocd + 8, 2) != count) {
    fail_at(ctx, "multi-disk zip archives are not supported");
  }
  if (cd_offset == 0xffffffffu || count == 0xffffu) fail_at(ctx, "zip64 archives are not supported");
  if (cd_offset > eocd || cd_size > eocd - cd_offset) {
    fail_at(ctx, "central directory [", cd_offset, ", +", cd_size, ") runs past its end record at ", eocd);
  }
  std::vector<ZipMember> out;
  size_t pos = cd_offset;
  const size_t end = size_t{cd_offset} + cd_size;
  for (uint32_t i = 0; i < count; ++i) {
    if (end - pos < 46 || le(zip, pos, 4) != kCentralHeader)
      fail_at(ctx, "central directory entry ", i, " is malformed");
    ZipMember m;
    m.flags = le(zip, pos + 8, 2);
    m.method = le(zip, pos + 10, 2);
    m.crc = le(zip, pos + 16, 4);
    m.compressed = le(zip, pos + 20, 4);
    m.size = le(zip, pos + 24, 4);
    m.local_offset = le(zip, pos + 42, 4);
    const size_t n = le(zip, pos + 28, 2), extra = le(zip, pos + 30, 2), comment = le(zip, pos + 32, 2);
    if (end - pos - 46 < n + extra + comment) fail_at(ctx, "central directory entry ", i, " runs past the directory");
    m.name.assign(reinterpret_cast<const char*>(zip.data() + pos + 46), n);
    pos += 46 + n + extra + comment;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::byte> inflate_raw(std::span<const std::byte> in, size_t size, const Context& ctx,
                                   const std::string& name) {
  std::vector<std::byte> out(std::max<size_t>(size, 1));  // zlib refuses a null next_out (an empty member)
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail_at(ctx, "zlib inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(size);
  const int rc = inflate(&z, Z_FINISH);
  const uLong produced = z.total_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != size) {
    fail_at(ctx, "member ", quote_name(name), ": deflate data is corrupt or does not inflate to ", size, " bytes");
  }
  out.resize(size);
  return out;
}

// A member's bytes: a stored member's are a view into the zip (no copy; valid while the
// zip is), a deflated member's are inflated (`deflated`, not `inflated.empty()`, tells them
// apart: an empty deflated member would read as its deflate stream).
struct MemberBytes {
  std::span<const std::byte> stored;
  std::vector<std::byte> inflated;
  bool deflated = false;
  std::span<const std::byte> bytes() const { return deflated ? std::span<const std::byte>(inflated) : stored; }
};

MemberBytes extract(std::span<const std::byte> zip, const ZipMember& m, const Context& ctx) {
  const std::string what = "member " + quote_name(m.name);
  if ((m.flags & 1u) != 0) fail_at(ctx, what, " is encrypted");
  if (m.compressed == 0xffffffffu || m.size == 0xffffffffu) fail_at(ctx, what, ": zip64 sizes are not supported");
  const size_t at = m.local_offset;
  if (at > zip.size() || zip.size() - at < 30 || le(zip, at, 4) != kLocalHeader) {
    fail_at(ctx, what, ": no local header at offset ", at);
  }
  const size_t data = at + 30 + le(zip, at + 26, 2) + le(zip, at + 28, 2);
  if (data > zip.size() || m.compressed > zip.size() - data) fail_at(ctx, what, ": data runs past the end of the file");
  const auto raw = zip.subspan(data, m.compressed);
  MemberBytes out;
  if (m.method == 0) {
    if (m.compressed != m.size) fail_at(ctx, what, ": stored member with sizes ", m.compressed, " != ", m.size);
    out.stored = raw;
  } else if (m.method == 8) {
    // Deflate expands at most ~1032:1; a larger claimed size is a malformed header.
    if (m.size > uint64_t{m.compressed} * 1032 + 64 || m.size > (uint32_t{1} << 30)) {
      fail_at(ctx, what, ": claims ", m.size, " bytes from ", m.compressed, " deflated bytes");
    }
    out.inflated = inflate_raw(raw, m.size, ctx, m.name);
    out.deflated = true;
  } else {
    fail_at(ctx, what, ": compression method ", m.method, " (qkv reads stored and deflated members)");
  }
  const auto crc = static_cast<uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(out.bytes().data()), static_cast<uInt>(out.bytes().size())));
  if (crc != m.crc) fail_at(ctx, what, ": crc32 mismatch");
  return out;
}

std::optional<MemberBytes> find_member(std::span<const std::byte> zip, const std::string& name, const Context& ctx) {
  for (const ZipMember& m : central_directory(zip, ctx)) {
    if (m.name == name) return extract(zip, m, ctx);
  }
  return std::nullopt;
}

std::string as_text(const MemberBytes& m) {
  return {reinterpret_cast<const char*>(m.bytes().data()), m.bytes().size()};
}

// The archive's members; model.weights.h5 read as parse_keras_h5 reads it (its errors name
// "parse_keras_h5: <source>:model.weights.h5"), its tensors only when `data` (else the
// listing alone: inspect_keras_archive).
KerasArchive read_archive(std::span<const std::byte> zip, bool data, const Context& ctx) {
  KerasArchive a;
  const auto config = find_member(zip, "config.json", ctx);
  if (!config) fail_at(ctx, "no config.json in the archive");
  a.config_json = as_text(*config);
  check_keras_config(a.config_json, "config.json", ctx);
  if (const auto meta = find_member(zip, "metadata.json", ctx)) a.metadata_json = as_text(*meta);
  const auto weights = find_member(zip, "model.weights.h5", ctx);
  if (!weights) fail_at(ctx, "no model.weights.h5 in the archive");
  a.weights =
      read_keras_h5_isolated(weights->bytes(), data, Context{"parse_keras_h5", ctx.source + ":model.weights.h5"});
  return a;
}

}  // namespace
}  // namespace detail

std::vector<std::byte> zip_member(std::span<const std::byte> zip, const std::string& name, const std::string& source) {
  const detail::Context ctx{"zip_member", source};
  auto m = detail::find_member(zip, name, ctx);
  if (!m) detail::fail_at(ctx, "no member named ", detail::quote_name(name));
  if (!m->deflated) return {m->stored.begin(), m->stored.end()};  // a view into `zip`: copied
  return std::move(m->inflated);
}

void check_keras_config(std::string_view config_json, const std::string& source) {
  detail::check_keras_config(config_json, "config.json", detail::Context{"check_keras_config", source});
}

KerasArchive parse_keras_archive(std::span<const std::byte> bytes, const std::string& source) {
  return detail::read_archive(bytes, true, detail::Context{"parse_keras_archive", source});
}

KerasArchive load_keras_archive(const std::filesystem::path& path) {
  const detail::Context ctx{"load_keras_archive", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_archive({file->data(), file->nbytes()}, true, ctx);
}

std::vector<TensorInfo> inspect_keras_archive(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect_keras_archive", path.string()};
  const auto file = detail::read_file(path, ctx);
  return detail::read_archive({file->data(), file->nbytes()}, false, ctx).weights.entries;
}

}  // namespace qkv::io
