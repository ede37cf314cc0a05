// Bad input: each gives a clear line "ddp_train: error: ... (rank R)" naming
// the culprit, and a non-zero exit of the whole job, also at -np 4.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;

// A copy of the real data set in a temporary directory, for corrupting.
std::string copy_of_real_data() {
  const std::string dir = make_temp_dir();
  for (const auto& e : fs::directory_iterator(DDP_DATA_DIR))
    if (e.path().extension() == ".gz") fs::copy_file(e.path(), fs::path(dir) / e.path().filename());
  return dir;
}

TEST(CliErrors, MissingDataDirNamesTheDirectory) {
  for (int np : {0, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    expect_failure(run_ddp_train(np, "--data-dir /nonexistent/fashion --epochs 1"), "/nonexistent/fashion");
  }
}

TEST(CliErrors, MissingFileNamesTheFile) {
  const std::string dir = copy_of_real_data();
  fs::remove(fs::path(dir) / "t10k-labels-idx1-ubyte.gz");
  expect_failure(run_ddp_train(4, "--data-dir " + dir + " --epochs 1"), "t10k-labels-idx1-ubyte");
  remove_tree(dir);
}

TEST(CliErrors, MalformedImagesFileNamesTheFile) {
  const std::string dir = copy_of_real_data();
  const std::string bad = dir + "/train-images-idx3-ubyte";
  fs::remove(bad + ".gz");
  {
    std::ofstream f(bad, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};  // magic 2049: labels
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    f << std::string(28 * 28, '\0');
  }
  for (int np : {0, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    auto r = run_ddp_train(np, "--data-dir " + dir + " --epochs 1");
    expect_failure(r, bad);
    EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;
  }
  remove_tree(dir);
}

TEST(CliErrors, TruncatedImagesFileNamesTheFile) {
  const std::string dir = copy_of_real_data();
  const std::string bad = dir + "/train-images-idx3-ubyte";
  fs::remove(bad + ".gz");
  {
    std::ofstream f(bad, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 3, 0, 0, 0, 100, 0, 0, 0, 28, 0, 0, 0, 28};  // 100 images announced
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    f << std::string(28 * 28 * 10, '\0');  // only 10 there
  }
  auto r = run_ddp_train(4, "--data-dir " + dir + " --epochs 1");
  expect_failure(r, bad);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  remove_tree(dir);
}

TEST(CliErrors, BatchNotDivisibleByWorldSize) {
  auto r = run_ddp_train(4, "--synthetic 2000 --batch-size 250 --epochs 1");
  expect_failure(r, "--batch-size 250");
  EXPECT_NE(r.err.find("world size 4"), std::string::npos) << r.err;
  // Every rank finds the same fault; it is said once.
  EXPECT_EQ(error_lines(r.err), 1) << r.err;
}

TEST(CliErrors, DatasetSmallerThanOneGlobalBatch) {
  for (int np : {0, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    auto r = run_ddp_train(np, "--synthetic 200 --batch-size 256 --epochs 1");
    expect_failure(r, "dataset too small");
    EXPECT_NE(r.err.find("256"), std::string::npos) << r.err;
  }
}

TEST(CliErrors, UnknownModel) {
  for (int np : {0, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    auto r = run_ddp_train(np, "--model resnet9000 --epochs 1");
    expect_failure(r, "unknown model 'resnet9000'");
    EXPECT_NE(r.err.find("lenet"), std::string::npos) << "the message should list the known models: " << r.err;
  }
}

TEST(CliErrors, UnknownFlag) {
  for (int np : {0, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    expect_failure(run_ddp_train(np, "--epochs 1 --learning-rate 0.1"), "learning-rate");
  }
}

TEST(CliErrors, BadFlagValue) {
  expect_failure(run_ddp_train(2, "--epochs many"), "epochs");
  expect_failure(run_ddp_train(2, "--lr -1"), "--lr");
}

TEST(CliErrors, UnwritableMetricsFile) {
  expect_failure(run_ddp_train(2, "--synthetic 600 --epochs 1 --metrics-out /nonexistent/dir/m.jsonl"),
               "/nonexistent/dir/m.jsonl");
}

TEST(Cli, HelpListsTheFlags) {
  auto r = run_ddp_train(0, "--help");
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* flag : {"--model", "--data-dir", "--synthetic", "--epochs", "--batch-size", "--lr",
                           "--momentum", "--weight-decay", "--seed", "--backend", "--device", "--bucket-cap-mb",
                           "--metrics-out", "--output-model", "--no-overlap"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace ddp::test
