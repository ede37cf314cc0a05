#include "ddp/train/optim_config.hpp"

#include "ddp/core/error.hpp"

namespace ddp::train {

optim::Options optimizer_options(const Config& cfg) {
  optim::Options o;
  o.kind = cfg.optimizer == "adamw" ? optim::Kind::AdamW : optim::Kind::Sgd;
  o.momentum = cfg.momentum;
  o.nesterov = cfg.nesterov;
  o.beta1 = cfg.beta1;
  o.beta2 = cfg.beta2;
  o.eps = cfg.eps;
  o.weight_decay = cfg.weight_decay;
  o.no_decay_norm_bias = cfg.no_decay_norm_bias;
  o.max_grad_norm = cfg.clip_grad_norm;
  return o;
}

double base_lr(const Config& cfg) { return cfg.scale_lr ? cfg.lr * cfg.batch_size / 256.0 : cfg.lr; }

optim::LrSchedule lr_schedule(const Config& cfg, int64_t total_steps) {
  optim::LrSchedule s;
  s.kind = cfg.lr_schedule;
  s.base = base_lr(cfg);
  s.warmup_steps = cfg.warmup_steps;
  s.step_size = cfg.lr_step_size;
  s.gamma = cfg.lr_gamma;
  s.lr_min = cfg.lr_min;
  s.total_steps = total_steps;
  try {
    optim::validate(s);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return s;
}

}  // namespace ddp::train
