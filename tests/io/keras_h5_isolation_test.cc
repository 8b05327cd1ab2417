// The Keras HDF5 readers through their reader process: the same WeightFile as a read
// in this process, libhdf5's crashes and endless loops on hostile files (inputs the
// keras_h5 fuzzer found) as FormatErrors, libhdf5 reading the file image in place (the
// reader's peak memory), and the reply format's checks.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "io/io_test_util.h"
#include "io/keras_tf/weight_file_wire.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace {

using testing::fixture;
using testing::read_bytes;
using testing::temp_path;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

void expect_same_file(const WeightFile& got, const WeightFile& want, const std::string& what) {
  ASSERT_EQ(got.entries.size(), want.entries.size()) << what;
  for (size_t i = 0; i < got.entries.size(); ++i) {
    const TensorInfo &g = got.entries[i], &w = want.entries[i];
    EXPECT_EQ(g.key, w.key) << what;
    EXPECT_EQ(g.name, w.name) << what << " " << w.key;
    EXPECT_EQ(g.dtype, w.dtype) << what << " " << w.key;
    EXPECT_EQ(g.shape, w.shape) << what << " " << w.key;
    EXPECT_EQ(g.optimizer, w.optimizer) << what << " " << w.key;
  }
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (const auto& [key, w] : want.tensors) {
    const Tensor& g = got.tensors.at(key);
    EXPECT_EQ(g.dtype(), w.dtype()) << what << " " << key;
    EXPECT_EQ(g.shape(), w.shape()) << what << " " << key;
    EXPECT_EQ(bytes_of(g), bytes_of(w)) << what << " " << key;
  }
}

WeightFile load_in_process(const std::filesystem::path& path) {
  const ScopedEnv in_process("QKV_HDF5_IN_PROCESS", "1");
  return load_keras_h5(path);
}

// Every dtype HDF5 holds, a scalar and an empty tensor.
std::filesystem::path every_dtype_file() {
  const auto path = temp_path("every_dtype.weights.h5");
  std::map<std::string, Tensor> in;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::i8, DType::i32, DType::i64, DType::b8}) {
    in["layers/t_" + std::string(dtype_name(dt)) + "/vars/0"] = Tensor::arange(15, DType::f64).reshape({5, 3}).to(dt);
  }
  in["scalar"] = Tensor::full({}, 2.5);
  in["empty"] = Tensor::zeros({0, 3});
  save_keras_weights_h5(path, in);
  return path;
}

TEST(KerasH5Isolation, ReaderProcessGivesTheSameFileAsReadingInProcess) {
  for (const auto& path : {fixture("seed001", "model.weights.h5"), fixture("seed001", "model.h5"),
                           fixture("keras_tf", "tfkeras2_model.h5"), fixture("keras_tf", "tfkeras2_weights.h5"),
                           fixture("keras_tf", "mha4.weights.h5"), every_dtype_file()}) {
    const WeightFile isolated = load_keras_h5(path);
    EXPECT_FALSE(isolated.tensors.empty()) << path;
    expect_same_file(isolated, load_in_process(path), path.string());
    const auto listing = inspect_keras_h5(path);
    expect_same_file(WeightFile{listing, {}}, WeightFile{load_in_process(path).entries, {}}, path.string());
  }
}

TEST(KerasH5Isolation, FileThatCrashesLibhdf5IsAFormatErrorAndThisProcessGoesOn) {
  // Found by the keras_h5 fuzzer: libhdf5 1.10.8 reads through a bad pointer on it.
  // What it reads depends on the memory layout of the reader process: usually it
  // dies (SIGSEGV; under ASan the child prints a heap-buffer-overflow report in
  // libhdf5's memcpy and exits with status 1), sometimes it returns garbage (a
  // dataset name of random bytes with a 4-billion-element shape, seen once in a
  // full-suite run) that qkv's own checks reject. Either way: a FormatError naming the call and the file.
  const auto bad = read_bytes(fixture("io", "libhdf5_segv.h5"));
  for (int i = 0; i < 3; ++i) {
    try {
      (void)parse_keras_h5(bad, "libhdf5_segv.h5");
      FAIL() << "no exception";
    } catch (const FormatError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.starts_with("parse_keras_h5: libhdf5_segv.h5: ")) << m;
      if (m.find("(reader process ") != std::string::npos) {
        EXPECT_TRUE(m.starts_with("parse_keras_h5: libhdf5_segv.h5: libhdf5 failed on this file (reader process "))
            << m;
        EXPECT_TRUE(m.ends_with("; the file is malformed or not a Keras weight file")) << m;
      }
    }
  }
  EXPECT_EQ(load_keras_h5(fixture("seed001", "model.weights.h5")).entries.size(), 32u);
}

TEST(KerasH5Isolation, FileThatLoopsLibhdf5ForeverEndsAtTheDeadline) {
  // Found by the keras_h5 fuzzer: a path-building loop in libhdf5 that never ends.
  const ScopedEnv timeout("QKV_HDF5_TIMEOUT_S", "0.5");
  try {
    (void)load_keras_h5(fixture("io", "libhdf5_endless_loop.h5"));
    FAIL() << "no exception";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("libhdf5 failed on this file (reader process still running after 0.5 s, killed; "
                     "QKV_HDF5_TIMEOUT_S sets the limit)"),
              std::string::npos)
        << m;
  }
}

TEST(KerasH5Isolation, BadTimeoutSettingIsAValueError) {
  for (const char* value : {"abc", "-1", "0", "5s", "nan"}) {
    const ScopedEnv timeout("QKV_HDF5_TIMEOUT_S", value);
    EXPECT_THROW((void)load_keras_h5(fixture("seed001", "model.weights.h5")), ValueError) << value;
  }
}

TEST(KerasH5Isolation, FormatErrorOfTheReaderProcessKeepsItsMessage) {
  const auto h5 = read_bytes(fixture("seed001", "model.weights.h5"));
  try {
    (void)parse_keras_h5(std::span(h5).first(2048), "cut.h5");  // libhdf5 rejects it cleanly in the child
    FAIL() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("parse_keras_h5: cut.h5: cannot open as HDF5: libhdf5: "))
        << e.what();
  }
}

// This process's resident set in bytes (the second field of /proc/self/statm).
double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// libhdf5 opens the file image where it lies (file image callbacks): it copied it
// twice (H5Pset_file_image, then the core driver's H5Fopen), so listing a file took
// the reader process its inherited memory plus 2x the file (docs/formats-keras-tf.md).
// The reader inherits what the caller holds, the file's bytes included, so in place
// it peaks at that plus libhdf5's metadata. Measured in gtest's death-test child, whose
// only child is the reader: getrusage(RUSAGE_CHILDREN) is that reader's peak.
TEST(KerasH5Isolation, ReaderProcessOpensTheFileImageInPlace) {
  const auto path = temp_path("64mib.weights.h5");
  save_keras_weights_h5(path, {{"w", Tensor::ones({16 << 20}, DType::f32)}});
  const auto file = static_cast<double>(std::filesystem::file_size(path));
  ASSERT_GE(file, 64.0 * (1 << 20));
  EXPECT_EXIT(
      {
        const double before = resident_bytes();
        const auto listing = inspect_keras_h5(path);
        rusage children{};
        ::getrusage(RUSAGE_CHILDREN, &children);
        const double reader = static_cast<double>(children.ru_maxrss) * 1024;
        std::fprintf(stderr, "reader peak %.0f MiB; before the read %.0f MiB, file %.0f MiB\n", reader / (1 << 20),
                     before / (1 << 20), file / (1 << 20));
        std::_Exit(listing.size() == 1 && reader > file && reader < before + 1.5 * file ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  std::filesystem::remove(path);
}

// ---- the reply format ---------------------------------------------------------------------

std::shared_ptr<Storage> flatten(const detail::IsolatedReply& r) {
  size_t n = 0;
  for (const auto& c : r.chunks) n += c.size();
  auto s = Storage::allocate(n);
  size_t at = 0;
  for (const auto& c : r.chunks) {
    if (!c.empty()) std::memcpy(s->data() + at, c.data(), c.size());
    at += c.size();
  }
  return s;
}

TEST(KerasH5Wire, DecodesWhatItEncodes) {
  const WeightFile w = load_in_process(every_dtype_file());
  const detail::Context ctx{"test", "wire"};
  const auto bytes = flatten(detail::encode_weight_file(w));
  const WeightFile back = detail::decode_weight_file(bytes, ctx);
  expect_same_file(back, w, "wire");
  for (const auto& [key, t] : back.tensors) {  // views into the reply, at 64-byte offsets
    if (t.numel() == 0) continue;
    EXPECT_EQ(t.storage(), bytes) << key;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << key;
  }
}

TEST(KerasH5Wire, RejectsEveryTruncationAndGarbledCounts) {
  const WeightFile w = load_in_process(fixture("keras_tf", "mha4.weights.h5"));
  const detail::Context ctx{"test", "wire"};
  const auto bytes = flatten(detail::encode_weight_file(w));
  for (size_t n = 0; n < bytes->nbytes(); n += n < 600 ? 1 : 97) {
    auto cut = Storage::allocate(n);
    if (n > 0) std::memcpy(cut->data(), bytes->data(), n);
    EXPECT_THROW((void)detail::decode_weight_file(cut, ctx), FormatError) << n;
  }
  // A huge entry count, then a huge string length.
  for (size_t at : {size_t{0}, size_t{8}}) {
    auto bad = flatten(detail::encode_weight_file(w));
    std::memset(bad->data() + at, 0xff, 8);
    EXPECT_THROW((void)detail::decode_weight_file(bad, ctx), FormatError) << at;
  }
}

}  // namespace
}  // namespace qkv::io
