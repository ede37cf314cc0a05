// Reading ddp_train's --metrics-out files, and every way one can be bad: each
// error names the file, and the line where one is at fault.
#include <gtest/gtest.h>

#include <cmath>

#include "ddp/plot/metrics.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

using testing::error_of;

class Metrics : public testing::TempDir {};

// Two records as ddp_train writes them (keys beyond the plotted ones included).
const char* const kTwoEpochs =
    R"({"epoch":1,"train_loss":2.30,"train_acc":0.10,"test_acc":0.12,"epoch_sec":0.5,"samples_per_sec":5000.0,"peak_rss_mib":[55.0]})"
    "\n"
    R"({"epoch":2,"train_loss":1.10,"train_acc":0.55,"test_acc":0.61,"epoch_sec":0.5,"samples_per_sec":5100.0,"peak_rss_mib":[56.0]})"
    "\n";

TEST_F(Metrics, ReadsEveryEpoch) {
  const ddp::plot::Run run = read_metrics({"np1", write("np1.jsonl", kTwoEpochs)});
  EXPECT_EQ(run.label, "np1");
  ASSERT_EQ(run.points.size(), 2u);
  EXPECT_EQ(run.points[0].epoch, 1);
  EXPECT_DOUBLE_EQ(run.points[0].train_loss, 2.30);
  EXPECT_DOUBLE_EQ(run.points[1].test_acc, 0.61);
  EXPECT_DOUBLE_EQ(run.points[1].train_acc, 0.55);
}

TEST_F(Metrics, SkipsBlankLinesAndSortsByEpoch) {
  const std::string path = write("m.jsonl", "\n" R"({"epoch":2,"train_loss":1,"test_acc":0.5})"
                                            "\n  \n" R"({"epoch":1,"train_loss":2,"test_acc":0.1})" "\n");
  const ddp::plot::Run run = read_metrics({"m", path});
  ASSERT_EQ(run.points.size(), 2u);
  EXPECT_EQ(run.points[0].epoch, 1);
  EXPECT_EQ(run.points[1].epoch, 2);
  EXPECT_TRUE(std::isnan(run.points[0].train_acc));  // not in the record, not asked for
}

// A run resumed from a checkpoint older than its last logged epoch logs that
// epoch again; the later record is the run that went on.
TEST_F(Metrics, LaterRecordOfAnEpochWins) {
  const std::string path = write("m.jsonl", R"({"epoch":1,"train_loss":2,"test_acc":0.1})" "\n"
                                            R"({"epoch":2,"train_loss":1.5,"test_acc":0.2})" "\n"
                                            R"({"epoch":2,"train_loss":1.4,"test_acc":0.3})" "\n");
  const ddp::plot::Run run = read_metrics({"m", path});
  ASSERT_EQ(run.points.size(), 2u);
  EXPECT_DOUBLE_EQ(run.points[1].train_loss, 1.4);
}

TEST_F(Metrics, MissingFileNamesIt) {
  const std::string path = this->path("absent.jsonl");
  const std::string e = error_of([&] { read_metrics({"x", path}); });
  EXPECT_HAS(e, path + ": cannot open");
  EXPECT_HAS(e, "No such file");
}

TEST_F(Metrics, LineThatIsNotJsonNamesFileAndLine) {
  const std::string path = write("m.jsonl", std::string(kTwoEpochs) + "{\"epoch\":3,\"train_loss\":\n");
  EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }), path + ":3: not a JSON line");
}

TEST_F(Metrics, RecordThatIsNotAnObject) {
  const std::string path = write("m.jsonl", "[1, 2]\n");
  EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }), path + ":1: expected a JSON object, got array");
}

TEST_F(Metrics, RecordLackingAKeyNamesIt) {
  const std::string path =
      write("m.jsonl", std::string(kTwoEpochs) + R"({"epoch":3,"train_loss":1.0,"train_acc":0.6})" "\n");
  EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }), path + ":3: no \"test_acc\" in this record");
}

TEST_F(Metrics, TrainAccuracyRequiredOnlyWhenAsked) {
  const std::string path = write("m.jsonl", R"({"epoch":1,"train_loss":2,"test_acc":0.1})" "\n");
  EXPECT_NO_THROW(read_metrics({"m", path}));
  EXPECT_HAS(error_of([&] { read_metrics({"m", path}, /*need_train_acc=*/true); }),
             path + ":1: no \"train_acc\"");
}

TEST_F(Metrics, NullIsNotANumber) {
  // nlohmann::json writes NaN as null.
  const std::string path = write("m.jsonl", R"({"epoch":1,"train_loss":null,"test_acc":0.1})" "\n");
  EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }),
             path + ":1: \"train_loss\" is null, not a number");
}

TEST_F(Metrics, EpochMustBeAWholeNumberFromOne) {
  for (const char* epoch : {"0", "1.5", "-2", "\"3\""}) {
    const std::string path =
        write("m.jsonl", std::string(R"({"epoch":)") + epoch + R"(,"train_loss":2,"test_acc":0.1})" "\n");
    EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }), path + ":1: \"epoch\" is ") << epoch;
  }
}

TEST_F(Metrics, NoRecordsIsAnError) {
  for (const char* text : {"", "\n\n  \n"}) {
    const std::string path = write("empty.jsonl", text);
    EXPECT_HAS(error_of([&] { read_metrics({"m", path}); }), path + ": no records");
  }
}

TEST(RunArg, LabelIsTheStemUnlessGiven) {
  EXPECT_EQ(parse_run_arg("runs/np4.jsonl").label, "np4");
  EXPECT_EQ(parse_run_arg("runs/np4.jsonl").path, "runs/np4.jsonl");
  EXPECT_EQ(parse_run_arg("metrics").label, "metrics");
  const RunArg named = parse_run_arg("4 ranks=runs/np4.jsonl");
  EXPECT_EQ(named.label, "4 ranks");
  EXPECT_EQ(named.path, "runs/np4.jsonl");
  // Only the first '=' splits.
  EXPECT_EQ(parse_run_arg("lr=0.2=a.jsonl").path, "0.2=a.jsonl");
  EXPECT_HAS(error_of([] { parse_run_arg("=a.jsonl"); }), "the label before '=' is empty");
  EXPECT_HAS(error_of([] { parse_run_arg("np1="); }), "no file after '='");
}

TEST_F(Metrics, ExistingFileWithEqualsIsAPath) {
  const std::string path = write("lr=0.2.jsonl", kTwoEpochs);
  const RunArg arg = parse_run_arg(path);
  EXPECT_EQ(arg.path, path);
  EXPECT_EQ(arg.label, "lr=0.2");
}

}  // namespace
}  // namespace ddp::plot
