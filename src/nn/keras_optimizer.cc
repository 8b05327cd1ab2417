// nn::keras_adam_state (qkv/nn/keras_optimizer.h): Keras' Adam slots out of a weight file.
#include "qkv/nn/keras_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "qkv/error.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "keras_adam_state";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "<optimizer>/<tail>" or "<tail>": the name of a named slot.
bool names_slot(const std::string& name, const std::string& tail) {
  return name == tail || ends_with(name, "/" + tail);
}

std::string listing(const io::WeightFile& file) {
  std::string out;
  for (const io::TensorInfo& e : file.entries) {
    if (!e.optimizer) continue;
    out += out.empty() ? "" : ", ";
    out += e.name == e.key ? e.key : e.key + " (" + e.name + ")";
  }
  return out.empty() ? "none" : out;
}

// The optimizer entry whose recorded name is `tail` after the optimizer's name; nullptr if none.
const io::TensorInfo* named(const io::WeightFile& file, const std::string& tail) {
  for (const io::TensorInfo& e : file.entries) {
    if (e.optimizer && names_slot(e.name, tail)) return &e;
  }
  return nullptr;
}

// N of an unnamed Keras 3 slot "optimizer/vars/N" (or "<prefix>/optimizer/vars/N"); -1 otherwise.
int64_t unnamed_index(const std::string& key) {
  const std::string mark = "optimizer/vars/";
  const size_t at = key.rfind(mark);
  if (at == std::string::npos || (at > 0 && key[at - 1] != '/')) return -1;
  const std::string n = key.substr(at + mark.size());
  if (n.empty() || n.size() > 9 || !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(n);
}

const Tensor& tensor_of(const io::WeightFile& file, const io::TensorInfo& e, const std::string& source) {
  const auto it = file.tensors.find(e.key);
  if (it == file.tensors.end()) fail<FormatError>(kOp, ": ", source, ": '", e.key, "' has no readable data");
  return it->second;
}

// Keras' iteration count (an int64 variable; a float one in some files): refused unless a
// whole number in [0, 2^53], rather than cast (a NaN or 1e300 cast to int64 is undefined).
int64_t iteration_count(const Tensor& t, const std::string& key, const std::string& source) {
  const double n = t.numel() == 1 ? t.item() : -1.0;
  if (!(n >= 0.0 && n <= 9007199254740992.0) || n != std::floor(n)) {
    fail<FormatError>(kOp, ": ", source, ": the iteration count '", key, "' must be one whole number >= 0, got ",
                      t.numel() == 1 ? std::to_string(t.item()) : shape_str(t.shape()));
  }
  return static_cast<int64_t>(n);
}

void put(KerasAdamState& s, const KerasVariable& var, const Tensor& m, const Tensor& v, const std::string& source,
         const Shape* shape) {
  for (const auto& [slot, t] : {std::pair<const char*, const Tensor*>{"momentum", &m}, {"velocity", &v}}) {
    if (shape && t->shape() != *shape) {
      fail<FormatError>(kOp, ": ", source, ": the ", slot, " of '", var.path, "' has shape ", shape_str(t->shape()),
                        ", the variable ", shape_str(*shape));
    }
  }
  s.state["m/" + var.name] = m.to(DType::f32).contiguous().clone();
  s.state["v/" + var.name] = v.to(DType::f32).contiguous().clone();
}

KerasAdamState from_named(const io::WeightFile& file, const std::vector<KerasVariable>& vars, const std::string& source,
                          const std::vector<Shape>& shapes) {
  KerasAdamState s;
  for (size_t i = 0; i < vars.size(); ++i) {
    std::string flat = vars[i].path;
    std::replace(flat.begin(), flat.end(), '/', '_');
    const io::TensorInfo* m = named(file, flat + "_momentum");
    const io::TensorInfo* v = named(file, flat + "_velocity");
    if (!m || !v) {
      fail<FormatError>(kOp, ": ", source, ": no Adam slots ", flat, "_momentum / ", flat,
                        "_velocity for the variable '", vars[i].path, "'; optimizer entries: ", listing(file));
    }
    put(s, vars[i], tensor_of(file, *m, source), tensor_of(file, *v, source), source,
        shapes.empty() ? nullptr : &shapes[i]);
  }
  const io::TensorInfo* it = named(file, "iteration");
  if (!it) it = named(file, "iterations");
  if (!it) fail<FormatError>(kOp, ": ", source, ": no iteration count; optimizer entries: ", listing(file));
  s.iterations = iteration_count(tensor_of(file, *it, source), it->key, source);
  if (const io::TensorInfo* lr = named(file, "learning_rate")) s.learning_rate = tensor_of(file, *lr, source).item();
  return s;
}

KerasAdamState from_unnamed(const std::map<int64_t, const io::TensorInfo*>& slots, const io::WeightFile& file,
                            const std::vector<KerasVariable>& vars, const std::string& source,
                            const std::vector<Shape>& shapes) {
  const size_t want = 2 + 2 * vars.size();
  if (slots.size() != want || slots.rbegin()->first != static_cast<int64_t>(want) - 1) {
    fail<FormatError>(kOp, ": ", source, ": ", slots.size(), " optimizer/vars entries for ", vars.size(),
                      " variables; Adam saves 2 + 2 per variable = ", want,
                      " (another optimizer, or amsgrad's extra slots?)");
  }
  KerasAdamState s;
  s.iterations = iteration_count(tensor_of(file, *slots.at(0), source), slots.at(0)->key, source);
  s.learning_rate = tensor_of(file, *slots.at(1), source).item();
  for (size_t i = 0; i < vars.size(); ++i) {
    const auto m = static_cast<int64_t>(2 + 2 * i);
    put(s, vars[i], tensor_of(file, *slots.at(m), source), tensor_of(file, *slots.at(m + 1), source), source,
        shapes.empty() ? nullptr : &shapes[i]);
  }
  return s;
}

}  // namespace

KerasAdamState keras_adam_state(const io::WeightFile& file, const std::vector<KerasVariable>& variables,
                                const std::string& source, const std::vector<Shape>& shapes) {
  if (!shapes.empty() && shapes.size() != variables.size()) {
    fail<ValueError>(kOp, ": ", shapes.size(), " shapes for ", variables.size(), " variables");
  }
  std::map<int64_t, const io::TensorInfo*> unnamed;
  bool any = false;
  for (const io::TensorInfo& e : file.entries) {
    if (!e.optimizer) continue;
    any = true;
    if (const int64_t n = unnamed_index(e.key); n >= 0 && e.name == e.key) unnamed[n] = &e;
  }
  if (!any) fail<FormatError>(kOp, ": ", source, ": the file holds no optimizer state");
  if (!unnamed.empty()) return from_unnamed(unnamed, file, variables, source, shapes);
  return from_named(file, variables, source, shapes);
}

std::vector<KerasVariable> seed001_keras_variables() {
  std::vector<KerasVariable> out;
  for (const char* part : {"query", "key", "value", "attention_output"}) {
    for (const char* w : {"kernel", "bias"}) {
      out.push_back({std::string("multi_head_attention/") + part + "/" + w, std::string(part) + "_" + w});
    }
  }
  out.push_back({"dense/kernel", "dense_kernel"});
  out.push_back({"dense/bias", "dense_bias"});
  return out;
}

}  // namespace qkv::nn
