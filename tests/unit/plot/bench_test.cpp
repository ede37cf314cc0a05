// Reading bench/compare_pytorch.sh's DDP_BENCH_JSON lines.
#include <gtest/gtest.h>

#include "ddp/plot/bench.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

using testing::error_of;

class Bench : public testing::TempDir {};

TEST_F(Bench, SystemsAndModelsInFileOrder) {
  const std::string path = write("b.jsonl",
      R"j({"model":"lenet","np":2,"samples_per_sec":{"ddp_train":10166.0,"PyTorch 2.15.0 (pip)":3661.0}})j" "\n"
      R"j({"model":"lenet","np":1,"samples_per_sec":{"ddp_train":10736.0,"PyTorch 2.15.0 (pip)":3752.0}})j" "\n"
      R"j({"model":"resnet18","np":1,"samples_per_sec":{"ddp_train":73.2,"PyTorch 1.13.1 (Debian)":58.8}})j" "\n");
  const BenchTable t = read_bench(path);
  EXPECT_EQ(t.systems, (std::vector<std::string>{"ddp_train", "PyTorch 2.15.0 (pip)", "PyTorch 1.13.1 (Debian)"}));
  EXPECT_EQ(t.models, (std::vector<std::string>{"lenet", "resnet18"}));
  ASSERT_EQ(t.rows.size(), 3u);
  // By model, then world size.
  EXPECT_EQ(t.rows[0].model, "lenet");
  EXPECT_EQ(t.rows[0].np, 1);
  EXPECT_DOUBLE_EQ(*t.rows[0].rate[0], 10736.0);
  EXPECT_FALSE(t.rows[0].rate[2]);  // not measured for lenet
  EXPECT_EQ(t.rows[1].np, 2);
  EXPECT_EQ(t.rows[2].model, "resnet18");
  EXPECT_FALSE(t.rows[2].rate[1]);
  EXPECT_DOUBLE_EQ(*t.rows[2].rate[2], 58.8);
}

TEST_F(Bench, ModelIsOptionalAndTheNewestLineWins) {
  const std::string path = write("b.jsonl", R"j({"np":1,"samples_per_sec":{"ddp_train":100}})j" "\n"
                                            R"j({"np":1,"samples_per_sec":{"ddp_train":120}})j" "\n");
  const BenchTable t = read_bench(path);
  ASSERT_EQ(t.rows.size(), 1u);
  EXPECT_EQ(t.rows[0].model, "");
  EXPECT_DOUBLE_EQ(*t.rows[0].rate[0], 120);
}

TEST_F(Bench, ErrorsNameFileAndLine) {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {R"j({"samples_per_sec":{"ddp_train":1}})j", ":2: no \"np\" in this record"},
      {R"j({"np":0,"samples_per_sec":{"ddp_train":1}})j", ":2: \"np\" is 0, not a whole number >= 1"},
      {R"j({"np":1})j", ":2: no \"samples_per_sec\""},
      {R"j({"np":1,"samples_per_sec":5})j", ":2: \"samples_per_sec\" must map each system to its rate"},
      {R"j({"np":1,"samples_per_sec":{}})j", ":2: \"samples_per_sec\" must map each system to its rate"},
      {R"j({"np":1,"samples_per_sec":{"ddp_train":"fast"}})j",
       ":2: \"samples_per_sec\" of \"ddp_train\" is \"fast\", not a rate"},
      {R"j({"np":1,"samples_per_sec":{"ddp_train":-1}})j", ":2: \"samples_per_sec\" of \"ddp_train\" is -1"},
      {R"j({"model":3,"np":1,"samples_per_sec":{"ddp_train":1}})j", ":2: \"model\" is 3, not a string"},
      {"np 1 ddp 10736", ":2: not a JSON line"},
  };
  for (const Case& c : cases) {
    const std::string path =
        write("b.jsonl", std::string(R"j({"np":2,"samples_per_sec":{"ddp_train":1}})j") + "\n" + c.line + "\n");
    EXPECT_HAS(error_of([&] { read_bench(path); }), path + c.message) << c.line;
  }
}

TEST_F(Bench, EmptyOrMissingFile) {
  const std::string empty = write("empty.jsonl", "");
  EXPECT_HAS(error_of([&] { read_bench(empty); }), empty + ": no records");
  const std::string absent = path("absent.jsonl");
  EXPECT_HAS(error_of([&] { read_bench(absent); }), absent + ": cannot open");
}

}  // namespace
}  // namespace ddp::plot
