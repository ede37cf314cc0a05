// Seeing a run: the step-time breakdown and every rank's peak memory in the
// epoch lines, metrics and summary; --trace's per-rank Chrome traces, their
// shape, the overlap of all-reduce and backward they show, and their merge;
// --debug-collectives on a run whose ranks agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_outputs.hpp"

namespace ddp::test {
namespace {

using json = nlohmann::json;

// LeNet at batch 128 on 2048 generated images: 16 steps an epoch; buckets of
// 0.1 MiB, so several all-reduces run while backward still computes.
const std::string kRun = "--synthetic 2048 --batch-size 128 --bucket-cap-mb 0.1 --quiet";

struct Span {
  std::string name, cat;
  int pid = 0, tid = 0;
  double begin = 0, end = 0;
};

std::vector<Span> spans_of(const json& trace) {
  std::vector<Span> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    out.push_back({e.at("name"), e.at("cat"), e.at("pid"), e.at("tid"), ts, ts + dur});
  }
  return out;
}

// Every span has begin <= end, and on each (process, track) spans nest: a
// span that starts inside another ends inside it too (1 ns of slack for the
// microseconds' rounding).
void expect_well_formed(const std::vector<Span>& spans) {
  std::map<std::pair<int, int>, std::vector<Span>> tracks;
  for (const Span& s : spans) {
    EXPECT_LE(s.begin, s.end) << s.name;
    tracks[{s.pid, s.tid}].push_back(s);
  }
  for (auto& [track, list] : tracks) {
    std::stable_sort(list.begin(), list.end(), [](const Span& a, const Span& b) {
      return a.begin < b.begin || (a.begin == b.begin && a.end > b.end);
    });
    std::vector<Span> open;
    for (const Span& s : list) {
      while (!open.empty() && open.back().end <= s.begin + 1e-3) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(s.end, open.back().end + 1e-3)
            << "rank " << track.first << " track " << track.second << ": " << s.name << " [" << s.begin << ", "
            << s.end << "] overlaps " << open.back().name << " [" << open.back().begin << ", " << open.back().end
            << "] without nesting in it";
      }
      open.push_back(s);
    }
  }
}

// Bucket all-reduce spans that overlap a backward span of the same rank.
int overlapping_allreduces(const std::vector<Span>& spans) {
  int n = 0;
  for (const Span& a : spans) {
    if (a.cat != "comm" || a.tid < 100) continue;
    for (const Span& b : spans)
      if (b.pid == a.pid && b.name == "backward" && a.begin < b.end && b.begin < a.end) {
        ++n;
        break;
      }
  }
  return n;
}

json read_json(const std::string& path) { return json::parse(read_text(path)); }

TEST(Observe, TraceIsWellFormedAndShowsAllReduceDuringBackward) {
  const std::string dir = make_temp_dir();
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "--no-overlap");
    const std::string trace = dir + (overlap ? "/overlap.json" : "/deferred.json");
    auto r = run_ddp_train(2, kRun + " --epochs 2 --trace " + trace + " --trace-steps 14:18" +
                                  (overlap ? "" : " --no-overlap"));
    ASSERT_EQ(r.status, 0) << r.err;
    std::vector<Span> all;
    for (int rank = 0; rank < 2; ++rank) {
      const json t = read_json(dir + (overlap ? "/overlap.rank" : "/deferred.rank") + std::to_string(rank) + ".json");
      const auto spans = spans_of(t);
      expect_well_formed(spans);
      // Steps 14..18 only (epoch 1 ends at step 16): one "step" span each, an
      // all-reduce span per bucket per step, the global step in their args.
      std::vector<int64_t> steps;
      for (const auto& e : t["traceEvents"])
        if (e["ph"] == "X" && e["cat"] == "step") steps.push_back(e["args"]["step"].get<int64_t>());
      EXPECT_EQ(steps, (std::vector<int64_t>{14, 15, 16, 17, 18}));
      int allreduces = 0, layers = 0, evaluations = 0;
      for (const auto& e : t["traceEvents"]) {
        if (e["ph"] != "X") continue;
        if (e["cat"] == "comm" && e["tid"].get<int>() >= 100) {
          ++allreduces;
          EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
          const int64_t step = e["args"]["step"].get<int64_t>();
          EXPECT_TRUE(step >= 14 && step <= 18) << step;
        }
        layers += e["cat"] == "backward" && e["name"] != "backward";
        evaluations += e["cat"] == "evaluation";
      }
      EXPECT_EQ(allreduces % 5, 0);
      EXPECT_GE(allreduces, 10);  // LeNet in 0.1 MiB buckets: more than one a step
      EXPECT_GE(layers, 5 * 4);   // a span per op's backward
      EXPECT_EQ(evaluations, 1);  // after step 16, inside the window
      all.insert(all.end(), spans.begin(), spans.end());
    }
    // Deferred all-reduces start after backward; overlapped ones run during it.
    if (overlap)
      EXPECT_GT(overlapping_allreduces(all), 0);
    else
      EXPECT_EQ(overlapping_allreduces(all), 0);
  }
  // The ranks' files merged into one trace, a process per rank.
  const std::string merge = std::string(DDP_SOURCE_DIR) + "/launch/merge-traces " + dir + "/overlap.json " + dir +
                            "/merged.json > /dev/null";
  ASSERT_EQ(std::system(merge.c_str()), 0) << merge;
  const json merged = read_json(dir + "/merged.json");
  std::map<int, std::string> processes;
  for (const auto& e : merged["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes[0].rfind("rank 0 (", 0), 0u) << processes[0];
  EXPECT_EQ(processes[1].rfind("rank 1 (", 0), 0u) << processes[1];
  expect_well_formed(spans_of(merged));
  remove_tree(dir);
}

// Every epoch's record and the summary split the median step into its parts
// and say how much of the all-reduce time the backward hid: some with
// overlapping buckets, none with --no-overlap. Every rank's peak memory is in
// each record and in the epoch's indented line.
TEST(Observe, StepBreakdownAndPeakMemoryPerEpoch) {
  const std::string dir = make_temp_dir();
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "--no-overlap");
    auto r = run_ddp_train(4, "--synthetic 2048 --batch-size 128 --bucket-cap-mb 0.1 --epochs 2 --metrics-out " +
                                  dir + "/m.jsonl" + (overlap ? "" : " --no-overlap"));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto records = lines_of(read_text(dir + "/m.jsonl"));
    ASSERT_EQ(records.size(), 2u);
    for (const auto& line : records) {
      const json m = json::parse(line);
      const double step = m.at("step_ms").get<double>();
      EXPECT_GT(step, 0);
      double parts = 0;
      for (const char* part : {"data_ms", "forward_ms", "backward_ms", "comm_ms", "optimizer_ms"}) {
        const double v = m.at(part).get<double>();
        EXPECT_GE(v, 0) << part;
        EXPECT_LE(v, step * 1.5) << part;  // a part's median against the total's
        parts += v;
      }
      EXPECT_GT(m["forward_ms"].get<double>(), 0);
      EXPECT_GT(m["backward_ms"].get<double>(), 0);
      EXPECT_NEAR(parts, step, 0.5 * step);  // medians of parts need not add up exactly
      EXPECT_GT(m.at("allreduce_bytes_per_step").get<double>(), 0);
      const double hidden = m.at("comm_hidden_frac").get<double>();
      if (overlap) {
        EXPECT_GT(hidden, 0) << line;
        EXPECT_LE(hidden, 1) << line;
      } else {
        EXPECT_EQ(hidden, 0) << line;
      }
      const auto& mem = m.at("peak_rss_mib");
      ASSERT_EQ(mem.size(), 4u) << line;
      for (const auto& v : mem) {
        EXPECT_GT(v.get<double>(), 10) << line;  // the process holds at least its dataset and libraries
        EXPECT_LT(v.get<double>(), 64 * 1024) << line;
      }
      EXPECT_FALSE(m.contains("gpu_mem_peak_mib")) << "a CPU run has no GPU figures: " << line;
    }
    const json s = summary_of(r);
    ASSERT_FALSE(s.is_null()) << r.out;
    EXPECT_GT(s.at("step_ms").get<double>(), 0);
    EXPECT_TRUE(s.contains("comm_hidden_frac"));
    int breakdown_lines = 0;
    for (const auto& l : lines_of(r.out))
      breakdown_lines += l.rfind("  step ", 0) == 0 && l.find(" ms: data ") != std::string::npos &&
                         l.find("during backward; peak memory MiB ") != std::string::npos;
    EXPECT_EQ(breakdown_lines, 2) << r.out;
  }
  remove_tree(dir);
}

// --debug-collectives on a whole run (training, evaluation, mid-epoch
// checkpoints, the stop-signal agreement, SyncBatchNorm's sums): every rank's
// collectives agree, so nothing is reported, and the run is the same run.
TEST(Observe, DebugCollectivesPassesAWholeRunUnchanged) {
  const std::string dir = make_temp_dir();
  const std::string args = "--model resnet18 --synthetic 256 --train-limit 64 --batch-size 32 --epochs 2 --lr 0.02 "
                           "--sync-bn --quiet --checkpoint-every 1 --checkpoint-dir ";
  EXPECT_EQ(models_differ(4, args + dir + "/a", 4, args + dir + "/b --debug-collectives"), 0.0);
  remove_tree(dir);
}

TEST(Observe, TraceFlagsAreChecked) {
  auto a = run_ddp_train(2, kRun + " --epochs 1 --trace-steps 3:5");
  expect_failure(a, "--trace-steps says which steps --trace records");
  auto b = run_ddp_train(2, kRun + " --epochs 1 --trace /tmp/t.json --trace-steps 5:3");
  expect_failure(b, "--trace-steps: '5:3' is not A:B");
  // A directory that does not exist is refused before any training.
  auto c = run_ddp_train(2, kRun + " --epochs 1 --trace /nonexistent-dir/t.json");
  expect_failure(c, "--trace /nonexistent-dir/t.json");
  EXPECT_EQ(c.out.find("epoch 1/1"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace ddp::test
