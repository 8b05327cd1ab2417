// The fused CPU forward's keys packed once per call for its gathered key tiles
// (attention_cpu_gather.h: gather_keys, run_group). Internal to that kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention/attention_cpu_tiles.h"
#include "attention/problem.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "tensor/buffer_pool.h"

namespace qkv::attention::tiles {

// K packed once per call in 64-key panels (gemm_pack_panels) for the gathered products'
// Q K^T: brgemm reads a run of whole panels as it is, where it transposed the K rows of
// every product into that layout (BigBird: each key block 7 times per head, 7% of the time
// at L = 16384 against 2.6% for full attention's 128-row tiles). Where gather_keys runs,
// tiles are a multiple of 64 keys wide and the operands float.
struct KeyPanels {
  Tensor buffer;                 // [entries, size] float32, pooled
  std::vector<int64_t> offsets;  // ascending: each entry's K offset from Flash::k
  int64_t size = 0;              // floats per entry: gemm_panels_size(Dk, Lk)
  const float* of(int64_t k_offset) const {
    const auto e = std::lower_bound(offsets.begin(), offsets.end(), k_offset) - offsets.begin();
    return buffer.data<float>() + e * size;
  }
};

// The distinct K offsets (k/v heads) the call's batch entries read, ascending.
inline std::vector<int64_t> key_entries(const Problem& p) {
  std::vector<int64_t> offsets;
  for (int64_t b = 0; b < p.batch_size; ++b) offsets.push_back(batch_offset(p.k, p.batch, b, p.gqa_group));
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  return offsets;
}

// The call's K entries (the distinct k/v heads the batch reads) packed, or nothing where
// the tiles are not float and whole panels wide. The gathered path (`gathered`:
// attention_cpu_gather.h's gather_keys) reads them always; the plain and masked tiles
// (product_tile) where each entry's K is read by at least kMinReads query tiles: packing
// costs a pass over K and one float copy of it per entry, where each product transposes
// its key tile (oneDNN's, on every call) while it is in cache. Measured (2 threads, AMD
// EPYC Zen 4, paired runs): (4, 8, 256, 64), 2 reads, 3-10% slower packed in three of four
// pairs; (4, 8, 512, 64), 4 reads, 1.3-2.3% faster; (4, 8, 1024, 64), 8 reads, 2-3% faster.
template <class K>
std::optional<KeyPanels> pack_keys(const Flash<K>& f, bool gathered) {
  if constexpr (!std::is_same_v<typename K::S, float> || !std::is_same_v<typename K::G, float>) {
    return std::nullopt;
  } else {
    constexpr int64_t kMinReads = 4;
    const Problem& p = *f.p;
    // Not where gemm_panels would unpack them again (AVX2: oneDNN has no packed kernel there).
    if (f.tiles.bc % 64 != 0 || p.lk == 0 || f.k8 != nullptr || !gemm_panels_native()) return std::nullopt;
    KeyPanels kp;
    kp.offsets = key_entries(p);
    const auto entries = static_cast<int64_t>(kp.offsets.size());
    const int64_t reads = (p.lq + f.tiles.br - 1) / f.tiles.br * (p.batch_size / entries);
    if (!gathered && reads < kMinReads) return std::nullopt;
    kp.size = key_panels_size(p.dk, p.lk, f.chunk);  // per Dk chunk where Q K^T is chunked (Flash::chunk)
    kp.buffer = kernels::empty_pooled({entries, kp.size}, DType::f32, "packed keys");  // [entries, size]
    // Streamed stores: the products read a head's panels long after they are written (all
    // heads are packed first); measured 1.3-1.5% faster at L = 4096 and 16384 than cached ones.
    parallel_for(0, entries, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t e = lo; e < hi; ++e) {
        pack_key_panels(f.k + kp.offsets[static_cast<size_t>(e)], p.lk, p.dk, p.k.stride(-2), f.chunk,
                        kp.buffer.data<float>() + e * kp.size, /*stream=*/true);
      }
    });
    return kp;
  }
}

}  // namespace qkv::attention::tiles
