// einops subcommands:
//   qkv rearrange PATTERN in.npy [in2.npy ...] -o out.npy [name=len ...]
//   qkv reduce PATTERN REDUCTION in.npy [...] -o out.npy [name=len ...]
//   qkv repeat PATTERN in.npy [...] -o out.npy [name=len ...]
//   qkv pack PATTERN a.npy b.npy ... -o out.npy      (prints the packed shapes)
//   qkv unpack PATTERN in.npy --shapes '2;3,4;-1' -o a.npy -o b.npy -o c.npy
//   qkv parse-shape PATTERN in.npy                   (prints {"name": length, ...})
// Several inputs are stacked on a new first axis (einops' list inputs).
#include <filesystem>
#include <iostream>
#include <system_error>

#include "commands.h"
#include "qkv/einops.h"
#include "qkv/io.h"

namespace qkv::cli {

namespace {

struct EinopsArgs {
  std::string pattern, reduction, out, shapes;
  std::vector<std::string> rest;  // input files and name=len
  std::vector<std::string> outs;
};

// Whether `a` names an input file: a .npy, .safetensors[:NAME], ... or a TF checkpoint prefix.
bool is_input_file(const std::string& a) {
  std::error_code ec;
  const std::string path = a.find(".safetensors:") != std::string::npos ? a.substr(0, a.rfind(':')) : a;
  return std::filesystem::exists(path, ec) || std::filesystem::exists(path + ".index", ec);
}

// Splits positional arguments into input files and NAME=LENGTH pairs, by one rule:
// 1. an argument that names an existing file, a TF checkpoint prefix (PREFIX.index
//    exists) or FILE.safetensors:NAME is an input file, whatever it looks like
//    (ckpt_step=1000, runs/lr=0.1/x.npy);
// 2. else an argument with '=' is NAME=LENGTH, and LENGTH must be an integer (a usage
//    error, exit 2, otherwise, as every malformed number);
// 3. else it is an input file (whose absence load_tensor reports).
// ckpt_step=1000 was read as the axis length ckpt_step = 1000 before the file check.
void split_args(const std::vector<std::string>& rest, std::vector<Tensor>* inputs, einops::AxisLengths* lengths) {
  for (const std::string& a : rest) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || is_input_file(a)) {
      inputs->push_back(load_tensor(a));
      continue;
    }
    // Any integer: einops itself judges the length (and says so as einops does).
    const std::optional<int64_t> n = to_integer(a.substr(eq + 1), std::numeric_limits<int64_t>::min());
    if (!n) {
      throw CLI::ValidationError("expected NAME=LENGTH with an integer length, got '" + a +
                                 "' (and no input file has that name)");
    }
    lengths->emplace_back(a.substr(0, eq), *n);
  }
  if (inputs->empty()) throw CLI::ValidationError("no input file given");
}

void save_one(const std::string& path, const Tensor& t) { io::save(path, {{"out", einops::materialize(t)}}); }

void run_transform(const EinopsArgs& a, const std::string& op) {
  std::vector<Tensor> inputs;
  einops::AxisLengths lengths;
  split_args(a.rest, &inputs, &lengths);
  Tensor result;
  if (op == "rearrange") {
    result = inputs.size() == 1 ? einops::rearrange(inputs[0], a.pattern, lengths)
                                : einops::rearrange(inputs, a.pattern, lengths);
  } else if (op == "repeat") {
    result =
        inputs.size() == 1 ? einops::repeat(inputs[0], a.pattern, lengths) : einops::repeat(inputs, a.pattern, lengths);
  } else {
    result = inputs.size() == 1 ? einops::reduce(inputs[0], a.pattern, a.reduction, lengths)
                                : einops::reduce(inputs, a.pattern, a.reduction, lengths);
  }
  save_one(a.out, result);
}

// "2;3,4;;-1" -> [[2], [3, 4], [], [-1]].
std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> shapes(1);
  std::string number;
  auto flush = [&] {
    if (number.empty()) return;
    shapes.back().push_back(parse_integer(number, "--shapes '" + text + "'", std::numeric_limits<int64_t>::min()));
    number.clear();
  };
  for (char c : text) {
    if (c == ';') {
      flush();
      shapes.emplace_back();
    } else if (c == ',') {
      flush();
    } else if (c != ' ') {  // parse_integer judges the token: a usage error naming it
      number += c;
    }
  }
  flush();
  return shapes;
}

CLI::App* add_transform(CLI::App& app, const std::string& name, const std::string& help,
                        const std::shared_ptr<EinopsArgs>& args) {
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->add_option("pattern", args->pattern, "einops pattern, e.g. 'b t (h d) -> b h t d'")->required();
  if (name == "reduce") {
    cmd->add_option("reduction", args->reduction, "sum, mean, max, min, prod, any or all")->required();
  }
  cmd->add_option("inputs", args->rest,
                  "input files (several are stacked) and NAME=LENGTH axis lengths; an argument that names an "
                  "existing file or TF checkpoint prefix is a file, even with '=' in it (ckpt_step=1000)")
      ->required();
  cmd->add_option("-o,--output", args->out, "output file (.npy or .safetensors)")->required();
  cmd->callback([args, name] { run_transform(*args, name); });
  return cmd;
}

void register_pack(CLI::App& app) {
  auto args = std::make_shared<EinopsArgs>();
  CLI::App* pack = app.add_subcommand("pack", "einops.pack: prints the packed shapes, writes the packed tensor");
  pack->add_option("pattern", args->pattern, "pattern with one '*', e.g. 'b * d'")->required();
  pack->add_option("inputs", args->rest, "input files")->required();
  pack->add_option("-o,--output", args->out, "output file")->required();
  pack->callback([args] {
    std::vector<Tensor> inputs;
    for (const std::string& f : args->rest) inputs.push_back(load_tensor(f));
    const einops::Packed p = einops::pack(inputs, args->pattern);
    save_one(args->out, p.tensor);
    std::cout << shapes_str(p.packed_shapes) << "\n";
  });

  auto uargs = std::make_shared<EinopsArgs>();
  CLI::App* unpack = app.add_subcommand("unpack", "einops.unpack: writes one file per packed shape");
  unpack->add_option("pattern", uargs->pattern, "pattern with one '*'")->required();
  unpack->add_option("input", uargs->out, "input file")->required();
  unpack->add_option("--shapes", uargs->shapes, "packed shapes: dims split by ',', shapes by ';' (one -1 allowed)")
      ->required();
  unpack->add_option("-o,--output", uargs->outs, "one output file per shape")->required();
  unpack->callback([uargs] {
    const std::vector<Shape> shapes = parse_shapes(uargs->shapes);
    if (shapes.size() != uargs->outs.size()) {
      fail<ValueError>("unpack: ", shapes.size(), " shapes but ", uargs->outs.size(), " output files");
    }
    const std::vector<Tensor> parts = einops::unpack(load_tensor(uargs->out), shapes, uargs->pattern);
    for (size_t i = 0; i < parts.size(); ++i) save_one(uargs->outs[i], parts[i]);
  });

  auto sargs = std::make_shared<EinopsArgs>();
  CLI::App* ps = app.add_subcommand("parse-shape", "einops.parse_shape: prints {\"name\": length, ...}");
  ps->add_option("pattern", sargs->pattern, "e.g. 'batch _ h w' or '... c'")->required();
  ps->add_option("input", sargs->out, "input file (.npy, or FILE.safetensors[:NAME])")->required();
  ps->callback([sargs] {
    const einops::AxisLengths lengths = einops::parse_shape(tensor_shape(sargs->out), sargs->pattern);
    std::string out = "{";
    for (size_t i = 0; i < lengths.size(); ++i) {
      out += (i ? ", \"" : "\"") + lengths[i].first + "\": " + std::to_string(lengths[i].second);
    }
    std::cout << out << "}\n";
  });
}

}  // namespace

void register_einops(CLI::App& app) {
  add_transform(app, "rearrange", "einops.rearrange: reorder, compose and decompose axes",
                std::make_shared<EinopsArgs>());
  add_transform(app, "reduce", "einops.reduce: rearrange and reduce the axes missing on the right",
                std::make_shared<EinopsArgs>());
  add_transform(app, "repeat", "einops.repeat: rearrange and add (broadcast) new axes", std::make_shared<EinopsArgs>());
  register_pack(app);
}

}  // namespace qkv::cli
