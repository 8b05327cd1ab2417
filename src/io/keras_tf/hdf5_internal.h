// libhdf5 helpers of the Keras readers and writer (not public API): handles that
// close themselves, one lock around every HDF5 call (the Debian build is not
// thread-safe), error stacks turned into FormatError text, and dataset/attribute
// readers with every size checked.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/io_internal.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"

namespace qkv::io::detail {

// Owns an HDF5 identifier and closes it with H5Idec_ref.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    std::swap(id_, o.id_);
    return *this;
  }
  ~H5Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The lock every HDF5 call in this process is made under (and fork() of a reader
// process, which then calls libhdf5 without it); also turns HDF5's automatic error
// printing off once.
std::unique_lock<std::recursive_mutex> hdf5_lock();

// The innermost messages of HDF5's current error stack, for a message ("" if none).
std::string hdf5_error_text();

// `id` when it is valid, else FormatError "<what>: <hdf5 error>".
hid_t h5_check(hid_t id, const Context& ctx, const std::string& what);

// Access properties of class `cls` (H5P_GROUP_ACCESS, H5P_DATASET_ACCESS) that refuse
// to follow external links: a weight file is read from its own bytes only (a hostile
// file's link would open another HDF5 file on this machine).
H5Id local_access(hid_t cls, const Context& ctx);

// FormatError unless the HDF5 signature is at offset 0, 512, 1024, ....
void check_hdf5_signature(std::span<const std::byte> bytes, const Context& ctx);
// Opens an in-memory HDF5 image read-only (core driver) on `bytes` themselves, not a
// copy: they must stay alive and unchanged until the file and every object opened
// in it are closed. Checks the superblock signature first. libhdf5 1.10.8 is unsafe
// on hostile files: the readers call this in a child process (io/isolated.h).
H5Id open_hdf5_image(std::span<const std::byte> bytes, const Context& ctx);

// Dataset metadata: the qkv dtype (when there is one) and the listing's dtype name.
struct H5DatasetInfo {
  std::optional<DType> dtype;
  std::string dtype_name;
  Shape shape;
  bool little_endian = true;
};
H5DatasetInfo dataset_info(hid_t dset, const Context& ctx, const std::string& path);
// The dataset's data as a qkv tensor (DTypeError when it has no qkv dtype).
// `max_bytes` bounds what a (possibly hostile) header may make us allocate.
Tensor read_dataset(hid_t dset, const H5DatasetInfo& info, size_t max_bytes, const Context& ctx,
                    const std::string& path);

bool has_attr(hid_t obj, const char* name, const Context& ctx);
// A fixed-length string (array) attribute, as tf.keras writes layer_names and
// weight_names (an empty non-string array, as h5py writes [], gives no names);
// nullopt when `obj` has no attribute `name` or it holds variable-length strings.
// Variable-length strings are not read: libhdf5 1.10.8 reads them from the global
// heap without bounds checks and crashes on corrupt files (docs/formats-keras-tf.md).
std::optional<std::vector<std::string>> read_string_attr(hid_t obj, const char* name, const Context& ctx);

// Every dataset below `root` ("" = the whole file) as paths, in HDF5's name order.
std::vector<std::string> list_datasets(hid_t file, const Context& ctx);

// ---- Keras readers ---------------------------------------------------------------------
// The Keras layouts (hdf5_keras.cc), tensors read only when `data`. Takes no lock:
// it runs in a reader process, or in this one under hdf5_lock().
WeightFile read_keras_h5(std::span<const std::byte> bytes, bool data, const Context& ctx);
// read_keras_h5 in a reader process (hdf5_reader_process.cc): libhdf5 1.10.8 crashes,
// hangs or exhausts memory on hostile files (docs/formats-keras-tf.md), which then ends in a
// FormatError here. QKV_HDF5_TIMEOUT_S (default 120) bounds its time;
// QKV_HDF5_IN_PROCESS=1 reads in this process instead (for debugging libhdf5).
WeightFile read_keras_h5_isolated(std::span<const std::byte> bytes, bool data, const Context& ctx);

}  // namespace qkv::io::detail
