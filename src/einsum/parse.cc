// einsum stage 1: parsing and checking the equation (numpy's rules and error cases).
#include "einsum/parse.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace qkv::einsum_detail {

namespace {

int letter_id(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  return -1;
}

char id_letter(int id) { return id < 26 ? static_cast<char>('A' + id) : static_cast<char>('a' + id - 26); }

// The character starting at t[i], whole: quoting one byte of a UTF-8 sequence would
// make the message invalid UTF-8 (Python then raises UnicodeDecodeError, not ours).
std::string_view char_at(std::string_view t, size_t i) {
  size_t n = 1;
  while (i + n < t.size() && (static_cast<unsigned char>(t[i + n]) & 0xC0) == 0x80) ++n;
  return t.substr(i, n);
}

// One term: letters before and after an optional "...".
struct Term {
  std::vector<int> before, after;
  bool ellipsis = false;
  size_t letters() const { return before.size() + after.size(); }
};

struct Parser {
  std::string_view equation;
  std::span<const Shape> shapes;

  template <class E = FormatError, class... Args>
  [[noreturn]] void error(Args&&... args) const {
    fail_eq<E>(equation, shapes, std::forward<Args>(args)...);
  }

  Term term(std::string_view t, const char* where) const {
    Term out;
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      if (c == '.') {
        if (t.substr(i, 3) != "..." || out.ellipsis) {
          error("invalid ellipsis in ", where, " '", t, "': '...' must be three dots, at most once per term");
        }
        out.ellipsis = true;
        i += 2;
        continue;
      }
      const int id = letter_id(c);
      if (id < 0) error("invalid character '", char_at(t, i), "' in ", where, " '", t, "' (labels are A-Z, a-z)");
      (out.ellipsis ? out.after : out.before).push_back(id);
    }
    return out;
  }
};

// Strips whitespace; splits "lhs->rhs" (rhs absent when implicit).
std::string strip(std::string_view equation) {
  std::string s;
  for (char c : equation)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  return s;
}

std::vector<std::string_view> split_commas(std::string_view lhs) {
  std::vector<std::string_view> terms;
  size_t start = 0;
  for (size_t i = 0; i <= lhs.size(); ++i) {
    if (i == lhs.size() || lhs[i] == ',') {
      terms.push_back(lhs.substr(start, i - start));
      start = i + 1;
    }
  }
  return terms;
}

}  // namespace

std::string label_name(int id) {
  if (id < kLetters) return std::string{'\'', id_letter(id), '\''};
  return "'...' dim " + std::to_string(id - kLetters);
}

std::string shapes_str(std::span<const Shape> shapes) {
  if (shapes.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i) s.append(", ");
    s.append(shape_str(shapes[i]));
  }
  return s;
}

std::string Spec::term(std::span<const int> labels) const {
  std::string s;
  for (int l : labels) s += symbols[l];
  return s;
}

std::string Spec::full_equation() const {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s.push_back(',');
    s.append(term(inputs[i]));
  }
  s.append("->");
  s.append(term(output));
  return s;
}

namespace {

// Label ids of every operand's dims; checks term lengths against ranks.
void label_inputs(const Parser& p, const std::vector<Term>& terms, Spec& spec) {
  for (size_t i = 0; i < terms.size(); ++i) {
    const Term& t = terms[i];
    const int64_t rank = static_cast<int64_t>(p.shapes[i].size());
    if (static_cast<int64_t>(t.letters()) > rank) {
      p.error<ShapeError>("operand ", i, " has ", rank, " dims but its term has ", t.letters(), " labels");
    }
    if (!t.ellipsis && static_cast<int64_t>(t.letters()) != rank) {
      p.error<ShapeError>("operand ", i, " has ", rank, " dims but its term has ", t.letters(),
                          " labels and no '...' to cover the rest");
    }
    spec.ellipsis_rank = std::max(spec.ellipsis_rank, static_cast<int>(rank - static_cast<int64_t>(t.letters())));
  }
  if (kLetters + spec.ellipsis_rank > kMaxLabels) {
    p.error<ShapeError>("'...' covers ", spec.ellipsis_rank, " dims; at most ", kMaxLabels - kLetters,
                        " are supported");
  }
  for (size_t i = 0; i < terms.size(); ++i) {
    const Term& t = terms[i];
    std::vector<int> labels = t.before;
    const int r = static_cast<int>(p.shapes[i].size() - t.letters());
    for (int j = 0; j < r; ++j) labels.push_back(kLetters + spec.ellipsis_rank - r + j);
    labels.insert(labels.end(), t.after.begin(), t.after.end());
    spec.inputs.push_back(std::move(labels));
  }
}

void label_output(const Parser& p, const std::string* rhs, Spec& spec) {
  std::array<int, kMaxLabels> count{};
  for (const auto& labels : spec.inputs)
    for (int l : labels) ++count[l];
  if (rhs == nullptr) {  // implicit: broadcast dims, then letters seen once, sorted
    for (int j = 0; j < spec.ellipsis_rank; ++j) spec.output.push_back(kLetters + j);
    for (int l = 0; l < kLetters; ++l)
      if (count[l] == 1) spec.output.push_back(l);
    return;
  }
  const Term t = p.term(*rhs, "output");
  if (!t.ellipsis && spec.ellipsis_rank > 0) {
    p.error<ShapeError>("'...' covers ", spec.ellipsis_rank, " dims in the inputs but the output has no '...'");
  }
  std::array<bool, kLetters> seen{};
  for (const auto* part : {&t.before, &t.after}) {
    for (int l : *part) {
      if (count[l] == 0) p.error("output label ", label_name(l), " does not appear in the inputs");
      if (seen[l]) p.error("output label ", label_name(l), " appears more than once");
      seen[l] = true;
    }
  }
  spec.output = t.before;
  for (int j = 0; j < (t.ellipsis ? spec.ellipsis_rank : 0); ++j) spec.output.push_back(kLetters + j);
  spec.output.insert(spec.output.end(), t.after.begin(), t.after.end());
}

// Label sizes: equal within an operand (diagonals), numpy broadcasting across operands.
void size_labels(const Parser& p, Spec& spec) {
  spec.sizes.assign(kMaxLabels, 0);
  std::vector<int> owner(kMaxLabels, -1);  // operand that set the current size
  std::vector<bool> seen(kMaxLabels, false);
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const auto& labels = spec.inputs[i];
    for (size_t d = 0; d < labels.size(); ++d) {
      const int l = labels[d];
      const int64_t n = p.shapes[i][d];
      for (size_t e = 0; e < d; ++e) {
        if (labels[e] == l && p.shapes[i][e] != n) {
          p.error<ShapeError>("label ", label_name(l), " is repeated in operand ", i, " with sizes ", p.shapes[i][e],
                              " and ", n, " (a diagonal needs equal sizes)");
        }
      }
      if (!seen[l] || spec.sizes[l] == 1) {  // first sight, or a 1 that broadcasts
        seen[l] = true;
        spec.sizes[l] = n;
        owner[l] = static_cast<int>(i);
      } else if (n != 1 && n != spec.sizes[l]) {
        p.error<ShapeError>("size of label ", label_name(l), " is ", spec.sizes[l], " in operand ", owner[l], " but ",
                            n, " in operand ", i);
      }
    }
  }
}

void name_labels(Spec& spec) {
  spec.symbols.assign(kMaxLabels, '?');
  std::array<bool, kLetters> used{};
  for (const auto& labels : spec.inputs)
    for (int l : labels)
      if (l < kLetters) used[l] = true;
  for (int l = 0; l < kLetters; ++l) spec.symbols[l] = id_letter(l);
  int next = 0;
  for (int j = 0; j < spec.ellipsis_rank; ++j) {
    while (next < kLetters && used[next]) ++next;
    if (next < kLetters) spec.symbols[kLetters + j] = id_letter(next++);
  }
}

}  // namespace

Spec parse(std::string_view equation, std::span<const Shape> shapes) {
  Parser p{equation, shapes};
  if (shapes.empty()) p.error<ValueError>("no operands given");
  const std::string s = strip(equation);
  const size_t arrow = s.find("->");
  if (arrow != std::string::npos && s.find("->", arrow + 2) != std::string::npos) {
    p.error("'->' may appear only once");
  }
  const std::string lhs = s.substr(0, arrow);
  const std::string rhs = arrow == std::string::npos ? std::string() : s.substr(arrow + 2);
  for (char c : lhs + rhs) {
    if (c == '-' || c == '>') p.error("invalid character '", c, "' ('->' must be written as one token)");
  }
  const std::vector<std::string_view> term_texts = split_commas(lhs);
  if (term_texts.size() != shapes.size()) {
    p.error<ValueError>("the equation has ", term_texts.size(), " input term(s) but ", shapes.size(),
                        " operand(s) were given");
  }
  std::vector<Term> terms;
  for (size_t i = 0; i < term_texts.size(); ++i) {
    terms.push_back(p.term(term_texts[i], ("term " + std::to_string(i)).c_str()));
  }
  Spec spec;
  spec.equation = std::string(equation);
  spec.shapes.assign(shapes.begin(), shapes.end());
  label_inputs(p, terms, spec);
  label_output(p, arrow == std::string::npos ? nullptr : &rhs, spec);
  size_labels(p, spec);
  name_labels(spec);
  return spec;
}

}  // namespace qkv::einsum_detail
