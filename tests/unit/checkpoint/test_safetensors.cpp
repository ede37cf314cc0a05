#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/checkpoint/safetensors.hpp"
#include "ddp/core/error.hpp"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddp_st_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const char* name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string bytes_of(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(Safetensors, RoundTripAndLayout) {
  const std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  const std::vector<float> b = {0.125f, 42.0f};
  write_safetensors(path("m.safetensors"), {{"fc.weight", {2, 3}, w.data()}, {"fc.bias", {2}, b.data()}},
                    {{"model", "lenet"}});
  // The layout a Python reader relies on: u64 LE header size, JSON, data at 8-aligned offset.
  const std::string raw = bytes_of(path("m.safetensors"));
  uint64_t len = 0;
  std::memcpy(&len, raw.data(), 8);
  EXPECT_EQ((8 + len) % 8, 0u);
  auto header = nlohmann::json::parse(raw.substr(8, len));
  EXPECT_EQ(header["fc.weight"]["dtype"], "F32");
  EXPECT_EQ(header["fc.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["fc.bias"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(header["__metadata__"]["model"], "lenet");
  EXPECT_EQ(raw.size(), 8 + len + 32);
  float first;
  std::memcpy(&first, raw.data() + 8 + len, 4);
  EXPECT_EQ(first, 1.5f);

  const auto f = read_safetensors(path("m.safetensors"));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.find("fc.weight")->data, w);
  EXPECT_EQ(f.find("fc.bias")->data, b);
  EXPECT_EQ(f.metadata.at("model"), "lenet");
  // No temporary file is left beside it.
  int files = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1);
}

TEST_F(Safetensors, ReplacesAnExistingFile) {
  const std::vector<float> a = {1}, b = {2};
  write_safetensors(path("x.safetensors"), {{"t", {1}, a.data()}}, {});
  write_safetensors(path("x.safetensors"), {{"t", {1}, b.data()}}, {});
  EXPECT_EQ(read_safetensors(path("x.safetensors")).find("t")->data[0], 2.0f);
}

TEST_F(Safetensors, TruncatedFileIsAnErrorNamingIt) {
  const std::vector<float> w(100, 1.0f);
  write_safetensors(path("t.safetensors"), {{"w", {100}, w.data()}}, {});
  const std::string raw = bytes_of(path("t.safetensors"));
  std::ofstream(path("t.safetensors"), std::ios::binary | std::ios::trunc).write(raw.data(), raw.size() - 10);
  try {
    read_safetensors(path("t.safetensors"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path("t.safetensors")), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, UnwritableDirectoryIsAnErrorNamingIt) {
  const std::vector<float> w = {1};
  EXPECT_THROW(write_safetensors("/nonexistent/dir/m.safetensors", {{"w", {1}, w.data()}}, {}), Error);
}

}  // namespace
}  // namespace ddp::checkpoint
