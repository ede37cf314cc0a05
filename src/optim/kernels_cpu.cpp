// The CPU optimizer kernels (kernels.hpp): update_math.hpp's update in one
// loop per call, the norm in double, element by element in order.
#include <cmath>

#include "ddp/core/error.hpp"
#include "ddp/core/finite.hpp"  // first_non_finite
#include "ddp/optim/kernels.hpp"

namespace ddp::optim {

namespace {

class CpuKernels final : public Kernels {
 public:
  void step(const StepArgs& a) override {
    const StepScalars s = a.scalars ? *a.scalars : a.s;
    DDP_CHECK(s.kind != Kind::AdamW || (a.a && a.b), "AdamW needs its exp_avg and exp_avg_sq");
    DDP_CHECK(s.kind != Kind::Sgd || s.mu == 0.0f || a.a, "SGD with momentum needs its buffer");
    if (a.skip && *a.skip) return;
    const float unscale = a.loss_scale ? 1.0f / a.loss_scale->scale : a.unscale;
    const float gscale = gradient_factor(a.sq_norm, a.max_norm, unscale);
    for (size_t i = 0; i < a.n; ++i) update_at(i, s, a.decay, gscale, a.p, a.g, a.a, a.b);
  }

  const double* sq_norm(const float* g, size_t n, float unscale, const LossScaleState* loss_scale,
                        const unsigned* skip) override {
    if (loss_scale) unscale = 1.0f / loss_scale->scale;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
    sum *= double(unscale) * double(unscale);
    sq_ = sum;
    if (!(skip && *skip)) norm_sum_ += std::sqrt(sum);
    return &sq_;
  }

  double take_norm_sum() override {
    const double s = norm_sum_;
    norm_sum_ = 0;
    return s;
  }

  const unsigned* non_finite(const float* g, size_t n) override {
    flag_ = first_non_finite(g, n) != n;
    return &flag_;
  }

  const LossScaleState* loss_scale() override { return &scale_; }
  void set_loss_scale(const LossScaleState& s) override { scale_ = s; }
  void scale_by_loss_scale(float* x, size_t n) override {
    for (size_t i = 0; i < n; ++i) x[i] *= scale_.scale;
  }
  void update_loss_scale(const unsigned* found, const ScalerOptions& o) override {
    optim::update_loss_scale(scale_, *found != 0, o.growth_factor, o.backoff_factor, o.growth_interval);
  }
  const StepScalars* set_scalars(const StepScalars& s) override {
    scalars_ = s;
    return &scalars_;
  }

 private:
  double sq_ = 0, norm_sum_ = 0;
  unsigned flag_ = 0;
  LossScaleState scale_;
  StepScalars scalars_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

}  // namespace ddp::optim
