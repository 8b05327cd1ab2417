// Builds a TrackableObjectGraph (tensorflow/core/protobuf/trackable_object_graph.proto)
// from checkpoint keys, as TF's saver derives the keys from the graph: each
// "/"-separated component of the object path is a child edge (escaped local name),
// the part after "/.ATTRIBUTES/" an attribute of the last object. TF restores
// Checkpoint / Keras objects by walking these edges from node 0.
#include <array>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {
namespace {

constexpr std::string_view kAttributes = "/.ATTRIBUTES/";

struct GraphNode {
  std::vector<std::pair<std::string, int32_t>> children;  // local name, node id
  std::vector<std::array<std::string, 3>> attributes;     // name, full_name, checkpoint_key
};

// TF's unescape of a local name in a key: ".S" -> "/", ".." -> ".".
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.' && i + 1 < s.size() && (s[i + 1] == 'S' || s[i + 1] == '.')) {
      out.push_back(s[i + 1] == 'S' ? '/' : '.');
      ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

int32_t child(std::vector<GraphNode>& nodes, int32_t parent, const std::string& name) {
  for (const auto& [n, id] : nodes[static_cast<size_t>(parent)].children) {
    if (n == name) return id;
  }
  const auto id = static_cast<int32_t>(nodes.size());
  nodes[static_cast<size_t>(parent)].children.emplace_back(name, id);
  nodes.emplace_back();
  return id;
}

}  // namespace

std::string build_object_graph(const std::vector<std::string>& keys,
                               const std::map<std::string, std::string>& full_names) {
  std::vector<GraphNode> nodes(1);
  for (const std::string& key : keys) {
    const size_t at = key.find(kAttributes);
    if (at == std::string::npos) continue;
    int32_t node = 0;
    for (size_t start = 0; start <= at;) {
      const size_t end = std::min(key.find('/', start), at);
      node = child(nodes, node, unescape(std::string_view(key).substr(start, end - start)));
      start = end + 1;
    }
    const auto it = full_names.find(key);
    const std::string full = it != full_names.end() ? it->second : key.substr(0, at);
    nodes[static_cast<size_t>(node)].attributes.push_back({key.substr(at + kAttributes.size()), full, key});
  }
  if (nodes.size() == 1) return "";
  ProtoWriter graph;
  for (const GraphNode& n : nodes) {
    ProtoWriter obj;
    for (const auto& [name, id] : n.children) {
      ProtoWriter ref;
      ref.varint(1, static_cast<uint64_t>(id));
      ref.bytes(2, name);
      obj.message(1, ref);
    }
    for (const auto& [name, full, key] : n.attributes) {
      ProtoWriter attr;
      attr.bytes(1, name);
      attr.bytes(2, full);
      attr.bytes(3, key);
      obj.message(2, attr);
    }
    graph.message(1, obj);
  }
  return graph.str();
}

}  // namespace qkv::io::detail
