// Safetensors files: Hugging Face checkpoints, and our own inputs, outputs and routing traces.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype,
// shape and byte range, then the tensors' bytes. Reading maps the file and hands out views into
// the mapping, so opening a 60 GB checkpoint costs only its header until tensors are touched.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moe/tensor.h"

namespace moe {

// A safetensors file mapped read-only into memory.
//
// open() checks the whole header before returning, with every check on in release builds, and
// throws moe::Error naming the file, the tensor and the offending value: a file too short for
// the length field; a header length of 0, over 100 MiB or past the end of the file; a header
// that is not a JSON object or repeats a key in any object; an entry that is not an object or
// lacks a string "dtype", an integer list "shape" or a two-integer "data_offsets"; a dtype
// outside F64, F32, F16, BF16, F8_E4M3, I64, I32, I8, U8; a negative dimension or an element
// count that overflows; offsets that are negative, reversed or past the data buffer; a byte range
// whose length is not numel * dtype size; two tensors whose byte ranges overlap; a
// "__metadata__" that is not an object of strings. Gaps between tensors are allowed.
//
// Views: tensor() returns a contiguous CPU view. It stays valid while this object (or the one
// it was moved into) lives. The memory is read-only: writing through a view faults. Changing or
// truncating the file while it is open is undefined, as for every memory-mapped reader.
//
// Alignment: the format allows byte offsets that are not a multiple of the element size, but
// kernels load elements through typed pointers. Every view is therefore aligned for its dtype:
// it points into the mapping when the file places the tensor aligned (true of every writer that
// pads the header to 8 bytes, this one and Hugging Face's included), and otherwise into an
// aligned copy that open() makes. is_zero_copy() tells which.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names sorted byte-wise (the header is a JSON object, whose order carries no meaning).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws moe::Error naming the tensor and the file when there is no such tensor.
  TensorView tensor(const std::string& name) const;
  // False when the file places the tensor misaligned and tensor() returns an aligned copy.
  bool is_zero_copy(const std::string& name) const;
  // The "__metadata__" object (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file as mapped, for callers that hand the mapping to something else at once
  // (pinning it for device uploads, hashing it).
  std::span<const std::byte> mapping() const;

 private:
  struct Entry {
    TensorView view;
    bool zero_copy = true;
  };
  struct Unmap {
    size_t size;  // no default initializer: unique_ptr needs Unmap default-constructible here
    void operator()(std::byte* address) const;
  };

  SafetensorsFile() = default;
  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::unique_ptr<std::byte, Unmap> mapping_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  std::vector<Tensor> aligned_copies_;  // of the tensors the file places misaligned
};

// Writes `tensors` (contiguous CPU tensors, names unique, non-empty and not "__metadata__") and
// `metadata` to `path` as safetensors. The header pads with spaces so the data starts 8-byte
// aligned; the tensors' bytes follow without gaps, wider dtypes first and otherwise in the given
// order, so that every tensor is aligned for its dtype (Hugging Face's writer sorts for the same
// reason). The file is written to `path + ".tmp"`, flushed to disk and renamed over `path`, so a
// crash leaves either the old file or the new one, never half of one. Throws moe::Error naming
// the path and the tensor.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moe
