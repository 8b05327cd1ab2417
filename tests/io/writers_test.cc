// Every file writer of src/io is whole or nothing (io_internal.h's PendingFile): a write
// that fails part way (here: past RLIMIT_FSIZE, as a full disk) leaves the previous file
// as it was, or no file, and no temporary file beside it; a directory as the output is
// an error saying so; links are followed and the replaced file's mode is kept.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "qkv/heatmap.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"

namespace qkv::io {
namespace {

namespace fs = std::filesystem;
using testing::read_bytes;
using testing::temp_path;

// While alive, a write past `bytes` bytes of a file fails with EFBIG, as on a full disk
// (SIGXFSZ, which would end the process, is ignored meanwhile).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*handler_)(int) = nullptr;
};

constexpr rlim_t kLimit = 64 * 1024;

// Random values: no writer or compressor gets 1 MiB of them under kLimit.
Tensor big() { return Tensor::uniform({256, 1024}, 7); }
Tensor small() { return Tensor::uniform({2, 3}, 8); }

Image noise(int64_t side) {
  const Tensor t = Tensor::uniform({side * side * 3}, 9);
  Image im;
  im.width = im.height = side;
  for (const double x : t.to_vector<double>()) im.rgb.push_back(static_cast<uint8_t>(x * 255.0));
  return im;
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct Writer {
  const char* name;
  std::vector<std::string> files;  // what it writes into the directory
  std::function<void(const fs::path& dir, bool big)> write;
};

std::vector<Writer> writers() {
  auto one = [](bool b) { return std::map<std::string, Tensor>{{"w", b ? big() : small()}}; };
  return {
      {"npy", {"x.npy"}, [](const fs::path& d, bool b) { save_npy(d / "x.npy", b ? big() : small()); }},
      {"safetensors", {"x.safetensors"}, [one](const fs::path& d, bool b) { save(d / "x.safetensors", one(b)); }},
      {"keras3 h5",
       {"x.weights.h5"},
       [one](const fs::path& d, bool b) { save_keras_weights_h5(d / "x.weights.h5", one(b)); }},
      {"tf.keras h5",
       {"x.h5"},
       [](const fs::path& d, bool b) {
         save_keras_legacy_h5(d / "x.h5", {{"dense", {{"kernel", b ? big() : small()}}}});
       }},
      {"keras archive",
       {"x.keras"},
       [one](const fs::path& d, bool b) { save_keras_archive(d / "x.keras", one(b), "{}"); }},
      {"tf checkpoint",
       {"ck.data-00000-of-00001", "ck.index"},
       [one](const fs::path& d, bool b) { save_tf_checkpoint(d / "ck", one(b)); }},
      {"png", {"x.png"}, [](const fs::path& d, bool b) { write_png(d / "x.png", noise(b ? 512 : 4)); }},
  };
}

// Each writer wrote in place: past the limit it left a partial file (the good one
// truncated), which numpy, h5py or TF then refused or, worse, half read.
TEST(Writers, AFailedWriteLeavesThePreviousFileWhole) {
  for (const Writer& w : writers()) {
    SCOPED_TRACE(w.name);
    const fs::path dir = temp_path(std::string("whole_") + w.name);
    fs::create_directories(dir);
    w.write(dir, false);
    ASSERT_EQ(listing(dir), w.files);
    std::vector<std::vector<std::byte>> before;
    for (const std::string& f : w.files) before.push_back(read_bytes(dir / f));
    {
      const FileSizeLimit limit(kLimit);
      EXPECT_THROW(w.write(dir, true), Error);
    }
    EXPECT_EQ(listing(dir), w.files);  // no temporary file left
    for (size_t i = 0; i < w.files.size(); ++i) EXPECT_EQ(read_bytes(dir / w.files[i]), before[i]) << w.files[i];
  }
}

TEST(Writers, AFailedWriteLeavesNoFile) {
  for (const Writer& w : writers()) {
    SCOPED_TRACE(w.name);
    const fs::path dir = temp_path(std::string("none_") + w.name);
    fs::create_directories(dir);
    {
      const FileSizeLimit limit(kLimit);
      EXPECT_THROW(w.write(dir, true), Error);
    }
    EXPECT_EQ(listing(dir), std::vector<std::string>{});
    w.write(dir, true);  // and without the limit it is written
    EXPECT_EQ(listing(dir), w.files);
  }
}

// `-o DIR` was "save: DIR: unknown file extension ''" (or, for DIR.npy, "cannot open for
// writing: Is a directory").
TEST(Writers, ADirectoryIsRefusedAsADirectory) {
  const fs::path dir = temp_path("out"), npy_dir = temp_path("out.npy");
  fs::create_directories(dir);
  fs::create_directories(npy_dir);
  EXPECT_THROW_WITH(save(dir, {{"w", small()}}), IOError,
                    "save: " + dir.string() + ": is a directory, not a file (give a file in it, e.g. " +
                        (dir / "out.npy").string() + ")");
  EXPECT_THROW_WITH(save(npy_dir, {{"w", small()}}), IOError, "save: " + npy_dir.string() + ": is a directory");
  EXPECT_THROW_WITH(save_npy(npy_dir, small()), IOError,
                    "save_npy: " + npy_dir.string() + ": is a directory, not a file");
  EXPECT_THROW_WITH(write_png(dir, noise(2)), IOError, "write_png: " + dir.string() + ": is a directory, not a file");
  EXPECT_TRUE(fs::is_directory(dir) && fs::is_directory(npy_dir));
}

// The new file replaces the one a link names (the link stays a link) and keeps its mode.
TEST(Writers, LinksAreFollowedAndTheModeIsKept) {
  const fs::path target = temp_path("target.npy"), link = target.parent_path() / "link.npy";
  save_npy(target, small());
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  fs::create_symlink("target.npy", link);
  save_npy(link, big());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_bytes(target), serialize_npy(big(), false));
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(listing(target.parent_path()), (std::vector<std::string>{"link.npy", "target.npy"}));
}

// A file that is not a regular file cannot be replaced: it is written in place.
TEST(Writers, DevNullIsWrittenInPlace) {
  save_npy("/dev/null", small());
  save_safetensors("/dev/null", {{"w", small()}});
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

}  // namespace
}  // namespace qkv::io
