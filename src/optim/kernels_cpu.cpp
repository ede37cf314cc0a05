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
    DDP_CHECK(a.s.kind != Kind::AdamW || (a.a && a.b), "AdamW needs its exp_avg and exp_avg_sq");
    DDP_CHECK(a.s.kind != Kind::Sgd || a.s.mu == 0.0f || a.a, "SGD with momentum needs its buffer");
    const float gscale = gradient_factor(a.sq_norm, a.max_norm, a.unscale);
    const StepScalars s = a.s;
    for (size_t i = 0; i < a.n; ++i) update_at(i, s, a.decay, gscale, a.p, a.g, a.a, a.b);
  }

  const double* sq_norm(const float* g, size_t n, float unscale) override {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
    sum *= double(unscale) * double(unscale);
    sq_ = sum;
    norm_sum_ += std::sqrt(sum);
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

 private:
  double sq_ = 0, norm_sum_ = 0;
  unsigned flag_ = 0;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

}  // namespace ddp::optim
