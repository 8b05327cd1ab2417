// A std::bad_alloc that escaped qkv code, named by the operation it came from.
//
// Every public entry point (einsum, einops, attention, the qkv::nn layers, qkv::io
// load/save/inspect) opens an AllocationScope (qkv/size.h), which holds views and
// pointers only: no string is built unless an error needs one. Allocations qkv checks
// itself (Tensor, Storage, the buffer pool) raise OutOfMemoryError naming the innermost
// scope. A std::bad_alloc from deeper code (a std::vector growing) unwinds the scopes
// instead; the innermost scope it leaves keeps its text on this thread until the next
// scope opens, so a catch outside every scope can still name the call:
//   catch (const std::bad_alloc&) { throw qkv::OutOfMemoryError(qkv::bad_alloc_message("myapp")); }
// gives "scaled_dot_product_attention (q [1, 1, 1048576, 1], k [...], v [...]): out of
// memory (std::bad_alloc)". The Python bindings (MemoryError) and the qkv CLI do this.
#pragma once

#include <string>
#include <string_view>

namespace qkv {

// "<scope>: out of memory (std::bad_alloc)" for a std::bad_alloc caught outside its
// scopes: the innermost scope it unwound, else the innermost active one, else
// `fallback`. Forgets the unwound scope.
std::string bad_alloc_message(std::string_view fallback);

// Forgets the scope an exception left; for a catch that handled some other exception,
// so that its scope never names a later std::bad_alloc.
void forget_unwound_scope();

}  // namespace qkv
