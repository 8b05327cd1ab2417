// Loading the framework-made layer fixtures (tests/fixtures/mha_*) and comparing with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/tensor.h"

namespace qkv::nn::testing {

namespace fs = std::filesystem;

inline fs::path fixture_dir(const std::string& name) { return fs::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / name; }

// Every *.safetensors in the directory, sorted (empty when it is missing).
inline std::vector<fs::path> fixture_files(const std::string& name) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(fixture_dir(name), ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".safetensors") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

struct Fixture {
  std::string name;
  std::map<std::string, Tensor> tensors;
  nlohmann::json options;
  const Tensor& at(const std::string& key) const { return tensors.at(key); }
  bool has(const std::string& key) const { return tensors.count(key) > 0; }
  std::optional<Tensor> maybe(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return tensors.at(key);
  }
  // The tensors whose names start with `prefix`, prefix removed.
  std::map<std::string, Tensor> with_prefix(const std::string& prefix) const {
    std::map<std::string, Tensor> out;
    for (const auto& [k, v] : tensors) {
      if (k.rfind(prefix, 0) == 0) out[k.substr(prefix.size())] = v;
    }
    return out;
  }
};

inline Fixture load_fixture(const fs::path& path) {
  io::SafetensorsFile f = io::load_safetensors(path);
  Fixture fx;
  fx.name = path.stem().string();
  fx.tensors = std::move(f.tensors);
  fx.options = nlohmann::json::parse(f.metadata.at("options"));
  return fx;
}

// max |got - want| / max |want| (want's scale; 1 when want is all zeros).
inline double relative_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return 1e30;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double scale = 0, err = 0;
  for (double x : w) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(g[i] - w[i]);
    err = std::isnan(e) ? 1e30 : std::max(err, e);
  }
  return err / (scale > 0 ? scale : 1.0);
}

}  // namespace qkv::nn::testing
