// bench_nn: LeNet forward + backward throughput on the CPU, the number the
// trainer's samples/s is built on (the optimizer and all-reduce come on top).
//
//   bench_nn [--reps N] [--layers] [--model lenet|mlp] [--batch B --threads T]
//
// Prints, per configuration (batch 256 on 2 threads and batch 128 on 1, the
// two PyTorch baselines we compare against; or just --batch/--threads), the
// median step time and samples/s; --layers adds a per-layer forward/backward
// breakdown. Threads are set as World sets them, with openblas_set_num_threads,
// which the model follows (Model::Model).
#include <cblas.h>  // openblas_set_num_threads

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/core/rng.hpp"     // random inputs
#include "ddp/nn/layers.hpp"    // per-layer breakdown
#include "ddp/nn/model.hpp"     // make_model, softmax_cross_entropy
#include "ddp/nn/thread_pool.hpp"  // the per-layer breakdown's threads

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
  auto model = ddp::nn::make_model(name, in, 10);
  model->init_params(1);
  const Batch b = random_batch(in, batch, 10, 2);
  std::vector<float> dlogits(size_t(batch) * 10);
  std::vector<double> times, cpu;
  for (int r = 0; r < reps + 3; ++r) {  // the first steps grow buffers and warm caches
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    model->zero_grads();
    const float* logits = model->forward(b.x.data(), batch);
    ddp::nn::softmax_cross_entropy(logits, b.y.data(), batch, 10, dlogits.data());
    model->backward(dlogits.data(), batch);
    if (r >= 3) {
      times.push_back(seconds_since(t0));
      cpu.push_back(process_cpu_seconds() - c0);
    }
  }
  const double t = median(times), best = *std::min_element(times.begin(), times.end());
  std::printf("%-6s batch %4d  threads %d  forward+backward median %7.2f ms = %6.0f samples/s"
              "  (best %6.0f samples/s; cpu %.2f ms/step)\n",
              name.c_str(), batch, threads, t * 1e3, batch / t, batch / best, median(cpu) * 1e3);
  return batch / t;
}

// LeNet as make_model builds it, from the layer classes directly, to time each
// layer alone.
void time_layers(int batch, int threads, int reps) {
  using namespace ddp::nn;
  openblas_set_num_threads(threads);
  std::vector<std::unique_ptr<Layer>> layers;
  Shape s{1, 28, 28};
  std::vector<Shape> shapes{s};
  auto add = [&](std::unique_ptr<Layer> l) {
    s = l->output_shape(s);
    shapes.push_back(s);
    layers.push_back(std::move(l));
  };
  add(std::make_unique<ConvReluPool>("conv1", s, 20, 3));
  add(std::make_unique<ConvReluPool>("conv2", s, 50, 5));
  add(std::make_unique<Flatten>("flatten", s));
  add(std::make_unique<Linear>("fc1", int(s.numel()), 128));
  add(std::make_unique<ReLU>("relu3", s));
  add(std::make_unique<Linear>("fc2", 128, 10));

  ThreadPool pool(threads);
  for (auto& l : layers) l->set_thread_pool(&pool);
  ddp::Rng rng(3, 0);
  std::vector<std::vector<float>> params, grads, acts, dacts;
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<float*> ps, gs;
    for (const ParamSpec& spec : layers[i]->param_specs()) {
      // Moving an inner vector when the outer one grows keeps its data(), so
      // these pointers stay valid.
      params.emplace_back(size_t(spec.numel()));
      for (float& v : params.back()) v = float(0.01 * rng.normal());
      grads.emplace_back(size_t(spec.numel()), 0.0f);
      ps.push_back(params.back().data());
      gs.push_back(grads.back().data());
    }
    layers[i]->bind(ps, gs);
  }
  for (const Shape& sh : shapes) {
    acts.emplace_back(size_t(batch) * size_t(sh.numel()));
    dacts.emplace_back(size_t(batch) * size_t(sh.numel()));
  }
  for (float& v : acts[0]) v = rng.uniform();
  for (float& v : dacts.back()) v = float(0.01 * rng.normal());

  std::vector<std::vector<double>> fwd(layers.size()), bwd(layers.size());
  for (int r = 0; r < reps + 3; ++r) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto t0 = Clock::now();
      layers[i]->forward(acts[i].data(), batch, acts[i + 1].data());
      if (r >= 3) fwd[i].push_back(seconds_since(t0));
    }
    for (size_t i = layers.size(); i-- > 0;) {
      const auto t0 = Clock::now();
      layers[i]->backward(acts[i].data(), acts[i + 1].data(), dacts[i + 1].data(), batch,
                          i == 0 ? nullptr : dacts[i].data());
      if (r >= 3) bwd[i].push_back(seconds_since(t0));
    }
  }
  std::printf("  per layer, batch %d, threads %d (median ms):\n", batch, threads);
  double tf = 0, tb = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const double f = median(fwd[i]) * 1e3, b = median(bwd[i]) * 1e3;
    tf += f;
    tb += b;
    std::printf("    %-8s forward %7.3f  backward %7.3f\n", layers[i]->name().c_str(), f, b);
  }
  std::printf("    %-8s forward %7.3f  backward %7.3f\n", "total", tf, tb);
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
      std::fprintf(stderr, "usage: %s [--reps N] [--layers] [--model lenet|mlp] [--batch B --threads T]\n", argv[0]);
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
      if (layers && model == "lenet") time_layers(c.batch, c.threads, reps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
