// model_logits MODEL WEIGHTS.safetensors DATA_DIR OUT: the eval-mode logits
// of a model file ddp_train wrote, on the test set of DATA_DIR, computed by
// our CPU model, as float32 [n, classes] little-endian in OUT; for the
// Python tests that run the same file through the PyTorch definition.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/checkpoint/safetensors.hpp"  // read_safetensors
#include "ddp/core/error.hpp"
#include "ddp/data/dataset.hpp"            // load_idx_dir
#include "ddp/nn/graph.hpp"                // model_graph
#include "ddp/nn/model.hpp"                // Model
#include "ddp/train/resume.hpp"            // restore: tensors by name into a state

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL WEIGHTS DATA_DIR OUT\n", argv[0]);
    return 2;
  }
  try {
    const ddp::data::Dataset test = ddp::data::load_idx_dir(argv[3]).test;
    const ddp::nn::Graph g = ddp::nn::model_graph(argv[1], {test.c, test.h, test.w}, test.classes);
    ddp::checkpoint::Checkpoint file;
    file.file = ddp::checkpoint::read_safetensors(argv[2]);
    for (const auto& t : g.params) DDP_CHECK(file.file.find(t.name), argv[2], " lacks ", t.name);
    for (const auto& t : g.buffers) DDP_CHECK(file.file.find(t.name), argv[2], " lacks ", t.name);
    for (const auto& c : g.counters) DDP_CHECK(file.file.find(c), argv[2], " lacks ", c);
    ddp::train::TrainState state;
    ddp::train::restore(file, g, {}, state);
    auto device = ddp::nn::make_cpu_device(2);
    ddp::nn::Model model(g, *device);
    model.set_state(state.model);
    const int classes = int(g.output_shape().numel()), batch = 128;
    std::vector<float> out;
    for (int64_t n0 = 0; n0 < test.n; n0 += batch) {
      const int n = int(std::min<int64_t>(batch, test.n - n0));
      const float* logits = model.forward(test.images.data() + n0 * test.sample_numel(), n, ddp::nn::Mode::Eval);
      out.insert(out.end(), logits, logits + int64_t(n) * classes);
    }
    std::ofstream f(argv[4], std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
    DDP_CHECK(f, argv[4], ": cannot write");
    std::printf("%lld rows of %d logits\n", static_cast<long long>(test.n), classes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
