// bench_nn: a model's forward + backward throughput on the CPU, the number the
// trainer's samples/s is built on (the optimizer and all-reduce come on top).
//
//   bench_nn [--reps N] [--layers] [--model lenet|mlp|resnet18] [--batch B --threads T]
//
// Prints, per configuration (batch 256 on 2 threads and batch 128 on 1, the
// two PyTorch baselines we compare against; or just --batch/--threads), the
// median step time and samples/s; --layers adds a per-op forward/backward
// breakdown. Threads are set as World sets them, with openblas_set_num_threads,
// which the CPU device follows (default_threads).
#include <cblas.h>  // openblas_set_num_threads

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/core/rng.hpp"        // random inputs
#include "ddp/nn/device.hpp"       // make_cpu_device, Kernel: the per-op breakdown
#include "ddp/nn/graph.hpp"        // model_graph
#include "ddp/nn/model.hpp"        // Model, softmax_cross_entropy
#include "ddp/nn/cpu/thread_pool.hpp"  // default_threads

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of the whole process: on a machine shared with other jobs, wall
// time includes the slices they took, and cpu / wall shows how many of our
// threads actually ran.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch random_batch(const ddp::nn::Shape& in, int batch, int classes, uint64_t seed) {
  ddp::Rng rng(seed, 1);
  Batch b;
  b.x.resize(size_t(batch) * size_t(in.numel()));
  for (float& v : b.x) v = rng.uniform();
  b.y.resize(size_t(batch));
  for (int32_t& v : b.y) v = int32_t(rng.below(uint64_t(classes)));
  return b;
}

// One training step minus the optimizer: what this area owns.
double time_model(const std::string& name, int batch, int threads, int reps) {
  openblas_set_num_threads(threads);
  const ddp::nn::Shape in{1, 28, 28};
  auto device = ddp::nn::make_cpu_device(ddp::nn::default_threads());
  ddp::nn::Model model(ddp::nn::model_graph(name, in, 10), *device);
  model.set_state(ddp::nn::init_state(model.graph(), 1));
  const Batch b = random_batch(in, batch, 10, 2);
  std::vector<float> dlogits(size_t(batch) * 10);
  std::vector<double> times, cpu;
  for (int r = 0; r < reps + 3; ++r) {  // the first steps grow buffers and warm caches
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    model.zero_grads();
    const float* logits = model.forward(b.x.data(), batch);
    ddp::nn::softmax_cross_entropy(logits, b.y.data(), batch, 10, dlogits.data());
    model.backward(dlogits.data(), batch);
    if (r >= 3) {
      times.push_back(seconds_since(t0));
      cpu.push_back(process_cpu_seconds() - c0);
    }
  }
  const double t = median(times), best = *std::min_element(times.begin(), times.end());
  std::printf("%-8s batch %4d  threads %d  forward+backward median %8.2f ms = %6.0f samples/s"
              "  (best %6.0f samples/s; cpu %.2f ms/step)\n",
              name.c_str(), batch, threads, t * 1e3, batch / t, batch / best, median(cpu) * 1e3);
  return batch / t;
}

// Each op's kernels of a model alone, timed (each op reads fresh buffers of
// its input shapes; where a value feeds several ops, its gradients are not
// added up: this times kernels, it does not train).
void time_ops(const std::string& name, int batch, int threads, int reps) {
  using namespace ddp::nn;
  openblas_set_num_threads(threads);
  const Graph g = model_graph(name, {1, 28, 28}, 10);
  auto device = make_cpu_device(default_threads());
  const ModelState state = init_state(g, 3);
  std::vector<float> params = state.params, grads(g.num_params, 0.0f), buffers = state.buffers;
  ddp::Rng rng(3, 0);
  std::vector<std::vector<float>> acts, dacts;
  for (const Shape& sh : g.values) {
    acts.emplace_back(size_t(batch) * size_t(sh.numel()));
    dacts.emplace_back(size_t(batch) * size_t(sh.numel()));
    for (float& v : acts.back()) v = rng.uniform();
    for (float& v : dacts.back()) v = float(0.01 * rng.normal());
  }
  std::vector<std::unique_ptr<Kernel>> kernels;
  std::vector<OpArgs> args(g.ops.size());
  std::vector<int64_t> counters(g.counters.size(), 0);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    kernels.push_back(device->kernel(g, i, nullptr));
    OpArgs& a = args[i];
    a.batch = batch;
    for (int v : g.ops[i].inputs) a.x.push_back(acts[size_t(v)].data());
    a.y = acts[i + 1].data();
    for (size_t k : g.op_params[i]) {
      a.p.push_back(params.data() + g.params[k].offset);
      a.dp.push_back(grads.data() + g.params[k].offset);
    }
    for (size_t k : g.op_buffers[i]) a.buf.push_back(buffers.data() + g.buffers[k].offset);
    if (g.op_counter[i] >= 0) a.counter = &counters[size_t(g.op_counter[i])];
  }
  std::vector<std::vector<double>> fwd(g.ops.size()), bwd(g.ops.size());
  for (int r = 0; r < reps + 3; ++r) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const auto t0 = Clock::now();
      kernels[i]->forward(args[i]);
      if (r >= 3) fwd[i].push_back(seconds_since(t0));
    }
    for (size_t i = g.ops.size(); i-- > 0;) {
      std::vector<float*> dx;
      for (int v : g.ops[i].inputs) dx.push_back(v == 0 ? nullptr : dacts[size_t(v)].data());
      const auto t0 = Clock::now();
      kernels[i]->backward(args[i], dacts[i + 1].data(), dx);
      if (r >= 3) bwd[i].push_back(seconds_since(t0));
    }
  }
  std::printf("  per op, batch %d, threads %d (median ms):\n", batch, threads);
  double tf = 0, tb = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const double f = median(fwd[i]) * 1e3, b = median(bwd[i]) * 1e3;
    tf += f;
    tb += b;
    std::printf("    %-28s %-13s forward %8.3f  backward %8.3f\n", g.ops[i].name.c_str(), to_string(g.ops[i].kind), f, b);
  }
  std::printf("    %-28s %-13s forward %8.3f  backward %8.3f\n", "total", "", tf, tb);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool layers = false;
  std::string model = "lenet";
  int batch = 0, threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--layers")) {
      layers = true;
    } else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      model = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--layers] [--model lenet|mlp|resnet18] [--batch B --threads T]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    struct Config {
      int batch, threads;
    };
    std::vector<Config> configs{{256, 2}, {128, 1}};
    if (batch || threads) configs = {{batch ? batch : 256, threads ? threads : 1}};
    for (const auto& c : configs) {
      time_model(model, c.batch, c.threads, reps);
      if (layers) time_ops(model, c.batch, c.threads, reps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
