#include "moe/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/expect_error.h"

#include "moe/error.h"

namespace moe {
namespace {

using testing::error_message;
using testing::expect_error;

namespace fs = std::filesystem;

constexpr DType kAllDtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kF8E4M3,
                                DType::kI8,  DType::kU8,   DType::kI64, DType::kF64};

std::string little_endian_u64(uint64_t value) {
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  return bytes;
}

// A file with `header` as its JSON (no padding added) followed by `data`.
std::string file_bytes(std::string_view header, std::string_view data = "") {
  return little_endian_u64(header.size()) + std::string(header) + std::string(data);
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string view_bytes(const TensorView& view) {
  return std::string(static_cast<const char*>(view.data), view.nbytes());
}

Tensor random_bytes_tensor(DType dtype, Shape shape, uint64_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < t.nbytes(); ++i) t.data<unsigned char>()[i] = static_cast<uint8_t>(rng());
  return t;
}

// Where views_are_sound stores what it read, so the reads cannot be optimized away.
volatile unsigned g_checksum_sink = 0;

// Every view of a file that opened lies inside the mapping (or in an aligned copy), is aligned
// for its dtype and overlaps no other view; reading all its bytes must not fault.
::testing::AssertionResult views_are_sound(const SafetensorsFile& file) {
  const std::span<const std::byte> mapping = file.mapping();
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;
  for (const std::string& name : file.names()) {
    const TensorView view = file.tensor(name);
    const auto* begin = static_cast<const std::byte*>(view.data);
    const auto* end = begin + view.nbytes();
    if (reinterpret_cast<uintptr_t>(begin) % dtype_size(view.dtype) != 0) {
      return ::testing::AssertionFailure() << "\"" << name << "\" is misaligned";
    }
    if (file.is_zero_copy(name) &&
        (begin < mapping.data() || end > mapping.data() + mapping.size())) {
      return ::testing::AssertionFailure() << "\"" << name << "\" lies outside the mapping";
    }
    unsigned checksum = 0;
    for (const std::byte* p = begin; p < end; ++p) checksum += std::to_integer<unsigned>(*p);
    g_checksum_sink = checksum;
    if (begin != end) ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return ::testing::AssertionFailure() << "two views overlap";
    }
  }
  return ::testing::AssertionSuccess();
}

// Each test gets a directory of its own under the system's temporary directory.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / fmt::format("moe_safetensors_test_{}_{}", ::getpid(), test);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string path(std::string_view name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeAndShapeWithMetadata) {
  const std::vector<Shape> shapes = {{}, {0}, {2, 0, 3}, {7}, {3, 5}, {2, 3, 4}};
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> named;
  for (DType dtype : kAllDtypes) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      tensors.push_back(random_bytes_tensor(dtype, shapes[s], tensors.size()));
      named.emplace_back(fmt::format("layers.{}.{}", dtype_name(dtype), s), tensors.back().view());
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "gr\u00fc\u00dfe, \"quoted\""}};
  const std::string file_path = path("all.safetensors");
  write_safetensors(file_path, named, metadata);

  const std::string raw = read_file(file_path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_size = 0;
  std::memcpy(&header_size, raw.data(), 8);
  EXPECT_EQ((8 + header_size) % 8, 0u) << "data must start 8-byte aligned";

  const SafetensorsFile file = SafetensorsFile::open(file_path);
  EXPECT_EQ(file.path(), file_path);
  EXPECT_EQ(file.metadata(), metadata);
  std::vector<std::string> expected_names;
  for (const auto& [name, view] : named) expected_names.push_back(name);
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ(file.names(), expected_names);

  EXPECT_TRUE(views_are_sound(file));
  for (const auto& [name, written] : named) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file.contains(name));
    const TensorView read = file.tensor(name);
    EXPECT_EQ(read.dtype, written.dtype);
    EXPECT_EQ(read.shape, written.shape);
    EXPECT_TRUE(read.strides.empty());
    EXPECT_EQ(read.device, Device::kCpu);
    EXPECT_TRUE(file.is_zero_copy(name));
    EXPECT_EQ(view_bytes(read), view_bytes(written));
  }
}

TEST_F(Safetensors, WritesNoMetadataObjectWhenThereIsNone) {
  const Tensor t = random_bytes_tensor(DType::kF32, {2}, 1);
  const std::string file_path = path("plain.safetensors");
  write_safetensors(file_path, {{"t", t.view()}});
  EXPECT_EQ(read_file(file_path).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(SafetensorsFile::open(file_path).metadata().empty());
}

// The exact bytes of a small file: the writer must produce them (putting the wider "w" first
// though it is given second), and the reader must read them.
TEST_F(Safetensors, SmallFileIsByteExact) {
  // 139 bytes of JSON, padded with 5 spaces so that 8 + 144 bytes put the data at offset 152.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("bias":{"dtype":"I8","shape":[],"data_offsets":[8,9]}})"
                             "     ";
  ASSERT_EQ(header.size(), 144u);
  const std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header +
                               std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0\xf9", 9);

  const float w[] = {1.5f, -2.0f};
  int8_t bias = -7;
  const std::string written_path = path("written.safetensors");
  write_safetensors(written_path,
                    {{"bias", TensorView(&bias, DType::kI8, {})},
                     {"w", TensorView(const_cast<float*>(w), DType::kF32, {2})}},
                    {{"format", "pt"}});
  EXPECT_EQ(read_file(written_path), expected);

  const std::string hand_path = path("hand.safetensors");
  write_file(hand_path, expected);
  const SafetensorsFile file = SafetensorsFile::open(hand_path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"bias", "w"}));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const TensorView read_w = file.tensor("w");
  ASSERT_EQ(read_w.shape, Shape{2});
  EXPECT_EQ(read_w.as<float>()[0], 1.5f);
  EXPECT_EQ(read_w.as<float>()[1], -2.0f);
  const TensorView read_bias = file.tensor("bias");
  EXPECT_EQ(read_bias.dtype, DType::kI8);
  EXPECT_EQ(read_bias.dim(), 0);
  EXPECT_EQ(read_bias.as<int8_t>()[0], -7);
  // The views point into the mapping, at the offsets the header gives.
  EXPECT_EQ(static_cast<const std::byte*>(read_w.data), file.mapping().data() + 152);
  EXPECT_EQ(static_cast<const std::byte*>(read_bias.data), file.mapping().data() + 160);
}

// The format allows any byte offset; views must still be aligned for their dtype.
TEST_F(Safetensors, MisalignedTensorsAreCopiedAligned) {
  // 8 + 106 bytes put the data at offset 114; "f" sits 1 byte further in, at 115.
  const std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  const std::string data = std::string("\x2a\x00\x00\x80\x3f", 5);
  ASSERT_EQ(header.size(), 106u);
  const std::string file_path = path("misaligned.safetensors");
  write_file(file_path, file_bytes(header, data));

  const SafetensorsFile file = SafetensorsFile::open(file_path);
  EXPECT_TRUE(file.is_zero_copy("u"));
  EXPECT_EQ(file.tensor("u").as<uint8_t>()[0], 0x2a);
  EXPECT_FALSE(file.is_zero_copy("f"));
  const TensorView f = file.tensor("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data) % alignof(float), 0u);
  EXPECT_EQ(f.as<float>()[0], 1.0f);
}

TEST_F(Safetensors, ViewsOutliveAMove) {
  const Tensor t = random_bytes_tensor(DType::kBF16, {4, 3}, 7);
  const std::string first = path("first.safetensors");
  const std::string second = path("second.safetensors");
  write_safetensors(first, {{"t", t.view()}});
  write_safetensors(second, {{"other", t.view()}});

  SafetensorsFile file = SafetensorsFile::open(first);
  const TensorView view = file.tensor("t");
  SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.tensor("t").data, view.data);
  EXPECT_EQ(view_bytes(view), view_bytes(t.view()));
  moved = SafetensorsFile::open(second);
  EXPECT_TRUE(moved.contains("other"));
  EXPECT_FALSE(moved.contains("t"));
}

TEST_F(Safetensors, MissingTensorNamesTheTensorAndTheFile) {
  const Tensor t = random_bytes_tensor(DType::kF32, {1}, 1);
  const std::string file_path = path("one.safetensors");
  write_safetensors(file_path, {{"present", t.view()}});
  const SafetensorsFile file = SafetensorsFile::open(file_path);
  expect_error([&] { file.tensor("absent"); }, {file_path, "\"absent\"", "no tensor"});
  expect_error([&] { file.is_zero_copy("absent"); }, {file_path, "\"absent\""});
}

TEST_F(Safetensors, UnreadablePathsAreErrors) {
  const std::string missing = path("missing.safetensors");
  expect_error([&] { SafetensorsFile::open(missing); }, {missing, "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir_.string()); }, {dir_.string(), "regular file"});
}

struct MalformedCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> words;  // each must appear in the message
};

std::vector<MalformedCase> malformed_cases() {
  const auto one = [](std::string_view entry, std::string_view data = std::string(8, '\0')) {
    return file_bytes(fmt::format(R"({{"a":{}}})", entry), data);
  };
  return {
      {"short", std::string("\x02\0\0", 3), {"too short", "3 bytes"}},
      {"empty", "", {"too short", "0 bytes"}},
      {"zero_length", file_bytes(""), {"header length is 0"}},
      {"absurd_length", little_endian_u64(uint64_t{200} << 20) + "{}", {"209715200", "limit"}},
      {"length_past_end", little_endian_u64(1000) + "{}", {"1000", "past the end of the file"}},
      {"length_max", little_endian_u64(~uint64_t{0}) + "{}", {"18446744073709551615", "limit"}},
      {"not_json", file_bytes("{\"a\": nope}"), {"not valid JSON"}},
      {"not_utf8", file_bytes("{\"a\xff\":1}"), {"not valid JSON"}},
      {"trailing_garbage", file_bytes("{} x"), {"not valid JSON"}},
      {"not_object", file_bytes("[1, 2]"), {"expected a JSON object", "array"}},
      {"entry_not_object", file_bytes(R"({"a": 3})"), {"tensor \"a\"", "expected an object"}},
      {"missing_dtype",
       one(R"({"shape":[2],"data_offsets":[0,8]})"),
       {"tensor \"a\"", "missing", "\"dtype\""}},
      {"dtype_not_string",
       one(R"({"dtype":32,"shape":[2],"data_offsets":[0,8]})"),
       {"\"dtype\"", "a string", "32"}},
      {"unknown_dtype",
       one(R"({"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]})"),
       {"\"dtype\"", "supported dtype", "F8_E5M2"}},
      {"missing_shape", one(R"({"dtype":"F32","data_offsets":[0,8]})"), {"missing", "\"shape\""}},
      {"shape_not_list",
       one(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})"),
       {"\"shape\"", "list of integers"}},
      {"shape_float",
       one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"),
       {"\"shape\"", "list of integers", "2.5"}},
      {"negative_dim",
       one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
       {"\"shape\"", "non-negative", "[-2]"}},
      {"dims_overflow",
       one(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]})"),
       {"\"shape\"", "overflows", "4611686018427387904"}},
      {"missing_offsets", one(R"({"dtype":"F32","shape":[2]})"), {"missing", "\"data_offsets\""}},
      {"offsets_count",
       one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
       {"\"data_offsets\"", "two integers", "got [0]"}},
      {"offsets_negative",
       one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
       {"\"data_offsets\"", "non-negative", "[-8, 0]"}},
      {"offsets_huge",
       one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]})"),
       {"\"data_offsets\"", "int64", "18446744073709551615"}},
      {"end_before_begin",
       one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
       {"\"data_offsets\"", "end before begin", "[8, 0]"}},
      {"past_data",
       one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       {"\"data_offsets\"", "past the end", "[0, 16]", "8-byte data buffer"}},
      {"wrong_length",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,8]})"),
       {"\"data_offsets\"", "4 bytes", "which is 8 bytes"}},
      {"overlap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  std::string(8, '\0')),
       {"\"a\"", "\"b\"", "overlap", "[4, 8)"}},
      {"duplicate_name",
       file_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                  "xy"),
       {"duplicate tensor name", "\"a\""}},
      {"duplicate_field",
       one(R"({"dtype":"F32","dtype":"U8","shape":[8],"data_offsets":[0,8]})"),
       {"duplicate key", "\"dtype\""}},
      {"metadata_not_object", file_bytes(R"({"__metadata__":[1]})"), {"__metadata__", "object"}},
      {"metadata_value_not_string",
       file_bytes(R"({"__metadata__":{"k":1}})"),
       {"__metadata__.k", "a string", "1"}},
  };
}

TEST_F(Safetensors, MalformedFilesGiveErrorsNamingFileAndProblem) {
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.name);
    const std::string file_path = path(fmt::format("{}.safetensors", c.name));
    write_file(file_path, c.bytes);
    std::vector<std::string> words = c.words;
    words.push_back(file_path);
    expect_error([&] { SafetensorsFile::open(file_path); }, words);
  }
}

TEST_F(Safetensors, WriterRejectsBadTensorsAndLeavesTheOldFile) {
  const Tensor t = random_bytes_tensor(DType::kF32, {2, 3}, 3);
  const std::string file_path = path("kept.safetensors");
  write_safetensors(file_path, {{"t", t.view()}});
  const std::string before = read_file(file_path);

  const auto expect_rejected = [&](std::vector<std::pair<std::string, TensorView>> tensors,
                                   std::vector<std::string> words) {
    words.push_back(file_path);
    expect_error([&] { write_safetensors(file_path, tensors); }, words);
    EXPECT_EQ(read_file(file_path), before);
    EXPECT_FALSE(fs::exists(file_path + ".tmp"));
  };
  expect_rejected({{"", t.view()}}, {"non-empty"});
  expect_rejected({{"__metadata__", t.view()}}, {"reserved"});
  expect_rejected({{"x", t.view()}, {"x", t.view()}}, {"\"x\"", "twice"});
  expect_rejected({{"\xff", t.view()}}, {"UTF-8"});
  TensorView transposed(t.data<void>(), DType::kF32, {3, 2}, {1, 3}, Device::kCpu);
  expect_rejected({{"transposed", transposed}}, {"\"transposed\"", "contiguous"});
  TensorView on_gpu(t.data<void>(), DType::kF32, {2, 3}, Device::kCuda);
  expect_rejected({{"gpu", on_gpu}}, {"\"gpu\"", "CPU"});
  TensorView null_data(nullptr, DType::kF32, {2});
  expect_rejected({{"null", null_data}}, {"\"null\"", "null"});
  TensorView negative = t.view();
  negative.shape = {-1, 6};
  expect_rejected({{"negative", negative}}, {"\"negative\"", "negative"});

  const std::string nowhere = path("no_such_dir/out.safetensors");
  expect_error([&] { write_safetensors(nowhere, {{"t", t.view()}}); }, {nowhere, "cannot create"});
}

TEST_F(Safetensors, WriterReplacesAnExistingFile) {
  const Tensor a = random_bytes_tensor(DType::kF32, {4}, 1);
  const Tensor b = random_bytes_tensor(DType::kI64, {3}, 2);
  const std::string file_path = path("replaced.safetensors");
  write_safetensors(file_path, {{"a", a.view()}});
  write_safetensors(file_path, {{"b", b.view()}});
  const SafetensorsFile file = SafetensorsFile::open(file_path);
  EXPECT_EQ(file.names(), std::vector<std::string>{"b"});
  EXPECT_EQ(view_bytes(file.tensor("b")), view_bytes(b.view()));
}

// Damage to a file, weighted toward its header (the first `header_end` bytes), where damage
// changes what open() must check.
std::string corrupt(std::string bytes, size_t header_end, std::mt19937_64& rng) {
  const auto pick = [&](size_t below) { return below == 0 ? 0 : rng() % below; };
  const std::string_view json_chars = "{}[],:\"0123456789-.eE ";
  const int num_edits = 1 + static_cast<int>(pick(3));
  for (int edit = 0; edit < num_edits && bytes.size() > 8; ++edit) {
    const size_t in_header = 8 + pick(std::min(bytes.size(), header_end) - 8);
    switch (pick(6)) {
      case 0:  // flip one bit of the header
        bytes[in_header] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // put a JSON-significant character into the header
        bytes[in_header] = json_chars[pick(json_chars.size())];
        break;
      case 2:  // truncate
        bytes.resize(pick(bytes.size() + 1));
        break;
      case 3:  // damage the header length
        bytes[pick(8)] = static_cast<char>(rng());
        break;
      case 4:  // shift the rest of the header by one byte
        if (rng() % 2) {
          bytes.erase(in_header, 1);
        } else {
          bytes.insert(in_header, 1, json_chars[pick(json_chars.size())]);
        }
        break;
      default:  // flip a bit anywhere
        bytes[pick(bytes.size())] ^= static_cast<char>(1u << pick(8));
        break;
    }
  }
  return bytes;
}

// MOE_SAFETENSORS_SEED=<seed> reruns one case alone.
std::vector<uint64_t> corruption_seeds(uint64_t first, int count) {
  if (const char* only = std::getenv("MOE_SAFETENSORS_SEED")) return {std::stoull(only)};
  std::vector<uint64_t> seeds(static_cast<size_t>(count));
  std::iota(seeds.begin(), seeds.end(), first);
  return seeds;
}

TEST_F(Safetensors, CorruptedFilesOpenOrThrowButNeverCrash) {
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> named;
  const std::vector<std::pair<DType, Shape>> specs = {
      {DType::kF32, {3, 2}}, {DType::kBF16, {5}}, {DType::kF8E4M3, {2, 2}}, {DType::kI64, {}},
      {DType::kU8, {0}},     {DType::kF64, {2}},  {DType::kI8, {3}},        {DType::kF16, {1, 1}},
  };
  for (const auto& [dtype, shape] : specs) {
    tensors.push_back(random_bytes_tensor(dtype, shape, tensors.size()));
    named.emplace_back(fmt::format("t{}", named.size()), tensors.back().view());
  }
  const std::string valid_path = path("valid.safetensors");
  write_safetensors(valid_path, named, {{"format", "pt"}});
  const std::string valid = read_file(valid_path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, valid.data(), 8);

  const std::string file_path = path("corrupt.safetensors");
  int num_opened = 0;
  for (uint64_t seed : corruption_seeds(1, 3000)) {
    std::mt19937_64 rng(seed);
    write_file(file_path, corrupt(valid, 8 + header_size, rng));
    const std::string repro = fmt::format(
        "seed {}; rerun with MOE_SAFETENSORS_SEED={} ./build/release/tests/moe_tests "
        "--gtest_filter=Safetensors.CorruptedFilesOpenOrThrowButNeverCrash",
        seed, seed);
    try {
      const SafetensorsFile file = SafetensorsFile::open(file_path);
      ASSERT_TRUE(views_are_sound(file)) << repro;
      ++num_opened;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find(file_path), std::string::npos)
          << e.what() << "; " << repro;
    } catch (const std::exception& e) {
      FAIL() << "not a moe::Error: " << e.what() << "; " << repro;
    }
  }
  // Damage to the data alone leaves a valid file: some cases must have opened.
  if (!std::getenv("MOE_SAFETENSORS_SEED")) {
    EXPECT_GT(num_opened, 0);
  }
}

}  // namespace
}  // namespace moe
