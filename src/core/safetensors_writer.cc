// write_safetensors: builds the header, then writes header and tensor bytes to a temporary file
// that is flushed and renamed over the target, so readers never see a partly written file.
// Tested in tests/core/safetensors_test.cc (round trips and a byte-exact small file).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/safetensors_format.h"
#include "moe/error.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

// Insertion-ordered, so the header lists the tensors in the order of their bytes.
using OrderedJson = nlohmann::ordered_json;

void check_tensor(const std::string& path, const std::string& name, const TensorView& view,
                  std::set<std::string_view>& seen) {
  if (name.empty()) fail("{}: tensor names must be non-empty", path);
  if (name == kSafetensorsMetadataKey) {
    fail("{}: tensor name \"{}\" is reserved for the metadata; rename the tensor", path, name);
  }
  if (!seen.insert(name).second) fail("{}: tensor name \"{}\" appears twice", path, name);
  const std::string what = fmt::format("{}: tensor \"{}\"", path, name);
  check_device(view, what.c_str(), Device::kCpu);
  check_contiguous(view, what.c_str());
  // TensorView's fields are public, so the shape may have been changed after construction.
  if (!checked_byte_size(view.shape, view.dtype)) {
    fail("{}: shape {} has a negative dimension or overflows", what, shape_string(view.shape));
  }
  if (view.data == nullptr && view.nbytes() != 0) {
    fail("{}: data is null for {} bytes", what, view.nbytes());
  }
}

// Indices into `tensors`, wider elements first and otherwise in the given order. Element sizes
// are powers of two and each tensor's length is a multiple of its element size, so with the data
// starting 8-byte aligned every tensor then starts aligned for its dtype: readers (ours, and
// PyTorch through Hugging Face's loader) can use it in place.
std::vector<size_t> data_order(const std::vector<std::pair<std::string, TensorView>>& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype) > dtype_size(tensors[b].second.dtype);
  });
  return order;
}

std::string build_header(const std::string& path,
                         const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::vector<size_t>& order,
                         const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> seen;
  for (const auto& [name, view] : tensors) check_tensor(path, name, view, seen);

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header[std::string(kSafetensorsMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (size_t index : order) {
    const auto& [name, view] = tensors[index];
    const uint64_t end = offset + view.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(view.dtype)},
                    {"shape", view.shape},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const OrderedJson::exception& e) {
    fail("{}: tensor names and metadata must be valid UTF-8: {}", path, e.what());
  }
  // Readers may load elements straight from the mapping only when the data starts aligned.
  const size_t unaligned = (kSafetensorsLengthBytes + text.size()) % kSafetensorsDataAlignment;
  if (unaligned != 0) text.append(kSafetensorsDataAlignment - unaligned, ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    fail(
        "{}: the header would be {} bytes, over the {} that readers accept; split the tensors "
        "over several files",
        path, text.size(), kSafetensorsMaxHeaderBytes);
  }
  return text;
}

// A file being written under a temporary name; removed unless commit() renamed it.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::string target) : target_(std::move(target)), path_(target_ + ".tmp") {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot create: {}", path_, std::strerror(errno));
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  // `what` names the bytes in messages (the header, a tensor).
  void write(const void* data, size_t size, std::string_view what) {
    const auto* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t written = ::write(fd_, bytes, size);
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) fail("{}: writing {}: {}", path_, what, std::strerror(errno));
      bytes += written;
      size -= static_cast<size_t>(written);
    }
  }

  // Flushes the bytes to disk before the rename, so that after a power loss the target holds
  // either its old content or all of the new one.
  void commit() {
    if (::fsync(fd_) != 0) fail("{}: flushing to disk: {}", path_, std::strerror(errno));
    const int closed = ::close(fd_);
    fd_ = -1;
    if (closed != 0) fail("{}: closing: {}", path_, std::strerror(errno));
    if (std::rename(path_.c_str(), target_.c_str()) != 0) {
      fail("{}: cannot rename to {}: {}", path_, target_, std::strerror(errno));
    }
    committed_ = true;
  }

 private:
  std::string target_;
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<size_t> order = data_order(tensors);
  const std::string header = build_header(path, tensors, order, metadata);
  unsigned char length[kSafetensorsLengthBytes];
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i) {
    length[i] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * i));
  }
  TemporaryFile file(path);
  file.write(length, sizeof length, "the header length");
  file.write(header.data(), header.size(), "the header");
  for (size_t index : order) {
    const auto& [name, view] = tensors[index];
    file.write(view.data, view.nbytes(), fmt::format("tensor \"{}\"", name));
  }
  file.commit();
}

}  // namespace moe
