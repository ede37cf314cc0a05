// Model: layers in sequence over one flat parameter buffer and one flat
// gradient buffer (Note [flat layout] in model.hpp).
#include "ddp/nn/model.hpp"

#include <algorithm>
#include <cstring>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/thread_pool.hpp"

namespace ddp::nn {

namespace {

// FNV-1a: each tensor's init stream is keyed by its name, so adding a layer to
// a model leaves the other tensors' initial values unchanged.
uint64_t name_key(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

FlatLayout plan_layout(const std::string& model, Shape input, const std::vector<std::unique_ptr<Layer>>& layers) {
  DDP_CHECK(!layers.empty(), "model ", model, ": no layers");
  DDP_CHECK(input.numel() > 0, "model ", model, ": empty input shape ", to_string(input));
  FlatLayout lay;
  lay.shapes.push_back(input);
  for (const auto& l : layers) {
    DDP_CHECK(l, "model ", model, ": null layer");
    try {
      lay.shapes.push_back(l->output_shape(lay.shapes.back()));
    } catch (const Error& e) {
      DDP_FAIL("model ", model, ": ", e.what());
    }
  }
  // Note [flat layout]: last layer first, each layer's tensors in spec order.
  const size_t n_layers = layers.size();
  lay.layer_params.resize(n_layers);
  lay.ready_after.assign(n_layers, 0);
  size_t offset = 0;
  for (size_t i = n_layers; i-- > 0;) {
    for (const ParamSpec& spec : layers[i]->param_specs()) {
      const int64_t n = spec.numel();
      DDP_CHECK(n > 0, "model ", model, ": parameter ", layers[i]->name(), ".", spec.name, " is empty");
      ParamInfo p;
      p.name = layers[i]->name() + "." + spec.name;
      for (const ParamInfo& q : lay.params)
        DDP_CHECK(q.name != p.name, "model ", model, ": duplicate parameter name ", p.name);
      p.shape = spec.shape;
      p.offset = offset;
      p.numel = size_t(n);
      offset += p.numel;
      lay.layer_params[i].push_back(lay.params.size());
      lay.params.push_back(std::move(p));
      lay.inits.push_back(spec.init);
    }
    lay.ready_after[i] = offset;
  }
  lay.numel = offset;
  return lay;
}

void bind_layers(const FlatLayout& layout, const std::vector<std::unique_ptr<Layer>>& layers, float* params,
                 float* grads) {
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<float*> ps, gs;
    for (size_t k : layout.layer_params[i]) {
      ps.push_back(params + layout.params[k].offset);
      gs.push_back(grads + layout.params[k].offset);
    }
    layers[i]->bind(ps, gs);
  }
}

Model::Model(std::string name, Shape input, std::vector<std::unique_ptr<Layer>> layers)
    : name_(std::move(name)), input_(input), layers_(std::move(layers)),
      layout_(plan_layout(name_, input_, layers_)) {
  const size_t n_layers = layers_.size();
  params_.assign(layout_.numel, 0.0f);
  grads_.assign(layout_.numel, 0.0f);
  bind_layers(layout_, layers_, params_.data(), grads_.data());
  acts_.resize(n_layers + 1);
  dacts_.resize(n_layers + 1);
  set_threads(default_threads());
}

Model::~Model() = default;

void Model::set_threads(int threads) {
  DDP_CHECK(threads >= 1, "model ", name_, ": threads must be >= 1, got ", threads);
  if (pool_ && pool_->size() == threads) return;
  for (auto& l : layers_) l->set_thread_pool(nullptr);
  pool_ = std::make_unique<ThreadPool>(threads);
  for (auto& l : layers_) l->set_thread_pool(pool_.get());
}

int Model::threads() const { return pool_ ? pool_->size() : 1; }

Shape Model::output_shape() const { return layout_.shapes.back(); }

void Model::init_params(uint64_t seed) {
  for (size_t k = 0; k < layout_.params.size(); ++k) {
    float* p = params_.data() + layout_.params[k].offset;
    const size_t n = layout_.params[k].numel;
    switch (layout_.inits[k]) {
      case Init::Zero:
        std::fill(p, p + n, 0.0f);
        break;
      case Init::One:
        std::fill(p, p + n, 1.0f);
        break;
      case Init::Normal001: {
        Rng rng(seed, name_key(layout_.params[k].name));
        for (size_t j = 0; j < n; ++j) p[j] = static_cast<float>(0.01 * rng.normal());
        break;
      }
    }
  }
}

void Model::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const float* Model::forward(const float* x, int batch) {
  DDP_CHECK(batch > 0, "model ", name_, ": forward with batch ", batch);
  DDP_CHECK(x, "model ", name_, ": forward with null input");
  for (size_t i = 0; i < acts_.size(); ++i) {
    const size_t need = size_t(batch) * size_t(layout_.shapes[i].numel());
    if (acts_[i].size() < need) acts_[i].resize(need);
  }
  std::memcpy(acts_[0].data(), x, sizeof(float) * size_t(batch) * size_t(input_.numel()));
  for (size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->forward(acts_[i].data(), batch, acts_[i + 1].data());
  last_batch_ = batch;
  return acts_.back().data();
}

void Model::backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready) {
  DDP_CHECK(last_batch_ == batch, "model ", name_, ": backward for batch ", batch,
            " after forward of batch ", last_batch_);
  DDP_CHECK(dlogits, "model ", name_, ": backward with null dlogits");
  const size_t n_layers = layers_.size();
  // dacts_[0] is never needed (nothing consumes the input gradient) and the
  // last layer reads the caller's dlogits directly.
  for (size_t i = 1; i < n_layers; ++i) {
    const size_t need = size_t(batch) * size_t(layout_.shapes[i].numel());
    if (dacts_[i].size() < need) dacts_[i].resize(need);
  }
  for (size_t i = n_layers; i-- > 0;) {
    const float* dy = i + 1 == n_layers ? dlogits : dacts_[i + 1].data();
    float* dx = i == 0 ? nullptr : dacts_[i].data();
    layers_[i]->backward(acts_[i].data(), acts_[i + 1].data(), dy, batch, dx);
    if (on_ready) on_ready(layout_.ready_after[i]);
  }
}

}  // namespace ddp::nn
