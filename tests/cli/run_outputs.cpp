#include "run_outputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "ddp/checkpoint/checkpoint.hpp"  // list_checkpoints, decode_checkpoint
#include "ddp/nn/graph.hpp"               // model_graph
#include "run_process.hpp"                // run_ddp_train, make_temp_dir, read_text, lines_of

#if DDP_HAVE_CUDA
#include "ddp/runtime/cuda_context.hpp"  // cuda::device_count
#endif

namespace ddp::test {

int visible_gpus() {
#if DDP_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

RanksOn ranks_on(const std::string& name) {
  if (name == "cpu") return {name, "", ""};
  if (name == "nccl_on_one_gpu")
    return {name, " --device cuda --backend nccl", std::string(DDP_SOURCE_DIR) + "/launch/nccl-host-per-rank"};
  throw std::invalid_argument("ranks_on: no '" + name + "'");
}

std::optional<std::set<int>> gpu_compute_pids() {
  FILE* p = ::popen("nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null", "r");
  if (!p) return std::nullopt;
  std::set<int> pids;
  for (int pid = 0; std::fscanf(p, "%d", &pid) == 1;) pids.insert(pid);
  if (::pclose(p) != 0) return std::nullopt;
  return pids;
}

std::string RanksOn::unfit() const {
  if (name == "cpu" || visible_gpus() > 0) return "";
  return "no CUDA device: NCCL ranks sharing one GPU need one";
}

void expect_bitwise_equal(const checkpoint::SafetensorsFile& a, const checkpoint::SafetensorsFile& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& t : a.tensors) {
    const auto* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.data, u->data) << t.name << " differs";
    EXPECT_EQ(t.ints, u->ints) << t.name << " differs";
  }
}

int64_t newest_checkpoint_step(const std::string& dir) {
  const auto l = checkpoint::list_checkpoints(dir);
  return l.empty() ? -1 : checkpoint::decode_checkpoint(l[0], checkpoint::read_file_bytes(l[0])).state.global_step;
}

double last_epochs_accuracy(int np, const std::string& args, int epochs, int last, std::initializer_list<int> seeds,
                            const std::function<void(const nlohmann::json&)>& check) {
  const std::string dir = make_temp_dir();
  double acc = 0;
  for (int seed : seeds) {
    const std::string m = dir + "/" + std::to_string(seed) + ".jsonl";
    auto r = run_ddp_train(np, args + " --epochs " + std::to_string(epochs) + " --quiet --seed " +
                                   std::to_string(seed) + " --metrics-out " + m);
    const auto lines = lines_of(read_text(m));
    if (r.status != 0 || lines.size() != size_t(epochs)) {
      ADD_FAILURE() << args << ", seed " << seed << ": status " << r.status << ", " << lines.size()
                    << " epochs recorded, not " << epochs << "\n" << r.err;
      remove_tree(dir);
      return NAN;
    }
    check(summary_of(r));
    for (size_t e = size_t(epochs - last); e < size_t(epochs); ++e)
      acc += nlohmann::json::parse(lines[e])["test_acc"].get<double>() / double(last * int(seeds.size()));
  }
  remove_tree(dir);
  return acc;
}

nlohmann::json summary_of(const RunResult& r) {
  nlohmann::json found;
  for (const auto& l : lines_of(r.out))
    if (l.find("\"event\":\"summary\"") != std::string::npos) found = nlohmann::json::parse(l);
  return found;
}

int error_lines(const std::string& err) {
  int n = 0;
  for (const auto& l : lines_of(err)) n += l.rfind("ddp_train: error: ", 0) == 0;
  return n;
}

void expect_failure(const RunResult& r, const std::string& needle) {
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_EQ(error_lines(r.err), 1) << "expected exactly one error line:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr lacks '" << needle << "':\n" << r.err;
  EXPECT_NE(r.err.find("(rank "), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("\"event\":\"summary\""), std::string::npos) << "a failed run printed a summary";
  EXPECT_LT(r.seconds, 30) << "the failing job took " << r.seconds << " s to end";
  EXPECT_EQ(r.left, 0) << r.left << " processes of the failed job were still running 10 s after it ended";
}

double max_rel_diff(const checkpoint::SafetensorsFile& a, const checkpoint::SafetensorsFile& b) {
  double max_diff = 0, max_abs = 0;
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& ta : a.tensors) {
    const auto* tb = b.find(ta.name);
    EXPECT_NE(tb, nullptr) << ta.name;
    if (!tb) continue;
    EXPECT_EQ(ta.shape, tb->shape) << ta.name;
    for (size_t i = 0; i < ta.data.size() && i < tb->data.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(double(ta.data[i]) - tb->data[i]));
      max_abs = std::max(max_abs, std::abs(double(ta.data[i])));
    }
  }
  return max_abs > 0 ? max_diff / max_abs : 1.0;
}

double models_differ(int np_a, const std::string& args_a, int np_b, const std::string& args_b) {
  const std::string dir = make_temp_dir();
  auto a = run_ddp_train(np_a, args_a + " --output-model " + dir + "/a.safetensors");
  auto b = run_ddp_train(np_b, args_b + " --output-model " + dir + "/b.safetensors");
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(b.status, 0) << b.err;
  const double d = a.status || b.status ? 1.0
                                        : max_rel_diff(checkpoint::read_safetensors(dir + "/a.safetensors"),
                                                       checkpoint::read_safetensors(dir + "/b.safetensors"));
  remove_tree(dir);
  return d;
}

double allreduced_floats(const std::string& model) {
  return double(nn::model_graph(model, {1, 28, 28}, 10).num_params);
}

}  // namespace ddp::test
