// ReferenceMods (attention/mods_reference.h): the modifiers' definitions, element by element.
#include "attention/mods_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qkv::attention {

namespace {

std::vector<double> values(const std::optional<Tensor>& t) {
  return t ? t->contiguous().to_vector<double>() : std::vector<double>{};
}

int64_t floor_of(int64_t a, int64_t u) {  // floor(a / u), u > 0
  return static_cast<int64_t>(std::floor(static_cast<double>(a) / static_cast<double>(u)));
}

int64_t blocks_of(int64_t n, int64_t u) {  // ceil(n / u) for n >= 0; n + u - 1 overflows for u near 2^63
  return n == 0 ? 0 : (n - 1) / u + 1;
}

}  // namespace

ReferenceMods::ReferenceMods(const AttentionMods& mods, int64_t lq, int64_t lk, int64_t heads)
    : m_(mods), active_(mods.any()), lq_(lq), lk_(lk), heads_(std::max<int64_t>(heads, 1)) {
  qdoc_ = values(mods.document_ids);
  kdoc_ = mods.key_document_ids ? values(mods.key_document_ids) : qdoc_;
  alibi_ = values(mods.alibi_slopes);
  relative_ = values(mods.relative_bias);
  pattern_ = values(mods.block_pattern);
  const int64_t u = mods.block_size, qblocks = blocks_of(lq, u), kblocks = blocks_of(lk, u);
  for (int64_t qb = 0; qb < qblocks && mods.random_blocks > 0; ++qb) {
    random_.push_back(random_key_blocks(mods.random_seed, qb, kblocks, mods.random_blocks));
  }
}

bool ReferenceMods::allowed(int64_t entry, int64_t i, int64_t j) const {
  if (!qdoc_.empty() && qdoc_[static_cast<size_t>(i)] != kdoc_[static_cast<size_t>(j)]) return false;
  if (m_.mask_mod && !m_.mask_mod(entry / heads_, entry % heads_, i, j)) return false;
  const int64_t u = m_.block_size;
  const bool has_window = m_.window_left || m_.window_right || m_.dilation > 1;
  const bool has_blocks = m_.block_pattern || m_.random_blocks > 0;
  bool any_term = false, ok = false;
  if (has_window) {
    any_term = true;
    const int64_t diag = m_.align == AttentionMods::Align::bottom_right ? i + lk_ - lq_ : i;
    const int64_t delta = floor_of(j, u) - floor_of(diag, u);
    const bool left_ok = !m_.window_left || delta >= -*m_.window_left;
    const bool right_ok = !m_.window_right || delta <= *m_.window_right;
    ok = ok || (left_ok && right_ok && delta % m_.dilation == 0);
  }
  if (m_.prefix > 0) any_term = true, ok = ok || j < m_.prefix;
  if (!m_.global_tokens.empty()) {
    any_term = true;
    for (int64_t g : m_.global_tokens) ok = ok || g == i || g == j;
  }
  if (has_blocks) {
    any_term = true;
    const int64_t kblocks = blocks_of(lk_, u);
    if (!pattern_.empty()) {
      const int64_t qblocks = blocks_of(lq_, u), h = m_.block_pattern->dim() == 3 ? entry % heads_ : 0;
      ok = ok || pattern_[static_cast<size_t>((h * qblocks + i / u) * kblocks + j / u)] != 0.0;
    }
    if (!random_.empty()) {
      const auto& r = random_[static_cast<size_t>(i / u)];
      ok = ok || std::find(r.begin(), r.end(), j / u) != r.end();
    }
  }
  return !any_term || ok;
}

double ReferenceMods::score(double s, int64_t entry, int64_t i, int64_t j, double* cap_grad) const {
  const int64_t h = entry % heads_;
  if (cap_grad) *cap_grad = 1.0;
  if (m_.softcap > 0.0) {
    const double t = std::tanh(s / m_.softcap);
    s = m_.softcap * t;
    if (cap_grad) *cap_grad = 1.0 - t * t;
  }
  const int64_t diag = m_.align == AttentionMods::Align::bottom_right ? i + lk_ - lq_ : i;
  if (!alibi_.empty()) s += alibi_[static_cast<size_t>(h)] * static_cast<double>(j - diag);
  if (!relative_.empty()) {
    const int64_t row = m_.relative_bias->size(0) == 1 ? 0 : h;
    s += relative_[static_cast<size_t>(row * (lq_ + lk_ - 1) + (j - i + lq_ - 1))];
  }
  if (m_.score_mod) s = m_.score_mod(s, entry / heads_, h, i, j);
  return s;
}

double ReferenceMods::masked() const {
  return m_.masked_fill ? *m_.masked_fill : -std::numeric_limits<double>::infinity();
}

}  // namespace qkv::attention
