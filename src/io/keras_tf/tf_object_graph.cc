// Readable names for a TF checkpoint's keys from its TrackableObjectGraph
// (tensorflow/core/protobuf/trackable_object_graph.proto):
//   TrackableObjectGraph { repeated TrackableObject nodes = 1; }
//   TrackableObject { repeated ObjectReference children = 1;       // {int32 node_id = 1; string local_name = 2;}
//                     repeated SerializedTensor attributes = 2;    // {name = 1; full_name = 2; checkpoint_key = 3;}
//                     repeated SlotVariableReference slot_variables = 3; }  // {original = 1; slot_name = 2; slot = 3;}
#include <deque>
#include <map>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {
namespace {

constexpr std::string_view kValueSuffix = "/.ATTRIBUTES/VARIABLE_VALUE";

struct Node {
  std::vector<std::pair<int32_t, std::string>> children;
  std::vector<std::pair<std::string, std::string>> attributes;  // full_name, checkpoint_key
  std::vector<int32_t> slots;                                   // slot variable node ids
};

std::string key_name(const std::string& key) {
  return key.ends_with(kValueSuffix) ? key.substr(0, key.size() - kValueSuffix.size()) : key;
}

std::pair<int32_t, std::string> parse_child(std::span<const std::byte> bytes, const Context& ctx) {
  ProtoReader r(bytes, ctx, "object graph child");
  std::pair<int32_t, std::string> c{0, ""};  // proto3: an absent node_id is 0
  while (!r.done()) {
    const auto [f, w] = r.next_tag();
    if (f == 1 && w == 0)
      c.first = r.int32();
    else if (f == 2 && w == 2)
      c.second = std::string(r.string());
    else
      r.skip(w);
  }
  return c;
}

std::pair<std::string, std::string> parse_attribute(std::span<const std::byte> bytes, const Context& ctx) {
  ProtoReader r(bytes, ctx, "object graph attribute");
  std::pair<std::string, std::string> a;
  while (!r.done()) {
    const auto [f, w] = r.next_tag();
    if (f == 2 && w == 2)
      a.first = std::string(r.string());
    else if (f == 3 && w == 2)
      a.second = std::string(r.string());
    else
      r.skip(w);
  }
  return a;
}

int32_t parse_slot(std::span<const std::byte> bytes, const Context& ctx) {
  ProtoReader r(bytes, ctx, "object graph slot variable");
  int32_t slot = 0;
  while (!r.done()) {
    const auto [f, w] = r.next_tag();
    if (f == 3 && w == 0)
      slot = r.int32();
    else
      r.skip(w);
  }
  return slot;
}

Node parse_node(std::span<const std::byte> bytes, const Context& ctx) {
  ProtoReader r(bytes, ctx, "object graph node");
  Node n;
  while (!r.done()) {
    const auto [f, w] = r.next_tag();
    if (f == 1 && w == 2)
      n.children.push_back(parse_child(r.bytes(), ctx));
    else if (f == 2 && w == 2)
      n.attributes.push_back(parse_attribute(r.bytes(), ctx));
    else if (f == 3 && w == 2)
      n.slots.push_back(parse_slot(r.bytes(), ctx));
    else
      r.skip(w);
  }
  return n;
}

}  // namespace

void name_from_keys(std::vector<TensorInfo>& entries) {
  for (TensorInfo& e : entries) {
    e.name = key_name(e.key);
    e.optimizer = e.key.starts_with("optimizer/") || e.key.find("/.OPTIMIZER_SLOT/") != std::string::npos;
  }
}

void name_from_object_graph(std::string_view graph, std::vector<TensorInfo>& entries, const Context& ctx) {
  name_from_keys(entries);
  std::vector<Node> nodes;
  ProtoReader r(std::as_bytes(std::span(graph.data(), graph.size())), ctx, "_CHECKPOINTABLE_OBJECT_GRAPH");
  while (!r.done()) {
    const auto [f, w] = r.next_tag();
    if (f == 1 && w == 2)
      nodes.push_back(parse_node(r.bytes(), ctx));
    else
      r.skip(w);
  }
  const auto n = static_cast<int64_t>(nodes.size());
  auto check_id = [&](int32_t id, const char* what) {
    if (id < 0 || id >= n) fail_at(ctx, "_CHECKPOINTABLE_OBJECT_GRAPH: ", what, " refers to node ", id, " of ", n);
  };
  // Nodes reachable from the root without passing an edge named "optimizer" (the
  // checkpoint's own and the model's model.optimizer).
  std::vector<char> model(nodes.size(), 0), slot(nodes.size(), 0);
  std::deque<int32_t> queue;
  if (!nodes.empty()) {
    model[0] = 1;
    queue.push_back(0);
  }
  while (!queue.empty()) {
    const int32_t id = queue.front();
    queue.pop_front();
    for (const auto& [child, name] : nodes[static_cast<size_t>(id)].children) {
      check_id(child, "a child");
      if (name == "optimizer" || model[static_cast<size_t>(child)]) continue;
      model[static_cast<size_t>(child)] = 1;
      queue.push_back(child);
    }
  }
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < entries.size(); ++i) by_key.emplace(entries[i].key, i);
  for (const Node& node : nodes) {
    for (int32_t s : node.slots) {
      check_id(s, "a slot variable");
      slot[static_cast<size_t>(s)] = 1;
    }
  }
  for (size_t id = 0; id < nodes.size(); ++id) {
    for (const auto& [full_name, key] : nodes[id].attributes) {
      const auto it = by_key.find(key);
      if (it == by_key.end()) continue;
      TensorInfo& e = entries[it->second];
      if (!full_name.empty()) e.name = full_name;
      e.optimizer = slot[id] != 0 || model[id] == 0;
    }
  }
}

}  // namespace qkv::io::detail
