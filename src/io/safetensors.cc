// Hugging Face .safetensors: 8-byte little-endian header length n, n bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {str: str}},
// then the data section. Validation and writer layout follow the reference
// implementation (safetensors/src/tensor.rs).
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "io/io_internal.h"
#include "io/json_nesting.h"

namespace qkv::io {
namespace detail {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference's MAX_HEADER_SIZE
// The reference's serde_json refuses JSON nested 128 levels deep ("recursion limit exceeded").
// nlohmann would build it: 20M levels of "[" in a 40 MB header took 1.5 GB and 5.3 s.
constexpr JsonNesting kHeaderNesting{127, "header", ", which the reference (serde_json) refuses"};

// One dtype of the format. The table is in the reference's enum order, which is
// increasing alignment; the writer sorts by it (widest first).
struct StDtype {
  std::string_view name;
  unsigned bits;
  std::optional<DType> qkv;
};
constexpr std::array<StDtype, 22> kDtypes{{
    {"BOOL", 8, DType::b8},  {"F4", 4, {}},           {"F6_E2M3", 6, {}},        {"F6_E3M2", 6, {}},
    {"U8", 8, {}},           {"I8", 8, DType::i8},    {"F8_E5M2", 8, {}},        {"F8_E4M3", 8, {}},
    {"F8_E8M0", 8, {}},      {"F8_E4M3FNUZ", 8, {}},  {"F8_E5M2FNUZ", 8, {}},    {"I16", 16, {}},
    {"U16", 16, {}},         {"F16", 16, DType::f16}, {"BF16", 16, DType::bf16}, {"I32", 32, DType::i32},
    {"U32", 32, {}},         {"F32", 32, DType::f32}, {"C64", 64, {}},           {"F64", 64, DType::f64},
    {"I64", 64, DType::i64}, {"U64", 64, {}},
}};

const StDtype* find_dtype(std::string_view name) {
  for (const StDtype& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

const StDtype& dtype_entry(DType dtype) {
  for (const StDtype& d : kDtypes) {
    if (d.qkv == dtype) return d;
  }
  fail<DTypeError>("safetensors: invalid dtype code ", static_cast<int>(dtype));
}

struct Entry {
  std::string name;
  const StDtype* dtype = nullptr;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  uint64_t n = 0;              // header length: the data section starts at 8 + n
  std::vector<Entry> entries;  // in data_offsets order
  std::map<std::string, std::string> metadata;
};

using json = nlohmann::json;

uint64_t read_header_length(std::span<const std::byte> first8, uint64_t file_size, const Context& ctx) {
  if (first8.size() < 8) {
    fail_at(ctx, "file of ", file_size, " bytes is too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first8[i]) << (8 * i);
  if (n > kMaxHeaderBytes) fail_at(ctx, "header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n + 8 > file_size) {
    fail_at(ctx, "header length ", n, " runs past the end of the file (", file_size, " bytes)");
  }
  return n;
}

// Parses JSON rejecting duplicate keys in the top two object levels (nlohmann would
// keep the last one silently; serde rejects duplicate fields) and nesting past kHeaderNesting.
json parse_json(std::string_view text, const Context& ctx) {
  std::vector<std::set<std::string>> keys;  // per open object, by depth
  const json::parser_callback_t reject_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > 2) return true;
    const auto d = static_cast<size_t>(depth);
    if (event == json::parse_event_t::object_start) {
      if (keys.size() <= d) keys.resize(d + 1);
      keys[d].clear();
    } else if (event == json::parse_event_t::key && d >= 1 && d - 1 < keys.size()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys[d - 1].insert(key).second) fail_at(ctx, "header has duplicate key ", quote_name(key));
    }
    return true;
  };
  return parse_json_nesting_at_most(text, kHeaderNesting, ctx, reject_duplicates);
}

uint64_t get_count(const json& value, const std::string& name, const char* field, const Context& ctx) {
  if (!value.is_number_unsigned()) {
    fail_at(ctx, "tensor ", quote_name(name), " ", field, " holds ",
            value.is_number() ? value.dump() : value.type_name(), ", not a non-negative integer");
  }
  return value.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const json& info, const Context& ctx) {
  if (!info.is_object()) fail_at(ctx, "tensor ", quote_name(name), " is not an object");
  // Unknown fields are ignored, as serde does for the reference's TensorInfo.
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) fail_at(ctx, "tensor ", quote_name(name), " has no \"", field, "\"");
  }
  Entry e;
  e.name = name;
  const json& dtype = info["dtype"];
  if (!dtype.is_string()) fail_at(ctx, "tensor ", quote_name(name), " dtype is not a string");
  e.dtype = find_dtype(dtype.get_ref<const std::string&>());
  if (e.dtype == nullptr) {
    fail_at(ctx, "tensor ", quote_name(name), " has unknown dtype ", quote_name(dtype.get_ref<const std::string&>()));
  }
  const json& shape = info["shape"];
  if (!shape.is_array()) fail_at(ctx, "tensor ", quote_name(name), " shape is not an array");
  for (const json& dim : shape) {
    const uint64_t d = get_count(dim, name, "shape", ctx);
    if (d > static_cast<uint64_t>(kMaxElements)) {
      fail_at(ctx, "tensor ", quote_name(name), " has dimension ", d, ", too large");
    }
    e.shape.push_back(static_cast<int64_t>(d));
  }
  const json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_at(ctx, "tensor ", quote_name(name), " data_offsets is not a [begin, end] pair");
  }
  e.begin = get_count(offsets[0], name, "data_offsets", ctx);
  e.end = get_count(offsets[1], name, "data_offsets", ctx);
  return e;
}

// Bytes the tensor's shape and dtype need (the reference's checked arithmetic).
uint64_t needed_bytes(const Entry& e, const Context& ctx) {
  const int64_t numel = checked_numel(e.shape).value_or(-1);
  uint64_t bits = 0;
  if (numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), e.dtype->bits, &bits)) {
    fail_at(ctx, "tensor ", quote_name(e.name), " shape ", shape_str(e.shape), " of ", e.dtype->name,
            " has too many elements (overflow)");
  }
  if (bits % 8 != 0) {
    fail_at(ctx, "tensor ", quote_name(e.name), " shape ", shape_str(e.shape), " of ", e.dtype->name,
            " is not a whole number of bytes");
  }
  return bits / 8;
}

// The reference's Metadata::validate: sorted by offsets, the tensors must tile
// the data section exactly, each holding exactly the bytes its shape needs.
void validate_offsets(Header& h, uint64_t file_size, const Context& ctx) {
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t start = 0;
  for (const Entry& e : h.entries) {
    const std::string where = "tensor " + quote_name(e.name) + " data_offsets [" + std::to_string(e.begin) + ", " +
                              std::to_string(e.end) + ")";
    if (e.begin != start) {
      fail_at(ctx, where, e.begin < start ? " overlap" : " leave a gap after",
              " the previous tensor's data (ending at ", start,
              "): offsets must tile the data section without gaps or overlaps");
    }
    if (e.end < e.begin) fail_at(ctx, where, " end before they begin");
    const uint64_t needed = needed_bytes(e, ctx);
    if (e.end - e.begin != needed) {
      fail_at(ctx, where, " hold ", e.end - e.begin, " bytes but shape ", shape_str(e.shape), " of ", e.dtype->name,
              " needs ", needed);
    }
    start = e.end;
  }
  const uint64_t data_size = file_size - 8 - h.n;
  if (start != data_size) {
    fail_at(ctx, "the tensors' data_offsets end at ", start, " but the data section after the header holds ", data_size,
            " bytes");
  }
}

void parse_metadata(const json& value, Header& h, const Context& ctx) {
  if (value.is_null()) return;  // serde reads null as "no metadata"
  if (!value.is_object()) fail_at(ctx, "\"__metadata__\" is not an object of strings");
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) fail_at(ctx, "\"__metadata__\" entry ", quote_name(key), " is not a string");
    h.metadata.emplace(key, v.get<std::string>());
  }
}

Header parse_header(std::string_view text, uint64_t n, uint64_t file_size, const Context& ctx) {
  const json root = parse_json(text, ctx);
  if (!root.is_object()) fail_at(ctx, "header is not a JSON object");
  Header h;
  h.n = n;
  for (const auto& [name, info] : root.items()) {
    if (name == "__metadata__") {
      parse_metadata(info, h, ctx);
    } else {
      h.entries.push_back(parse_entry(name, info, ctx));
    }
  }
  validate_offsets(h, file_size, ctx);
  return h;
}

Header read_header(std::span<const std::byte> bytes, uint64_t file_size, const Context& ctx) {
  const uint64_t n = read_header_length(bytes, file_size, ctx);
  if (bytes.size() < 8 + n) fail_at<IOError>(ctx, "the file shrank while being read");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(n));
  return parse_header(text, n, file_size, ctx);
}

// ---- writing --------------------------------------------------------------------

struct Prepared {
  std::string prefix;        // length and header
  std::vector<Tensor> data;  // contiguous, in file order
};

Prepared prepare(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata,
                 const char* op) {
  // The reference's order: widest dtype (by its enum) first, then name.
  std::vector<std::pair<const std::string*, const Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail<ValueError>(op, ": a tensor cannot be named \"__metadata__\"");
    order.emplace_back(&name, &t);
  }
  const auto rank = [](const Tensor* t) { return &dtype_entry(t->dtype()) - kDtypes.data(); };
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return rank(a.second) != rank(b.second) ? rank(a.second) > rank(b.second) : *a.first < *b.first;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  Prepared p;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    p.data.push_back(t->to(Device::cpu()).contiguous());  // a GPU tensor is copied to the host
    const uint64_t end = offset + p.data.back().nbytes();
    header[*name] = {{"dtype", dtype_entry(t->dtype()).name}, {"shape", t->shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    fail<ValueError>(op, ": cannot write the header (tensor names and metadata must be UTF-8): ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  for (size_t i = 0; i < 8; ++i) p.prefix += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  p.prefix += text;
  return p;
}

}  // namespace

SafetensorsFile safetensors_from_storage(std::shared_ptr<Storage> file, const Context& ctx) {
  const std::span<const std::byte> bytes(file->data(), file->nbytes());
  const Header h = read_header(bytes, bytes.size(), ctx);
  for (const Entry& e : h.entries) {
    if (!e.dtype->qkv) {
      fail_at<DTypeError>(ctx, "tensor ", quote_name(e.name), " has dtype ", e.dtype->name,
                          ", which qkv cannot hold (qkv holds BOOL, I8, I32, I64, F16, BF16, F32, F64)");
    }
  }
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const Entry& e : h.entries) {
    const auto offset = static_cast<size_t>(8 + h.n + e.begin);
    // The storage is ours, so bool bytes are fixed in place.
    if (*e.dtype->qkv == DType::b8) normalize_bools(file->data() + offset, static_cast<size_t>(e.end - e.begin));
    out.tensors.emplace(e.name, view_or_copy(file, offset, *e.dtype->qkv, e.shape, contiguous_strides(e.shape)));
  }
  return out;
}

std::vector<TensorInfo> inspect_safetensors(const std::filesystem::path& path, const Context& ctx) {
  const uint64_t size = file_size(path, ctx);
  std::vector<std::byte> head = read_range(path, 0, 8, ctx);
  const uint64_t n = read_header_length(head, size, ctx);
  head = read_range(path, 0, static_cast<size_t>(8 + n), ctx);
  const Header h = read_header(head, size, ctx);
  std::vector<TensorInfo> infos;
  for (const Entry& e : h.entries) {
    const std::string dtype = e.dtype->qkv ? std::string(dtype_name(*e.dtype->qkv)) : std::string(e.dtype->name);
    infos.push_back(TensorInfo{e.name, e.name, dtype, e.shape});
  }
  return infos;
}

}  // namespace detail

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& source) {
  return detail::safetensors_from_storage(detail::copy_to_storage(bytes), detail::Context{"parse_safetensors", source});
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  const detail::Context ctx{"load_safetensors", path.string()};
  return detail::safetensors_from_storage(detail::read_file(path, ctx), ctx);
}

std::vector<std::byte> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  const detail::Prepared p = detail::prepare(tensors, metadata, "serialize_safetensors");
  size_t total = p.prefix.size();
  for (const Tensor& t : p.data) total += t.nbytes();
  std::vector<std::byte> out(total);
  std::memcpy(out.data(), p.prefix.data(), p.prefix.size());
  size_t pos = p.prefix.size();
  for (const Tensor& t : p.data) {
    if (t.nbytes() > 0) std::memcpy(out.data() + pos, t.raw_data(), t.nbytes());
    pos += t.nbytes();
  }
  return out;
}

void save_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const detail::Prepared p = detail::prepare(tensors, metadata, "save_safetensors");
  std::vector<std::span<const std::byte>> chunks{std::as_bytes(std::span(p.prefix))};
  for (const Tensor& t : p.data) chunks.push_back(detail::tensor_bytes(t));
  detail::write_file(path, chunks, detail::Context{"save_safetensors", path.string()});
}

}  // namespace qkv::io
