// qkv inspect FILE: every tensor's name, dtype and shape, without reading data.
// Weight files (TF checkpoints, Keras .h5 / .weights.h5, .keras) also show each
// variable's own name and mark optimizer state.
#include <algorithm>
#include <iostream>
#include <set>

#include "commands.h"
#include "qkv/ascii.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"

namespace qkv::cli {

namespace {
bool is_plain_tensor_file(const std::string& path) {
  const std::string ext = lower_extension(path);
  return ext == ".npy" || ext == ".safetensors";
}

// A directory is not a weights file (a TF checkpoint is a prefix, not its folder):
// say what qkv reads and which paths in the directory it could inspect.
[[noreturn]] void explain_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::set<std::string> candidates;  // sorted, each once
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const std::string ext = lower_extension(e.path());
    if (ext == ".index") {
      candidates.insert((e.path().parent_path() / e.path().stem()).string() + "  (TF checkpoint prefix)");
    } else if (ext == ".npy" || ext == ".safetensors" || ext == ".h5" || ext == ".keras") {
      candidates.insert(e.path().string());
    }
  }
  std::string list;
  size_t shown = 0;
  for (const std::string& c : candidates) {
    if (++shown > 20) {
      list += "\n  ... and " + std::to_string(candidates.size() - 20) + " more";
      break;
    }
    list += "\n  " + c;
  }
  fail<ValueError>("inspect: '", dir,
                   "' is a directory; give one file: .npy, .safetensors, .h5/.weights.h5, .keras, "
                   "or a TF checkpoint prefix (PREFIX for PREFIX.index + PREFIX.data-*). ",
                   candidates.empty() ? "It holds none of these." : "Candidates in it:" + list);
}

// key, dtype, shape, the variable's name where it differs from the key, "optimizer" marks.
void run_inspect_weights(const std::string& path) {
  auto entries = io::inspect_weights(path);
  size_t key_width = 3, dtype_width = 5, shape_width = 5, optimizer = 0;
  for (auto& e : entries) {  // names from the file, shown without their control characters
    e.key = terminal_safe(e.key);
    e.name = terminal_safe(e.name);
    e.dtype = terminal_safe(e.dtype);
    key_width = std::max(key_width, e.key.size());
    dtype_width = std::max(dtype_width, e.dtype.size());
    shape_width = std::max(shape_width, shape_str(e.shape).size());
    optimizer += e.optimizer ? 1 : 0;
  }
  std::cout << path << ": " << entries.size() << " variables, " << optimizer << " of them optimizer state\n";
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size() + 2, ' '); };
  std::cout << pad("name", key_width) << pad("dtype", dtype_width) << pad("shape", shape_width) << "variable\n";
  for (const auto& e : entries) {
    std::string note = e.name != e.key ? e.name : "";
    if (e.optimizer) note += note.empty() ? "(optimizer)" : "  (optimizer)";
    std::cout << pad(e.key, key_width) << pad(e.dtype, dtype_width) << pad(shape_str(e.shape), shape_width) << note
              << "\n";
  }
}

void run_inspect(const std::string& path) {
  if (std::filesystem::is_directory(path)) explain_directory(path);
  if (!is_plain_tensor_file(path)) {
    run_inspect_weights(path);
    return;
  }
  auto infos = io::inspect(path);
  size_t name_width = 4, dtype_width = 5;
  for (auto& t : infos) {  // names from the file, shown without their control characters
    t.name = terminal_safe(t.name);
    t.dtype = terminal_safe(t.dtype);
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
  CLI::App* cmd =
      app.add_subcommand("inspect", "List the tensors of a .npy, .safetensors, Keras .h5/.keras file or TF checkpoint");
  cmd->add_option("file", *path, "file to list")->required();
  cmd->callback([path] { run_inspect(*path); });
}

}  // namespace qkv::cli
