// read_small_text_file: the whole text of a file within the bound, and a moe::Error naming the
// file for a folder, a file over the bound and a missing file.
#include "core/text_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/expect_error.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

class SmallTextFile : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = fs::temp_directory_path() / ("moe_text_file_test_" + std::to_string(getpid()));
    fs::create_directories(folder_);
  }
  void TearDown() override { fs::remove_all(folder_); }

  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path path = folder_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  fs::path folder_;
};

TEST_F(SmallTextFile, ReadsTheWholeTextUpToTheBound) {
  const std::string text = "{\"a\": 1}\nsecond line\n";
  const fs::path path = write("ok.json", text);
  EXPECT_EQ(read_small_text_file(path, text.size(), "a test file"), text);
  EXPECT_EQ(read_small_text_file(write("empty.json", ""), 0, "a test file"), "");
}

TEST_F(SmallTextFile, RejectsAFileOverTheBound) {
  const fs::path path = write("big.json", std::string(101, 'x'));
  expect_error([&] { read_small_text_file(path, 100, "a test file"); },
               {path.string(), "101 bytes", "expected a test file of at most 100 bytes"});
}

TEST_F(SmallTextFile, RejectsAFolderAndAMissingFile) {
  expect_error([&] { read_small_text_file(folder_, 100, "a test file"); },
               {folder_.string(), "is a folder; expected a test file"});
  const fs::path missing = folder_ / "missing.json";
  expect_error([&] { read_small_text_file(missing, 100, "a test file"); },
               {missing.string(), "cannot open a test file"});
}

}  // namespace
}  // namespace moe
