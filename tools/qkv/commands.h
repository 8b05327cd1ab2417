// Subcommands of the qkv tool; each file registers one on the app.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>

#include "qkv/tensor.h"

namespace qkv::cli {

void register_attention(CLI::App& app);
void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);  // convert IN OUT --to torch|keras|same [--format F]
void demo_seed001();  // qkv demo: the trained seed-001 model from its TF checkpoint (demo_seed001.cc)
void register_demo(CLI::App& app);
void register_bench(CLI::App& app);  // bench attention
void register_einsum(CLI::App& app);
void register_rearrange(CLI::App& app);  // rearrange, reduce, repeat, pack, unpack, parse-shape

// The single tensor of a .npy file, or of a .safetensors file holding exactly one
// (name it as FILE:NAME to pick one of several). FormatError otherwise.
Tensor load_tensor(const std::string& spec);

}  // namespace qkv::cli
