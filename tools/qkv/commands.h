// Subcommands of the qkv tool; each file registers one on the app.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "qkv/tensor.h"

namespace qkv::cli {

void register_attention(CLI::App& app);
void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);  // convert IN OUT --to torch|keras|same [--format F]
void demo_seed001();                   // qkv demo: the trained seed-001 model from its TF checkpoint (demo_seed001.cc)
bool train_seed001_table();            // seed 001 trained in qkv beside Keras' losses (demo_seed001.cc)
void register_train(CLI::App& app);    // train seed001
void register_demo(CLI::App& app);
void register_bench(CLI::App& app);           // bench attention, bench decode, bench peak
void register_bench_decode(CLI::App* bench);  // bench decode (bench_decode_cmd.cc)
void register_bench_peak(CLI::App* bench);    // bench peak (bench_peak_cmd.cc)
void register_einsum(CLI::App& app);
void register_einops(CLI::App& app);   // rearrange, reduce, repeat, pack, unpack, parse-shape
void register_heatmap(CLI::App& app);  // heatmap WEIGHTS -o OUT.png
void register_info(CLI::App& app);     // info [--json]: the machine (qkv/machine.h)
// "Machine: <machine_line()>", once before qkv bench's results: on stdout with the results,
// on stderr with --json (stdout then holds only the results' JSON lines; qkv info --json
// gives the machine as JSON). info_cmd.cc.
void print_machine_line(bool json);

// qkv attention --parallel ring|ulysses|heads under mpiexec (attention_parallel.cc).
struct ParallelAttentionCall {
  std::string scheme, layout = "contiguous";  // ring | ulysses | heads; contiguous | zigzag
  std::string q, k, v, out;                   // "{rank}" in a name: pre-sharded, per rank
  bool causal = false, gqa = false;
  std::optional<double> scale;
  std::string precision = "highest";
};
void run_parallel_attention(const ParallelAttentionCall& call);

// Numeric values (options.cc): every numeric option checks its value with one of these,
// e.g. ->check(integer_in(1, 4096)); a bad value is a usage error (exit 2) saying
// "--threads: expected an integer in [1, 4096], got '0'". Reals must be finite.
CLI::Validator integer_in(int64_t lo, uint64_t hi = std::numeric_limits<int64_t>::max());
CLI::Validator real_in(double lo = -std::numeric_limits<double>::infinity(),
                       double hi = std::numeric_limits<double>::infinity());
// The same check for a number inside an option's text (--shape 1,8,64,64, NAME=LENGTH):
// the value, or nullopt / a CLI::ValidationError naming `what` (0 <= hi).
std::optional<int64_t> to_integer(const std::string& text, int64_t lo,
                                  int64_t hi = std::numeric_limits<int64_t>::max());
int64_t parse_integer(const std::string& text, const std::string& what, int64_t lo,
                      int64_t hi = std::numeric_limits<int64_t>::max());

// `text` (a tensor name read from a file) for the terminal: control characters (C0, DEL,
// and C1 as UTF-8 encodes them) as \xNN, so a hostile file's names cannot move the
// cursor, recolour the screen or break a table's lines; other UTF-8 is kept (main.cc).
std::string terminal_safe(std::string_view text);

// The single tensor of a .npy file, or of a .safetensors file holding exactly one
// (name it as FILE:NAME to pick one of several). FormatError otherwise.
Tensor load_tensor(const std::string& spec);
// The shape of the tensor that load_tensor(spec) would load, from the file's header only.
Shape tensor_shape(const std::string& spec);

}  // namespace qkv::cli
