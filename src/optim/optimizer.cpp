#include "ddp/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::optim {

const char* kind_name(Kind k) { return k == Kind::AdamW ? "adamw" : "sgd"; }

std::string describe(const Options& o) {
  char buf[256];
  if (o.kind == Kind::AdamW)
    std::snprintf(buf, sizeof buf, "adamw (betas %g, %g, eps %g, weight decay %g", o.beta1, o.beta2, o.eps,
                  o.weight_decay);
  else
    std::snprintf(buf, sizeof buf, "sgd (momentum %g%s, weight decay %g", o.momentum, o.nesterov ? ", nesterov" : "",
                  o.weight_decay);
  std::string d = buf;
  if (o.no_decay_norm_bias && o.weight_decay > 0) d += " except biases and norms";
  d += ")";
  if (o.max_grad_norm > 0) {
    std::snprintf(buf, sizeof buf, ", gradient norm clipped to %g", o.max_grad_norm);
    d += buf;
  }
  return d;
}

std::vector<std::string> buffer_names(const Options& o) {
  if (o.kind == Kind::AdamW) return {"exp_avg", "exp_avg_sq"};
  if (o.momentum != 0) return {"momentum_buffer"};
  return {};
}

Optimizer::Optimizer(const Options& o, const std::vector<nn::TensorInfo>& params, nn::Device& dev,
                     Kernels& kernels)
    : opt_(o), dev_(dev), kernels_(kernels), names_(buffer_names(o)) {
  DDP_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "optimizer: momentum ", o.momentum, " and weight decay ",
            o.weight_decay, " may not be negative");
  DDP_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "nesterov needs momentum > 0 and zero dampening");
  DDP_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas ", o.beta1, ", ", o.beta2,
            " must be in [0, 1)");
  DDP_CHECK(o.eps > 0, "AdamW: eps must be positive, got ", o.eps);
  // Each tensor with the zeros up to the next (Note [flat layout]: its
  // slot), so that adjacent tensors of one kind are one run.
  for (size_t i = 0; i < params.size(); ++i) {
    const nn::TensorInfo& p = params[i];
    const bool decay = !(o.no_decay_norm_bias && p.shape.size() <= 1);
    const size_t end = nn::param_slot_end(params, i);
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == p.offset)
      runs_.back().end = end;
    else
      runs_.push_back({p.offset, end, decay});
    n_ = std::max(n_, end);
  }
  for (size_t i = 0; i < names_.size(); ++i) buffers_.push_back(dev.alloc(n_));
}

void Optimizer::step(double lr, float* p, const float* g, float unscale) {
  StepArgs a;
  a.unscale = unscale;
  run(lr, p, g, a);
}

void Optimizer::step(double lr, float* p, const float* g, const LossScaleState* loss_scale, const unsigned* skip) {
  StepArgs a;
  a.loss_scale = loss_scale;
  a.skip = skip;
  run(lr, p, g, a);
}

void Optimizer::unstep() {
  DDP_CHECK(step_ > 0, "optimizer: no step to take back");
  --step_;
}

StepScalars Optimizer::scalars(double lr, int64_t t) const {
  StepScalars s;
  s.kind = opt_.kind;
  s.lr = static_cast<float>(lr);
  if (opt_.kind == Kind::Sgd) {
    s.wd = static_cast<float>(opt_.weight_decay);
    s.mu = static_cast<float>(opt_.momentum);
    s.damp = static_cast<float>(1.0 - opt_.dampening);
    s.nesterov = opt_.nesterov;
    s.first = t == 1;
  } else {
    s.decay_factor = static_cast<float>(1.0 - lr * opt_.weight_decay);
    s.beta2 = static_cast<float>(opt_.beta2);
    s.eps = static_cast<float>(opt_.eps);
    s.one_minus_beta1 = static_cast<float>(1.0 - opt_.beta1);
    s.one_minus_beta2 = static_cast<float>(1.0 - opt_.beta2);
    s.step_size = static_cast<float>(lr / (1.0 - std::pow(opt_.beta1, double(t))));
    s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(opt_.beta2, double(t))));
  }
  return s;
}

void Optimizer::stage_scalars(double lr) {
  staged_ = kernels_.set_scalars(scalars(lr, step_ + 1));
  staged_step_ = step_ + 1;
  staged_lr_ = lr;
}

void Optimizer::replayed() {
  DDP_CHECK(staged_step_ == step_ + 1, "optimizer: a replayed step without its scalars staged");
  step_ = staged_step_;
}

void Optimizer::run(double lr, float* p, const float* g, StepArgs a) {
  a.p = p;
  a.g = g;
  const int64_t t = step_ + 1;  // PyTorch counts the step being taken
  a.s = scalars(lr, t);
  if (staged_ && staged_step_ == t && staged_lr_ == lr) a.scalars = staged_;
  if (opt_.kind == Kind::Sgd) {
    if (!buffers_.empty()) a.a = buffers_[0]->data();
  } else {
    a.a = buffers_[0]->data();
    a.b = buffers_[1]->data();
  }
  if (opt_.max_grad_norm > 0) {
    a.sq_norm = kernels_.sq_norm(g, n_, a.unscale, a.loss_scale, a.skip);
    a.max_norm = static_cast<float>(opt_.max_grad_norm);
  }
  for (const Run& r : runs_) {
    StepArgs part = a;
    part.n = r.end - r.begin;
    part.p = a.p + r.begin;
    part.g = a.g + r.begin;
    if (a.a) part.a = a.a + r.begin;
    if (a.b) part.b = a.b + r.begin;
    part.decay = r.decay;
    kernels_.step(part);
  }
  step_ = t;
}

void Optimizer::get_state(State& s) {
  s.step = step_;
  s.buffers.clear();
  if (step_ == 0) return;  // as PyTorch: no state before the first step
  for (size_t i = 0; i < names_.size(); ++i) {
    std::vector<float> h(n_);
    dev_.to_host(h.data(), buffers_[i]->data(), n_);
    s.buffers.emplace_back(names_[i], std::move(h));
  }
}

void Optimizer::set_state(const State& s) {
  DDP_CHECK(s.step >= 0, "optimizer state at step ", s.step);
  DDP_CHECK(s.step == 0 || s.buffers.size() == names_.size(), "optimizer state with ", s.buffers.size(),
            " buffers for ", kind_name(opt_.kind), ", which keeps ", names_.size());
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    const auto& [name, data] = s.buffers[i];
    DDP_CHECK(i < names_.size() && name == names_[i] && data.size() == n_, "optimizer state buffer '", name, "' of ",
              data.size(), " values does not fit ", kind_name(opt_.kind), " over ", n_, " parameters");
    dev_.from_host(buffers_[i]->data(), data.data(), n_);
  }
  step_ = s.step;
}

}  // namespace ddp::optim
