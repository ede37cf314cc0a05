// The model zoo: model_graph by name, each written once for every device.
#include <sstream>

#include "ddp/core/error.hpp"
#include "ddp/nn/graph.hpp"

namespace ddp::nn {

namespace {

// d2l's LeNet variant ("Training on Multiple GPUs"): conv3x3 20 -> relu ->
// avgpool2 -> conv5x5 50 -> relu -> avgpool2 -> fc 800-128 -> relu -> fc 128-10,
// N(0, 0.01) weights, zero biases. Its fc1 is 50*4*4 -> 128, which pins the
// input to 1x28x28. Each conv block runs fused; the math and the parameters
// are those of the unfused layers.
Graph lenet(Shape in, int classes) {
  DDP_CHECK(in == (Shape{1, 28, 28}), "model lenet: needs input 1x28x28, got ", to_string(in));
  GraphBuilder b("lenet", in, /*pytorch_init=*/false);
  int x = b.conv_relu_pool("conv1", b.input(), 20, 3);
  x = b.conv_relu_pool("conv2", x, 50, 5);
  x = b.flatten("flatten", x);
  x = b.relu("relu3", b.linear("fc1", x, 128));
  return b.finish(b.linear("fc2", x, classes));
}

// 784-256-10 for Fashion-MNIST; fc1 takes whatever the input flattens to.
Graph mlp(Shape in, int classes) {
  GraphBuilder b("mlp", in, /*pytorch_init=*/false);
  int x = b.flatten("flatten", b.input());
  x = b.relu("relu1", b.linear("fc1", x, 256));
  return b.finish(b.linear("fc2", x, classes));
}

// d2l's Residual: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut), the
// shortcut a strided 1x1 convolution (conv3) where the shape changes.
int residual(GraphBuilder& b, const std::string& p, int x, int channels, bool use_1x1, int stride) {
  int y = b.conv(p + ".conv1", x, channels, 3, stride, 1);
  y = b.relu(p + ".relu1", b.batch_norm(p + ".bn1", y));
  y = b.batch_norm(p + ".bn2", b.conv(p + ".conv2", y, channels, 3, 1, 1));
  const int shortcut = use_1x1 ? b.conv(p + ".conv3", x, channels, 1, stride, 0) : x;
  return b.add(p + ".add", y, shortcut, /*relu=*/true);
}

// d2l's resnet_block: two Residuals; all but the first block halve the
// resolution and change the width in their first.
int resnet_block(GraphBuilder& b, const std::string& name, int x, int channels, bool first_block) {
  x = residual(b, name + ".0", x, channels, !first_block, first_block ? 1 : 2);
  return residual(b, name + ".1", x, channels, false, 1);
}

// d2l's resnet18(num_classes, in_channels) for 28x28 inputs: a 3x3 stem with
// no max-pool, four resnet_blocks (64, 128, 256, 512 channels), global
// average pooling, Flatten and Linear; PyTorch's default initialisation. Op
// names are the module paths of that nn.Sequential, so tensors carry its
// state-dict names ("0.weight", "resnet_block2.0.conv3.weight", "fc.1.bias").
Graph resnet18(Shape in, int classes) {
  GraphBuilder b("resnet18", in, /*pytorch_init=*/true);
  int x = b.conv("0", b.input(), 64, 3, 1, 1);
  x = b.relu("2", b.batch_norm("1", x));
  x = resnet_block(b, "resnet_block1", x, 64, true);
  x = resnet_block(b, "resnet_block2", x, 128, false);
  x = resnet_block(b, "resnet_block3", x, 256, false);
  x = resnet_block(b, "resnet_block4", x, 512, false);
  x = b.global_avg_pool("global_avg_pool", x);
  x = b.flatten("fc.0", x);
  return b.finish(b.linear("fc.1", x, classes));
}

}  // namespace

std::vector<std::string> known_models() { return {"lenet", "mlp", "resnet18"}; }

Graph model_graph(const std::string& name, Shape input, int classes) {
  DDP_CHECK(classes > 0, "model ", name, ": classes must be positive, got ", classes);
  DDP_CHECK(input.c > 0 && input.h > 0 && input.w > 0, "model ", name, ": bad input shape ", to_string(input));
  if (name == "lenet") return lenet(input, classes);
  if (name == "mlp") return mlp(input, classes);
  if (name == "resnet18") return resnet18(input, classes);
  std::ostringstream known;
  const auto names = known_models();
  for (size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
  DDP_FAIL("unknown model '", name, "' (known: ", known.str(), ")");
}

}  // namespace ddp::nn
