// qkv inspect FILE: every tensor's name, dtype and shape, without reading data.
#include <algorithm>
#include <iostream>

#include "commands.h"
#include "qkv/io.h"

namespace qkv::cli {

namespace {
void run_inspect(const std::string& path) {
  const auto infos = io::inspect(path);
  size_t name_width = 4, dtype_width = 5;
  for (const auto& t : infos) {
    name_width = std::max(name_width, t.name.size());
    dtype_width = std::max(dtype_width, t.dtype.size());
  }
  std::cout << path << ": " << infos.size() << (infos.size() == 1 ? " tensor\n" : " tensors\n");
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size() + 2, ' '); };
  std::cout << pad("name", name_width) << pad("dtype", dtype_width) << "shape\n";
  for (const auto& t : infos) {
    std::cout << pad(t.name, name_width) << pad(t.dtype, dtype_width) << shape_str(t.shape) << "\n";
  }
}
}  // namespace

void register_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "List the tensors of a .npy or .safetensors file");
  cmd->add_option("file", *path, "file to list")->required();
  cmd->callback([path] { run_inspect(*path); });
}

}  // namespace qkv::cli
