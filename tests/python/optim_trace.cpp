// optim_trace STEPS [ddp_train flags...]: the optimizer and schedule the
// flags describe (parsed as ddp_train parses them), run for STEPS steps on
// two tensors, "weight" [3, 4] and "bias" [4], from fixed values with fixed
// gradients. Prints one JSON object: the starting values, and per step the
// rate, the gradient and the parameters after it. optim_torch.py takes the
// same steps with torch.optim and torch.optim.lr_scheduler.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "ddp/cli/options.hpp"         // parse_options: the flags as ddp_train reads them
#include "ddp/nn/device.hpp"           // make_cpu_device
#include "ddp/optim/kernels.hpp"       // make_cpu_kernels
#include "ddp/optim/optimizer.hpp"     // Optimizer
#include "ddp/train/optim_config.hpp"  // optimizer_options, lr_schedule

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s STEPS [ddp_train flags]\n", argv[0]);
    return 2;
  }
  try {
    const int steps = std::stoi(argv[1]);
    argv[1] = argv[0];
    const ddp::train::Config cfg = ddp::cli::parse_options(argc - 1, argv + 1, 1).config;
    std::vector<ddp::nn::TensorInfo> t(2);
    t[0].name = "weight";
    t[0].shape = {3, 4};
    t[0].numel = 12;
    t[1].name = "bias";
    t[1].shape = {4};
    t[1].offset = 12;
    t[1].numel = 4;
    auto device = ddp::nn::make_cpu_device(1);
    auto kernels = ddp::optim::make_cpu_kernels();
    ddp::optim::Optimizer opt(ddp::train::optimizer_options(cfg), t, *device, *kernels);
    const ddp::optim::LrSchedule schedule = ddp::train::lr_schedule(cfg, steps);
    std::vector<float> p(16), g(16);
    for (size_t i = 0; i < p.size(); ++i) p[i] = float(std::sin(0.7 * double(i) + 0.3));
    nlohmann::json out{{"params0", p}, {"steps", nlohmann::json::array()}};
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = float(std::cos(1.3 * double(i) + 0.9 * s) * (1.0 + 0.2 * s));
      const double lr = schedule.at(s);
      opt.step(lr, p.data(), g.data());
      out["steps"].push_back({{"lr", lr}, {"grad", g}, {"params", p}});
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
