#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/core/error.hpp"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("ddp_ckpt_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunState state(int64_t step) const {
    RunState s;
    s.epoch = 2;
    s.step_in_epoch = 5;
    s.global_step = step;
    s.samples_consumed = step * 64;
    s.world_size = 4;
    s.epoch_loss_sum = 12.5;
    s.config = {{"model", "lenet"}, {"global_batch", "64"}};
    return s;
  }
  std::vector<TensorView> tensors() const { return {{"w", {2, 2}, w_.data()}, {"b", {2}, b_.data()}}; }

  std::string dir_;
  std::vector<float> w_ = {1, 2, 3, 4}, b_ = {-1, 0.5f};
};

std::string expect_decode_error(const std::string& path, const std::string& bytes) {
  try {
    decode_checkpoint(path, bytes);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "decoded without error";
  return "";
}

TEST_F(Checkpoints, RoundTrip) {
  const std::string bytes = encode_checkpoint(state(17), tensors());
  const auto c = decode_checkpoint("x", bytes);
  EXPECT_EQ(c.state.global_step, 17);
  EXPECT_EQ(c.state.epoch, 2);
  EXPECT_EQ(c.state.step_in_epoch, 5);
  EXPECT_EQ(c.state.samples_consumed, 17 * 64);
  EXPECT_EQ(c.state.world_size, 4);
  EXPECT_DOUBLE_EQ(c.state.epoch_loss_sum, 12.5);
  EXPECT_EQ(c.state.config.at("model"), "lenet");
  EXPECT_EQ(c.file.find("w")->data, w_);
  EXPECT_EQ(c.file.find("b")->data, b_);
}

TEST_F(Checkpoints, EveryFlippedPayloadBitIsCaught) {
  const std::string good = encode_checkpoint(state(1), tensors());
  // The tensor bytes are the last 24 bytes of the file.
  for (size_t i = good.size() - 24; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    EXPECT_NE(expect_decode_error("f.safetensors", bad).find("checksum mismatch"), std::string::npos) << i;
  }
}

TEST_F(Checkpoints, FlippedMetadataValueIsCaught) {
  std::string bad = encode_checkpoint(state(1), tensors());
  const size_t at = bad.find("\"epoch_loss_sum\":\"12.5\"");
  ASSERT_NE(at, std::string::npos);
  bad[at + 19] = '3';  // 12.5 -> 13.5
  const std::string msg = expect_decode_error("f.safetensors", bad);
  EXPECT_NE(msg.find("f.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

TEST_F(Checkpoints, TruncatedWrongMagicAndFutureVersionAreNamed) {
  const std::string good = encode_checkpoint(state(1), tensors());
  EXPECT_NE(expect_decode_error("t.st", good.substr(0, good.size() - 7)).find("t.st"), std::string::npos);
  EXPECT_NE(expect_decode_error("t.st", good.substr(0, 5)).find("truncated"), std::string::npos);
  EXPECT_NE(expect_decode_error("m.st", "GARBAGE!" + good.substr(8)).find("m.st"), std::string::npos);
  const std::string future = encode_checkpoint(state(1), tensors(), kFormatVersion + 1);
  const std::string msg = expect_decode_error("v.st", future);
  EXPECT_NE(msg.find("version " + std::to_string(kFormatVersion + 1)), std::string::npos) << msg;
  EXPECT_NE(msg.find("newer"), std::string::npos) << msg;
}

TEST_F(Checkpoints, PlainSafetensorsIsNotACheckpoint) {
  const std::string plain = encode_safetensors(tensors(), {{"format", "ddp-model"}});
  EXPECT_NE(expect_decode_error("p.st", plain).find("not a ddp checkpoint"), std::string::npos);
}

TEST_F(Checkpoints, SaveKeepsTheNewestAndListsNewestFirst) {
  for (int64_t step : {5, 10, 15, 20}) save_checkpoint(dir_, state(step), tensors(), 3);
  // A temporary file left by a killed writer, and an unrelated file.
  std::ofstream(dir_ + "/" + checkpoint_file_name(25) + ".tmp.123") << "partial";
  std::ofstream(dir_ + "/notes.txt") << "mine";
  auto list = list_checkpoints(dir_);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(fs::path(list[0]).filename(), checkpoint_file_name(20));
  EXPECT_EQ(fs::path(list[2]).filename(), checkpoint_file_name(10));
  save_checkpoint(dir_, state(30), tensors(), 3);
  EXPECT_FALSE(fs::exists(dir_ + "/" + checkpoint_file_name(25) + ".tmp.123"));
  EXPECT_TRUE(fs::exists(dir_ + "/notes.txt"));
  EXPECT_EQ(fs::path(list_checkpoints(dir_)[0]).filename(), checkpoint_file_name(30));
  EXPECT_EQ(decode_checkpoint(list_checkpoints(dir_)[0], read_file_bytes(list_checkpoints(dir_)[0])).state.global_step,
            30);
}

TEST_F(Checkpoints, IncompatibleFieldIsNamedWithBothValues) {
  try {
    check_compatible("c.st", {{"global_batch", "256"}, {"model", "lenet"}},
                     {{"global_batch", "128"}, {"model", "lenet"}});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("c.st"), std::string::npos) << msg;
    EXPECT_NE(msg.find("global_batch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("128"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(check_compatible("c.st", {{"model", "lenet"}}, {{"model", "lenet"}}));
}

}  // namespace
}  // namespace ddp::checkpoint
