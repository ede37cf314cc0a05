#include "run_outputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace ddp::test {

nlohmann::json summary_of(const RunResult& r) {
  nlohmann::json found;
  for (const auto& l : lines_of(r.out))
    if (l.find("\"event\":\"summary\"") != std::string::npos) found = nlohmann::json::parse(l);
  return found;
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

}  // namespace ddp::test
