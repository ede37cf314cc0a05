// A model on a CPU device of its own, for the nn tests: its memory is host
// memory, so parameters, gradients and buffers can be read and set directly.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/nn/device.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"

namespace ddp::nn::test {

struct CpuModel {
  std::unique_ptr<Device> device;
  std::unique_ptr<Model> model;
  // Initialised as init_state(g, seed) says.
  explicit CpuModel(Graph g, uint64_t seed = 0, int threads = 1, StatsReducer* stats = nullptr)
      : device(make_cpu_device(threads)), model(std::make_unique<Model>(std::move(g), *device, stats)) {
    model->set_state(init_state(model->graph(), seed));
  }
  Model* operator->() { return model.get(); }
  Model& operator*() { return *model; }
};

inline CpuModel cpu_model(const std::string& name, uint64_t seed = 0, int threads = 1) {
  return CpuModel(model_graph(name, {1, 28, 28}, 10), seed, threads);
}

// One op's kernels on a CPU device, called as the executor calls them:
// forward on inputs x with parameters p (and buffers), then backward from dy;
// y, every input's gradient and every parameter's (added onto zeros).
struct KernelRun {
  std::vector<float> y;
  std::vector<std::vector<float>> dx, dp;
};

inline KernelRun run_cpu_kernel(const Graph& g, size_t op, int batch, const std::vector<std::vector<float>>& x,
                                std::vector<std::vector<float>> p, const std::vector<float>& dy, int threads = 1,
                                std::vector<std::vector<float>>* buf = nullptr, Mode mode = Mode::Train) {
  auto dev = make_cpu_device(threads);
  auto k = dev->kernel(g, op, nullptr);
  KernelRun r;
  r.y.resize(size_t(batch) * size_t(g.ops[op].out.numel()));
  r.dx.resize(x.size());
  r.dp.resize(p.size());
  OpArgs a;
  a.batch = batch;
  a.mode = mode;
  for (const auto& xi : x) a.x.push_back(xi.data());
  a.y = r.y.data();
  for (size_t i = 0; i < p.size(); ++i) {
    r.dp[i].assign(p[i].size(), 0.0f);
    a.p.push_back(p[i].data());
    a.dp.push_back(r.dp[i].data());
  }
  int64_t counter = 0;
  if (buf)
    for (auto& b : *buf) a.buf.push_back(b.data());
  a.counter = g.ops[op].counter ? &counter : nullptr;
  k->forward(a);
  if (dy.empty()) return r;
  std::vector<float*> dxp;
  for (size_t i = 0; i < x.size(); ++i) {
    r.dx[i].assign(x[i].size(), 0.0f);
    dxp.push_back(r.dx[i].data());
  }
  k->backward(a, dy.data(), dxp);
  return r;
}

}  // namespace ddp::nn::test
