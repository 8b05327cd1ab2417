// qkv: command-line front end of the library. Errors go to stderr, exit code 1.
#include <iostream>

#include "commands.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::cli {

Tensor load_tensor(const std::string& spec) {
  std::string path = spec, name;
  if (const auto colon = spec.rfind(':'); colon != std::string::npos && spec.find(".safetensors:") != std::string::npos) {
    path = spec.substr(0, colon);
    name = spec.substr(colon + 1);
  }
  auto tensors = io::load(path);
  if (!name.empty()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) fail<ValueError>(path, ": no tensor named '", name, "'");
    return it->second;
  }
  if (tensors.size() != 1) {
    std::string names;
    for (const auto& [n, t] : tensors) names += (names.empty() ? "" : ", ") + n;
    fail<ValueError>(path, ": holds ", tensors.size(), " tensors (", names, "); pick one as ", path, ":NAME");
  }
  return tensors.begin()->second;
}

}  // namespace qkv::cli

int main(int argc, char** argv) {
  CLI::App app{"qkv: multi-head attention and Einstein-notation tensor operations"};
  app.require_subcommand(1);
  qkv::cli::register_attention(app);
  qkv::cli::register_inspect(app);
  qkv::cli::register_convert(app);
  qkv::cli::register_demo(app);
  qkv::cli::register_bench(app);
  qkv::cli::register_einsum(app);
  qkv::cli::register_rearrange(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qkv::Error& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
