// qkv einsum EQUATION a.npy [b.npy ...] -o out.npy [--optimize X] [--memory-limit N] [--path]
#include <iostream>

#include "commands.h"
#include "qkv/einsum.h"
#include "qkv/io.h"

namespace qkv::cli {

namespace {
struct EinsumArgs {
  std::string equation, out, optimize = "auto";
  std::vector<std::string> inputs;
  std::optional<int64_t> memory_limit;
  bool path = false;
};

void run_einsum(const EinsumArgs& a) {
  std::vector<Tensor> operands;
  for (const std::string& spec : a.inputs) operands.push_back(load_tensor(spec));
  EinsumOptions options;
  options.optimize = einsum_optimize_from_name(a.optimize);
  options.memory_limit = a.memory_limit;
  if (a.path) {
    const EinsumPath p = einsum_path(a.equation, std::span<const Tensor>(operands), options);
    std::cout << "path:";
    for (const auto& step : p.path) {
      std::cout << " (";
      for (size_t i = 0; i < step.size(); ++i) std::cout << (i ? ", " : "") << step[i];
      std::cout << ")";
    }
    std::cout << "\n" << p.report << "\nkernels:";
    for (const EinsumStep& step : p.steps) std::cout << " " << step.kernel;
    std::cout << "\n";
  }
  if (a.out.empty()) {
    if (!a.path) fail<ValueError>("einsum: give -o OUT (or --path to print the plan only)");
    return;
  }
  io::save(a.out, {{"output", einsum(a.equation, std::span<const Tensor>(operands), options)}});
}
}  // namespace

void register_einsum(CLI::App& app) {
  auto args = std::make_shared<EinsumArgs>();
  CLI::App* cmd = app.add_subcommand(
      "einsum",
      "Einstein summation with numpy.einsum semantics, e.g. qkv einsum 'bhid,bhjd->bhij' q.npy k.npy -o s.npy");
  cmd->add_option("equation", args->equation, "subscripts, e.g. 'ij,jk->ik' (spaces and '...' allowed)")->required();
  cmd->add_option("inputs", args->inputs, "operands (.npy, or FILE.safetensors[:NAME])")->required();
  cmd->add_option("-o,--output", args->out, "output file (.npy or .safetensors)");
  cmd->add_option("--optimize", args->optimize,
                  "path: false, true/auto, greedy, optimal, dp, branch-all, branch-2, branch-1 (default auto)")
      ->check(CLI::Validator(
          [](std::string& name) {  // an unknown name is a usage error, before any file is read
            try {
              einsum_optimize_from_name(name);
              return std::string();
            } catch (const ValueError& e) {
              return std::string(e.what());
            }
          },
          "OPTIMIZER"));
  cmd->add_option("--memory-limit", args->memory_limit, "largest intermediate, in elements")->check(integer_in(1));
  cmd->add_flag("--path", args->path, "print the contraction path and its cost report (numpy.einsum_path)");
  cmd->callback([args] { run_einsum(*args); });
}

}  // namespace qkv::cli
