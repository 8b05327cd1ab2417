// A WeightFile as bytes, for the HDF5 reader process to send back (not public API):
// the listing and tensor table, then each tensor's bytes at a 64-byte aligned offset.
// Both ends are the same build, so the layout needs no version.
#pragma once

#include "io/keras_tf/isolated.h"
#include "qkv/io_keras.h"

namespace qkv::io::detail {

// The child's reply; the tensors' bytes go out as they are (no copy into one buffer).
// Every tensor must be contiguous.
IsolatedReply encode_weight_file(WeightFile file);

// The parent's side: every count, size and offset is checked (FormatError "reply of
// the reader process is garbled: ..."); tensors are views into `reply`.
WeightFile decode_weight_file(std::shared_ptr<Storage> reply, const Context& ctx);

}  // namespace qkv::io::detail
