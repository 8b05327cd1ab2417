// Loading the PyTorch SDPA fixtures (tests/fixtures/sdpa*, written by
// tests/attention/make_sdpa*_fixtures.py) and the tolerances they are read with.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/tensor.h"

namespace qkv::sdpa_fixtures {

namespace fs = std::filesystem;

inline fs::path fixture_dir(const std::string& name) { return fs::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / name; }

// Every *.safetensors fixture in `dir`, sorted; empty (never throws) when the directory is missing.
inline std::vector<fs::path> fixture_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".safetensors") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The file's stem with characters gtest does not allow in a name replaced by '_'.
inline std::string test_name(const fs::path& path) {
  std::string name = path.stem().string();
  for (char& c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) c = '_';
  }
  return name.empty() ? std::string("unnamed") : name;
}

struct Fixture {
  std::string name;
  io::SafetensorsFile file;
  nlohmann::json options;
  AttentionOptions attention;  // the file's options, with return_weights
  DType dtype = DType::f64;

  const Tensor& tensor(const std::string& key) const {
    auto it = file.tensors.find(key);
    if (it == file.tensors.end()) throw std::runtime_error(name + ": no tensor '" + key + "'");
    return it->second;
  }
};

inline Fixture load_fixture(const fs::path& path) {
  Fixture f;
  f.name = path.stem().string();
  f.file = io::load_safetensors(path);
  f.options = nlohmann::json::parse(f.file.metadata.at("options"));
  f.dtype = dtype_from_name(f.options.at("dtype").get<std::string>());
  f.attention.is_causal = f.options.at("is_causal").get<bool>();
  f.attention.enable_gqa = f.options.at("enable_gqa").get<bool>();
  f.attention.dropout_p = f.options.value("dropout_p", 0.0);  // sdpa_half's options have none
  if (!f.options.at("scale").is_null()) f.attention.scale = f.options.at("scale").get<double>();
  if (auto it = f.file.tensors.find("attn_mask"); it != f.file.tensors.end()) f.attention.attn_mask = it->second;
  f.attention.return_weights = true;
  return f;
}

// "[i, j, ...]": the multi-index of element `flat` of a row-major `shape`.
inline std::string index_str(const Shape& shape, size_t flat) {
  std::vector<int64_t> idx(shape.size());
  auto rest = static_cast<int64_t>(flat);
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] == 0 ? 0 : rest % shape[d];
    rest = shape[d] == 0 ? 0 : rest / shape[d];
  }
  return shape_str(idx);
}

// Half an ulp of `dtype` at magnitude |x| (subnormals included).
inline double half_ulp(DType dtype, double x) {
  int fraction_bits = 52, min_exponent = -1022;
  switch (dtype) {
    case DType::f16:
      fraction_bits = 10;
      min_exponent = -14;
      break;
    case DType::bf16:
      fraction_bits = 7;
      min_exponent = -126;
      break;
    case DType::f32:
      fraction_bits = 23;
      min_exponent = -126;
      break;
    default: break;
  }
  int e = 0;
  (void)std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  const int binade = x == 0.0 ? min_exponent : std::max(e - 1, min_exponent);
  return std::ldexp(1.0, binade - fraction_bits - 1);
}

}  // namespace qkv::sdpa_fixtures
