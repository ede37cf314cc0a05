// The model zoo: make_model by name.
#include <algorithm>
#include <sstream>

#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/model.hpp"

namespace ddp::nn {

namespace {

// Appends layers while tracking the per-sample shape between them, so each
// layer is built for exactly the shape it will be fed.
class Builder {
 public:
  explicit Builder(Shape in) : shape_(in) {}
  // conv -> relu -> avgpool2 as one fused layer (conv_relu_pool_cpu.cpp).
  Builder& conv_relu_pool(const std::string& name, int out_c, int k) {
    return add({LayerKind::ConvReluPool, name, shape_, out_c, k});
  }
  Builder& relu(const std::string& name) { return add({LayerKind::ReLU, name, shape_}); }
  Builder& flatten(const std::string& name) { return add({LayerKind::Flatten, name, shape_}); }
  Builder& linear(const std::string& name, int out) { return add({LayerKind::Linear, name, shape_, out}); }
  std::vector<LayerSpec> take() { return std::move(specs_); }

 private:
  Builder& add(LayerSpec spec) {
    shape_ = make_layer(spec)->output_shape(shape_);  // checks the wiring
    specs_.push_back(std::move(spec));
    return *this;
  }
  Shape shape_;
  std::vector<LayerSpec> specs_;
};

// d2l's LeNet variant ("Training on Multiple GPUs"): conv3x3 20 -> relu ->
// avgpool2 -> conv5x5 50 -> relu -> avgpool2 -> fc 800-128 -> relu -> fc 128-10.
// Its fc1 is 50*4*4 -> 128, which pins the input to 1x28x28. Each conv block
// runs fused; the math and the parameters are those of the unfused layers.
std::vector<LayerSpec> lenet(Shape in, int classes) {
  DDP_CHECK(in == (Shape{1, 28, 28}), "model lenet: needs input 1x28x28, got ", to_string(in));
  Builder b(in);
  b.conv_relu_pool("conv1", 20, 3).conv_relu_pool("conv2", 50, 5);
  b.flatten("flatten").linear("fc1", 128).relu("relu3").linear("fc2", classes);
  return b.take();
}

// 784-256-10 for Fashion-MNIST; fc1 takes whatever the input flattens to.
std::vector<LayerSpec> mlp(Shape in, int classes) {
  Builder b(in);
  b.flatten("flatten").linear("fc1", 256).relu("relu1").linear("fc2", classes);
  return b.take();
}

}  // namespace

std::vector<std::string> known_models() { return {"lenet", "mlp"}; }

std::unique_ptr<Layer> make_layer(const LayerSpec& s) {
  switch (s.kind) {
    case LayerKind::Conv2d: return std::make_unique<Conv2d>(s.name, s.in, s.out, s.k, s.stride, s.pad);
    case LayerKind::ConvReluPool: return std::make_unique<ConvReluPool>(s.name, s.in, s.out, s.k, s.stride, s.pad);
    case LayerKind::AvgPool2d: return std::make_unique<AvgPool2d>(s.name, s.in);
    case LayerKind::ReLU: return std::make_unique<ReLU>(s.name, s.in);
    case LayerKind::Flatten: return std::make_unique<Flatten>(s.name, s.in);
    case LayerKind::Linear: return std::make_unique<Linear>(s.name, int(s.in.numel()), s.out);
  }
  DDP_FAIL("layer ", s.name, ": unknown kind");
}

std::vector<LayerSpec> model_spec(const std::string& name, Shape input, int classes) {
  DDP_CHECK(classes > 0, "model ", name, ": classes must be positive, got ", classes);
  DDP_CHECK(input.c > 0 && input.h > 0 && input.w > 0, "model ", name, ": bad input shape ",
            to_string(input));
  if (name == "lenet") return lenet(input, classes);
  if (name == "mlp") return mlp(input, classes);
  std::ostringstream known;
  const auto names = known_models();
  for (size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
  DDP_FAIL("unknown model '", name, "' (known: ", known.str(), ")");
}

std::unique_ptr<Model> make_model(const std::string& name, Shape input, int classes) {
  std::vector<std::unique_ptr<Layer>> layers;
  for (const LayerSpec& s : model_spec(name, input, classes)) layers.push_back(make_layer(s));
  return std::make_unique<Model>(name, input, std::move(layers));
}

}  // namespace ddp::nn
