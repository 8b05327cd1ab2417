// inspect of a .keras archive (inspect_keras_archive, and inspect / inspect_weights through
// it): the listing load_keras_archive gives, without reading the tensors' data.
#include <gtest/gtest.h>
#include <zlib.h>

#include <map>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace {

using testing::fixture;
using testing::read_bytes;
using testing::temp_path;

void put_le(std::vector<std::byte>& out, uint64_t v, int n) {  // n <= 8 bytes, little-endian
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}

std::vector<std::byte> raw_deflate(const std::vector<std::byte>& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<std::byte> out(deflateBound(&z, static_cast<uLong>(in.size())));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A zip of `members` in this order, each stored (method 0) or, when `deflated`, raw-deflated
// (method 8): local headers, the central directory and its end record, as APPNOTE 4.3 lays out.
std::vector<std::byte> zip_of(const std::vector<std::pair<std::string, std::vector<std::byte>>>& members,
                              bool deflated) {
  std::vector<std::byte> out, central;
  for (const auto& [name, data] : members) {
    const std::vector<std::byte> body = deflated ? raw_deflate(data) : data;
    const auto crc =
        static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const auto offset = static_cast<uint32_t>(out.size());
    const auto header = [&](std::vector<std::byte>& to, bool local) {
      put_le(to, local ? 0x04034b50u : 0x02014b50u, 4);
      if (!local) put_le(to, 20, 2);    // version made by
      put_le(to, 20, 2);                // version needed
      put_le(to, 0, 2);                 // flags
      put_le(to, deflated ? 8 : 0, 2);  // method
      put_le(to, 0, 4);                 // time, date
      put_le(to, crc, 4);               // crc32
      put_le(to, static_cast<uint32_t>(body.size()), 4);
      put_le(to, static_cast<uint32_t>(data.size()), 4);
      put_le(to, static_cast<uint32_t>(name.size()), 2);
      put_le(to, 0, 2);  // extra
      if (!local) {
        put_le(to, 0, 2 + 2 + 2);  // comment length, disk, internal attributes
        put_le(to, 0, 4);          // external attributes
        put_le(to, offset, 4);     // the local header
      }
      for (const char c : name) to.push_back(static_cast<std::byte>(c));
    };
    header(out, true);
    out.insert(out.end(), body.begin(), body.end());
    header(central, false);
  }
  const auto cd_offset = static_cast<uint32_t>(out.size()), cd_size = static_cast<uint32_t>(central.size());
  out.insert(out.end(), central.begin(), central.end());
  put_le(out, 0x06054b50u, 4);
  put_le(out, 0, 4);  // disks
  put_le(out, static_cast<uint32_t>(members.size()), 2);
  put_le(out, static_cast<uint32_t>(members.size()), 2);
  put_le(out, cd_size, 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);  // comment
  return out;
}

std::filesystem::path write(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path;
}

void expect_same_listing(const std::vector<TensorInfo>& got, const std::vector<TensorInfo>& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].key, want[i].key) << what << " entry " << i;
    EXPECT_EQ(got[i].name, want[i].name) << what << " " << want[i].key;
    EXPECT_EQ(got[i].dtype, want[i].dtype) << what << " " << want[i].key;
    EXPECT_EQ(got[i].shape, want[i].shape) << what << " " << want[i].key;
    EXPECT_EQ(got[i].optimizer, want[i].optimizer) << what << " " << want[i].key;
  }
}

// Keras 3.15's seed 001 archive (32 weights, optimizer state included), one save_keras_archive
// wrote (several dtypes and shapes, a scalar and an empty tensor), and both again as zips of
// deflated members: inspect gives load_keras_archive's entries, same order.
TEST(KerasArchiveInspect, ListsWhatLoadKerasArchiveReads) {
  const auto written = temp_path("written.keras");
  save_keras_archive(written,
                     {{"layers/b/vars/0", Tensor::ones({3, 2}, DType::f16)},
                      {"layers/a/vars/0", Tensor::ones({4}, DType::i64)},
                      {"layers/a/vars/1", Tensor::zeros({}, DType::f64)},
                      {"layers/c/vars/0", Tensor::zeros({0, 5}, DType::f32)},
                      {"optimizer/vars/0", Tensor::ones({2, 1, 3}, DType::b8)}},
                     R"({"config": {"layers": []}})");
  std::vector<std::filesystem::path> archives = {fixture("seed001", "model.keras"), written};
  for (size_t i = 0; i < 2; ++i) {
    const auto zip = read_bytes(archives[i]);
    std::vector<std::pair<std::string, std::vector<std::byte>>> members;
    for (const char* name : {"metadata.json", "config.json", "model.weights.h5"})
      members.emplace_back(name, zip_member(zip, name, archives[i].string()));
    archives.push_back(write(temp_path("deflated.keras"), zip_of(members, true)));
  }
  for (const auto& path : archives) {
    const KerasArchive want = load_keras_archive(path);
    ASSERT_GE(want.weights.entries.size(), 5u) << path;
    expect_same_listing(inspect_keras_archive(path), want.weights.entries, path.string());
    expect_same_listing(inspect_weights(path), want.weights.entries, "inspect_weights " + path.string());
    expect_same_listing(inspect(path), want.weights.entries, "inspect " + path.string());
  }
  EXPECT_EQ(inspect_keras_archive(archives[0]).size(), 32u);
}

// A weights file whose dataset's data lies outside it (an external raw file,
// tests/fixtures/keras_tf/outside_raw.weights.h5): reading the data is refused, listing it is
// not. inspect_weights read it (through load_keras_archive) and failed; it lists it now.
TEST(KerasArchiveInspect, DoesNotReadTheData) {
  const auto h5 = read_bytes(fixture("keras_tf", "outside_raw.weights.h5"));
  for (const bool deflated : {false, true}) {
    const auto path = write(temp_path("outside.keras"),
                            zip_of({{"config.json", testing::to_bytes("{}")}, {"model.weights.h5", h5}}, deflated));
    EXPECT_THROW_WITH((void)load_keras_archive(path), FormatError,
                      "dataset 'layers/dense/vars/0': its data is stored outside the file");
    for (const auto& listing : {inspect_keras_archive(path), inspect_weights(path), inspect(path)}) {
      ASSERT_EQ(listing.size(), 1u) << deflated;
      EXPECT_EQ(listing[0].key, "layers/dense/vars/0");
      EXPECT_EQ(listing[0].dtype, "int8");
      EXPECT_EQ(listing[0].shape, (Shape{16}));
    }
  }
}

// What load_keras_archive refuses, inspect refuses with the same words, under its own name.
TEST(KerasArchiveInspect, ChecksTheArchiveAsLoadKerasArchive) {
  const auto h5 = read_bytes(fixture("seed001", "model.weights.h5"));
  const auto no_config = write(temp_path("no_config.keras"), zip_of({{"model.weights.h5", h5}}, false));
  EXPECT_THROW_WITH(inspect_keras_archive(no_config), FormatError,
                    "inspect_keras_archive: " + no_config.string() + ": no config.json in the archive");
  const auto bad_config =
      write(temp_path("bad.keras"), zip_of({{"config.json", testing::to_bytes("{")}, {"model.weights.h5", h5}}, false));
  EXPECT_THROW_WITH(inspect_weights(bad_config), FormatError,
                    "inspect_keras_archive: " + bad_config.string() + ": config.json is not valid JSON");
  const auto no_weights =
      write(temp_path("no_weights.keras"), zip_of({{"config.json", testing::to_bytes("{}")}}, false));
  EXPECT_THROW_WITH(inspect(no_weights), FormatError, "no model.weights.h5 in the archive");
  const auto not_h5 = write(
      temp_path("not_h5.keras"),
      zip_of({{"config.json", testing::to_bytes("{}")}, {"model.weights.h5", testing::to_bytes("not hdf5")}}, false));
  EXPECT_THROW_WITH(inspect_keras_archive(not_h5), FormatError,
                    "parse_keras_h5: " + not_h5.string() + ":model.weights.h5: ");
  EXPECT_THROW_WITH(inspect_keras_archive(temp_path("missing.keras")), IOError, "inspect_keras_archive: ");
}

// An empty member, deflated (2 bytes of deflate data) or stored: zip_member and the archive's
// metadata.json give 0 bytes, not the deflate data, and its crc32 (of nothing) checks. A member
// read in place (stored) and one inflated are told apart by how it was held, not by whether the
// inflated bytes are empty (which read an empty deflated member as its raw deflate stream).
TEST(KerasArchiveInspect, EmptyMembersAreEmptyStoredOrDeflated) {
  const std::vector<std::byte> h5 = read_bytes(fixture("keras_tf", "mha4.weights.h5"));
  for (const bool deflated : {false, true}) {
    const std::vector<std::byte> zip =
        zip_of({{"config.json", testing::to_bytes("{}")}, {"metadata.json", {}}, {"model.weights.h5", h5}}, deflated);
    EXPECT_TRUE(zip_member(zip, "metadata.json", "empty.keras").empty()) << deflated;
    const std::filesystem::path path = write(temp_path(deflated ? "empty_deflated.keras" : "empty_stored.keras"), zip);
    EXPECT_EQ(load_keras_archive(path).metadata_json, "") << deflated;
    EXPECT_EQ(inspect_keras_archive(path).size(), load_keras_archive(path).weights.entries.size()) << deflated;
  }
}

}  // namespace
}  // namespace qkv::io
