// qkv: command-line front end of the library. Errors go to stderr; exit codes:
// 0 success, 1 runtime error (bad file, shape, ...), 2 usage error (unknown
// subcommand, bad option or value), 130 interrupted (SIGINT). README "Exit codes".
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>

#include <unistd.h>

#include "commands.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/out_of_memory.h"
#include "qkv/parallel.h"

namespace qkv::cli {

std::string terminal_safe(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    // C1 controls U+0080..U+009F are 0xc2 0x80..0x9f in UTF-8.
    const bool c1 = c == 0xc2 && i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xe0) == 0x80;
    if (c >= 0x20 && c != 0x7f && !c1) {
      out += text[i];
      continue;
    }
    const auto escape = [&](unsigned char b) { out += {'\\', 'x', kHex[b >> 4], kHex[b & 15]}; };
    escape(c);
    if (c1) escape(static_cast<unsigned char>(text[++i]));
  }
  return out;
}

namespace {

// FILE or FILE.safetensors:NAME -> {path, name}.
std::pair<std::string, std::string> split_spec(const std::string& spec) {
  if (const auto colon = spec.rfind(':');
      colon != std::string::npos && spec.find(".safetensors:") != std::string::npos) {
    return {spec.substr(0, colon), spec.substr(colon + 1)};
  }
  return {spec, ""};
}

// The entry of `names` that spec picks (its NAME, or the only one); ValueError otherwise.
size_t pick(const std::string& path, const std::string& name, const std::vector<std::string>& names) {
  if (!name.empty()) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) fail<ValueError>(path, ": no tensor named '", terminal_safe(name), "'");
    return static_cast<size_t>(it - names.begin());
  }
  if (names.size() != 1) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + terminal_safe(n);
    fail<ValueError>(path, ": holds ", names.size(), " tensors (", list, "); pick one as ", path, ":NAME");
  }
  return 0;
}

}  // namespace

Tensor load_tensor(const std::string& spec) {
  const auto [path, name] = split_spec(spec);
  auto tensors = io::load(path);
  std::vector<std::string> names;
  for (const auto& entry : tensors) names.push_back(entry.first);
  return std::next(tensors.begin(), static_cast<std::ptrdiff_t>(pick(path, name, names)))->second;
}

Shape tensor_shape(const std::string& spec) {
  const auto [path, name] = split_spec(spec);
  std::vector<io::TensorInfo> infos = io::inspect(path);
  // load_tensor's choice: by load()'s keys, in their order (a Keras or TF entry's name is not its key)
  std::sort(infos.begin(), infos.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  std::vector<std::string> names;
  for (const io::TensorInfo& info : infos) names.push_back(info.key);
  return infos[pick(path, name, names)].shape;
}

}  // namespace qkv::cli

namespace {

constexpr int kUsageError = 2;

// CLI11 reports a word that names no subcommand as "A subcommand is required" (or as
// an unexpected argument); say what it is and list the choices instead.
void check_subcommand_names(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const auto subs = at->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return;  // at a leaf: its positionals follow
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subs) {
      if (sub->check_name(argv[i])) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!next) {
      const std::string where = at == &app ? "qkv" : "qkv " + at->get_name();
      throw CLI::ValidationError("'" + std::string(argv[i]) + "' is not a subcommand of " + where +
                                 " (one of: " + names + ")");
    }
    at = next;
  }
}

// Ctrl-C: the first SIGINT asks the running kernels to stop (they poll between work
// items and throw qkv::Interrupted, main exits 130 as shells expect of 128 + SIGINT);
// a second one exits at once, for work that does not poll.
void on_sigint(int) {
  static volatile std::sig_atomic_t seen = 0;
  if (seen) _exit(130);
  seen = 1;
  qkv::request_interrupt();
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe, so `qkv bench ... | tee` shows each line when it
  // is printed (stdout is block-buffered otherwise; std::cout writes through stdio).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"qkv: multi-head attention and Einstein-notation tensor operations"};
  app.set_version_flag("--version", "qkv " QKV_VERSION, "print the version and exit");
  app.require_subcommand(1);
  qkv::cli::register_attention(app);
  qkv::cli::register_inspect(app);
  qkv::cli::register_convert(app);
  qkv::cli::register_demo(app);
  qkv::cli::register_train(app);
  qkv::cli::register_bench(app);
  qkv::cli::register_einsum(app);
  qkv::cli::register_einops(app);
  qkv::cli::register_heatmap(app);
  qkv::cli::register_info(app);
  std::signal(SIGINT, on_sigint);
  try {
    check_subcommand_names(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkv: usage error: " << e.what() << "\nRun 'qkv --help' (or 'qkv SUBCOMMAND --help') for usage.\n";
    return kUsageError;
  } catch (const qkv::Interrupted& e) {
    std::cerr << "qkv: interrupted\n";
    return 130;
  } catch (const qkv::Error& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {  // a container's growth: named by the scope it left (qkv/size.h)
    std::cerr << "qkv: error: " << qkv::bad_alloc_message("qkv") << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qkv: internal error: " << e.what() << "\n";
    return 1;
  }
  return qkv::interrupt_requested() ? 130 : 0;  // Ctrl-C after the last poll
}
