// SafetensorsFile: maps a safetensors file, checks its header completely, and hands out views
// into the mapping. Every offset and length in the file is untrusted: nothing is dereferenced
// until it has been checked against the size of the mapping. Tested in
// tests/core/safetensors_test.cc, including a randomized corruption test run under ASan.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "core/safetensors_format.h"
#include "core/safetensors_parse.h"
#include "moe/error.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

using Json = nlohmann::json;

using HeaderEntry = SafetensorsEntry;

// Closes a file descriptor on every path out of map_file.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Maps the file read-only. An empty file (which mmap refuses) comes back as {nullptr, 0} for
// parse_safetensors() to refuse with the other files too short for the length field.
std::pair<std::byte*, size_t> map_file(const std::string& path) {
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat status {};
  if (::fstat(file.fd, &status) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(status.st_mode)) fail("{}: not a regular file", path);
  const auto size = static_cast<size_t>(status.st_size);
  if (size == 0) return {nullptr, 0};
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (address == MAP_FAILED) {
    fail("{}: cannot map {} bytes: {}", path, size, std::strerror(errno));
  }
  return {static_cast<std::byte*>(address), size};
}

uint64_t read_little_endian_u64(const std::byte* bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value |= uint64_t{std::to_integer<uint8_t>(bytes[i])} << (8 * i);
  return value;
}

// Parser messages quote the bytes they stopped at, which in a corrupt file may be anything;
// control and non-ASCII bytes become '?' so the message stays one printable line.
std::string printable(std::string_view text) {
  std::string result(text);
  for (char& c : result) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return result;
}

// Parses the header, refusing any object that repeats a key: nlohmann::json would keep the
// last of two equal keys silently, and two entries for one tensor name mean a corrupt file.
Json parse_header(const std::string& path, const char* begin, const char* end) {
  std::vector<std::set<std::string>> keys_of_open_objects;
  const Json::parser_callback_t check_keys = [&](int depth, Json::parse_event_t event,
                                                 Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys_of_open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys_of_open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (keys_of_open_objects.back().count(key) != 0) {
          if (depth == 1) fail("{}: duplicate tensor name \"{}\" in the header", path, key);
          fail("{}: duplicate key \"{}\" in an object of the header", path, key);
        }
        keys_of_open_objects.back().insert(std::move(key));
        break;
      }
      case Json::parse_event_t::array_start:
      case Json::parse_event_t::array_end:
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    Json header = Json::parse(begin, end, check_keys);
    if (!header.is_object()) {
      fail("{}: header: expected a JSON object; got {}", path, describe_json(header));
    }
    return header;
  } catch (const Json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, printable(e.what()));
  }
}

std::map<std::string, std::string> read_metadata(const std::string& path, const Json& metadata) {
  const JsonFields fields(metadata, path, std::string(kSafetensorsMetadataKey) + ".");
  if (!metadata.is_object()) {
    fail("{}: \"{}\": expected an object of strings; got {}", path, kSafetensorsMetadataKey,
         describe_json(metadata));
  }
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) fields.fail_field(key, "a string", describe_json(value));
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

HeaderEntry read_entry(const std::string& path, const std::string& name, const Json& value,
                       uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor \"{}\"", path, name);
  if (!value.is_object()) {
    fail("{}: expected an object with \"dtype\", \"shape\" and \"data_offsets\"; got {}", where,
         describe_json(value));
  }
  const JsonFields fields(value, where);
  HeaderEntry entry;
  entry.name = name;

  const std::string dtype_name = fields.string("dtype");
  const std::optional<DType> dtype = parse_safetensors_dtype(dtype_name);
  if (!dtype) {
    fields.fail_field("dtype", fmt::format("a supported dtype ({})", safetensors_dtype_names()),
                      fmt::format("\"{}\"", dtype_name));
  }
  entry.dtype = *dtype;

  entry.shape = fields.integer_list("shape");
  if (std::any_of(entry.shape.begin(), entry.shape.end(), [](int64_t d) { return d < 0; })) {
    fields.fail_field("shape", "non-negative dimensions", shape_string(entry.shape));
  }
  const std::optional<uint64_t> byte_size = checked_byte_size(entry.shape, entry.dtype);
  if (!byte_size) {
    fields.fail_field("shape", "a size in bytes that fits in int64",
                      fmt::format("{} (the byte count overflows)", shape_string(entry.shape)));
  }

  const std::vector<int64_t> offsets = fields.integer_list("data_offsets");
  if (offsets.size() != 2) {
    fields.fail_field("data_offsets", "two integers [begin, end]", shape_string(offsets));
  }
  const std::string given = fmt::format("[{}, {}]", offsets[0], offsets[1]);
  if (offsets[0] < 0 || offsets[1] < 0) {
    fields.fail_field("data_offsets", "non-negative offsets", given);
  }
  entry.begin = static_cast<uint64_t>(offsets[0]);
  entry.end = static_cast<uint64_t>(offsets[1]);
  if (entry.end < entry.begin) {
    fields.fail_field("data_offsets", "begin <= end", given + " (end before begin)");
  }
  if (entry.end > data_size) {
    fields.fail_field("data_offsets",
                      fmt::format("offsets within the {}-byte data buffer", data_size),
                      given + " (past the end of the file)");
  }
  if (entry.end - entry.begin != *byte_size) {
    fields.fail_field("data_offsets",
                      fmt::format("a range of {} bytes (shape {} of {})", *byte_size,
                                  shape_string(entry.shape), dtype_name),
                      fmt::format("{}, which is {} bytes", given, entry.end - entry.begin));
  }
  return entry;
}

// Two tensors sharing bytes would let a write through one corrupt the other, and in a file
// nobody writes that on purpose: it is corruption. Empty ranges overlap nothing.
void check_no_overlap(const std::string& path, std::vector<const HeaderEntry*> entries) {
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  const HeaderEntry* reaches_furthest = nullptr;
  for (const HeaderEntry* entry : entries) {
    if (entry->begin == entry->end) continue;
    if (reaches_furthest != nullptr && entry->begin < reaches_furthest->end) {
      fail("{}: tensors \"{}\" (bytes [{}, {})) and \"{}\" (bytes [{}, {})) overlap", path,
           reaches_furthest->name, reaches_furthest->begin, reaches_furthest->end, entry->name,
           entry->begin, entry->end);
    }
    if (reaches_furthest == nullptr || entry->end > reaches_furthest->end) {
      reaches_furthest = entry;
    }
  }
}

}  // namespace

void SafetensorsFile::Unmap::operator()(std::byte* address) const { ::munmap(address, size); }

SafetensorsLayout parse_safetensors(const std::string& path, std::span<const std::byte> file) {
  const size_t size = file.size();
  if (size < kSafetensorsLengthBytes) {
    fail("{}: file too short: {} bytes; a safetensors file starts with an {}-byte header length",
         path, size, kSafetensorsLengthBytes);
  }
  const uint64_t header_size = read_little_endian_u64(file.data());
  if (header_size == 0) fail("{}: header length is 0; expected a JSON object", path);
  if (header_size > kSafetensorsMaxHeaderBytes) {
    fail("{}: header length {} exceeds the limit of {} bytes; is this a safetensors file?", path,
         header_size, kSafetensorsMaxHeaderBytes);
  }
  if (header_size > size - kSafetensorsLengthBytes) {
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, header_size, size);
  }
  const auto* header_begin = reinterpret_cast<const char*>(file.data() + kSafetensorsLengthBytes);
  const Json header = parse_header(path, header_begin, header_begin + header_size);

  SafetensorsLayout layout;
  layout.data_offset = kSafetensorsLengthBytes + header_size;
  const uint64_t data_size = size - layout.data_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == kSafetensorsMetadataKey) {
      layout.metadata = read_metadata(path, value);
    } else {
      layout.entries.push_back(read_entry(path, name, value, data_size));
    }
  }
  std::vector<const HeaderEntry*> by_offset;
  for (const HeaderEntry& entry : layout.entries) by_offset.push_back(&entry);
  check_no_overlap(path, std::move(by_offset));
  return layout;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  const auto [address, size] = map_file(path);
  file.mapping_ = std::unique_ptr<std::byte, Unmap>(address, Unmap{size});
  SafetensorsLayout layout = parse_safetensors(path, {address, size});

  std::byte* data = address + layout.data_offset;
  file.metadata_ = std::move(layout.metadata);
  for (const HeaderEntry& entry : layout.entries) {
    std::byte* bytes = data + entry.begin;
    const bool aligned = reinterpret_cast<uintptr_t>(bytes) % dtype_size(entry.dtype) == 0;
    if (aligned) {
      file.entries_.emplace(entry.name, Entry{TensorView(bytes, entry.dtype, entry.shape), true});
      continue;
    }
    Tensor copy(entry.dtype, entry.shape);
    std::memcpy(copy.data<void>(), bytes, copy.nbytes());
    file.entries_.emplace(entry.name, Entry{copy.view(), false});
    file.aligned_copies_.push_back(std::move(copy));
  }
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) result.push_back(name);
  return result;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    fail("{}: no tensor named \"{}\" (the file holds {} tensors; names() lists them)", path_, name,
         entries_.size());
  }
  return it->second;
}

TensorView SafetensorsFile::tensor(const std::string& name) const { return entry(name).view; }

bool SafetensorsFile::is_zero_copy(const std::string& name) const { return entry(name).zero_copy; }

std::span<const std::byte> SafetensorsFile::mapping() const {
  if (!mapping_) return {};
  return {mapping_.get(), mapping_.get_deleter().size};
}

}  // namespace moe
