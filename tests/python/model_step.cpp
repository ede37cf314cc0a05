// model_step MODEL SEED DATA_DIR N LR INIT.safetensors AFTER.safetensors: a
// model's initial state from SEED as ddp_train makes it, written to INIT;
// then one training step of our CPU model on the first N training images
// (train mode, mean cross-entropy, plain SGD with LR), written to AFTER:
// parameters, BatchNorm running statistics and counters under their PyTorch
// names. The Python tests take the same step in the PyTorch definition.
#include <cstdio>
#include <string>
#include <vector>

#include "ddp/checkpoint/safetensors.hpp"  // write_safetensors
#include "ddp/core/error.hpp"
#include "ddp/data/dataset.hpp"            // load_idx_dir
#include "ddp/nn/graph.hpp"                // model_graph
#include "ddp/nn/model.hpp"                // Model, init_state, softmax_cross_entropy
#include "ddp/train/resume.hpp"            // checkpoint_tensors

namespace {

void write(const std::string& path, const ddp::nn::Graph& g, const ddp::nn::ModelState& s) {
  ddp::train::TrainState state;
  state.model = s;
  ddp::checkpoint::write_safetensors(path, ddp::train::checkpoint_tensors(g, state), {{"format", "ddp-model"}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s MODEL SEED DATA_DIR N LR INIT AFTER\n", argv[0]);
    return 2;
  }
  try {
    const ddp::data::Dataset train = ddp::data::load_idx_dir(argv[3]).train;
    const ddp::nn::Graph g = ddp::nn::model_graph(argv[1], {train.c, train.h, train.w}, train.classes);
    const int n = std::stoi(argv[4]);
    const float lr = std::stof(argv[5]);
    DDP_CHECK(n > 1 && n <= train.n, "N must be from 2 to ", train.n);
    ddp::nn::ModelState state = ddp::nn::init_state(g, std::stoull(argv[2]));
    write(argv[6], g, state);

    auto device = ddp::nn::make_cpu_device(2);
    ddp::nn::Model model(g, *device);
    model.set_state(state);
    model.zero_grads();
    const int classes = int(g.output_shape().numel());
    const float* logits = model.forward(train.images.data(), n, ddp::nn::Mode::Train);
    std::vector<float> dlogits(size_t(n) * classes);
    const float loss = ddp::nn::softmax_cross_entropy(logits, train.labels.data(), n, classes, dlogits.data());
    model.backward(dlogits.data(), n);
    model.get_state(state);
    const float* grad = model.grads();
    for (size_t i = 0; i < state.params.size(); ++i) state.params[i] -= lr * grad[i];
    write(argv[7], g, state);
    std::printf("loss %.6f over %d images\n", loss, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
