#include "ddp/optim/lr_schedule.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "ddp/core/error.hpp"

namespace ddp::optim {

namespace {

// The shortest text that reads back as v: exact, and "0.1" rather than
// "0.10000000000000001".
std::string num(double v) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

double LrSchedule::at(int64_t t) const {
  if (t < warmup_steps) return base * double(t + 1) / double(warmup_steps + 1);
  const int64_t u = t - warmup_steps;
  if (kind == "step") return base * std::pow(gamma, double(u / step_size));
  if (kind == "cosine") {
    const double T = double(total_steps - warmup_steps);
    return lr_min + (base - lr_min) * (1.0 + std::cos(M_PI * double(u) / T)) / 2.0;
  }
  return base;
}

std::string LrSchedule::describe() const {
  std::string d;
  if (kind == "step")
    d = detail::concat("step from ", num(base), " times ", num(gamma), " every ", step_size, " steps");
  else if (kind == "cosine")
    d = detail::concat("cosine from ", num(base), " to ", num(lr_min), " at step ", total_steps);
  else
    d = detail::concat("constant ", num(base));
  if (warmup_steps > 0) d += detail::concat(" after ", warmup_steps, " linear warm-up steps");
  return d;
}

void validate(const LrSchedule& s) {
  DDP_CHECK(s.kind == "constant" || s.kind == "step" || s.kind == "cosine",
            "--lr-schedule must be constant, step or cosine, got '", s.kind, "'");
  DDP_CHECK(std::isfinite(s.base) && s.base > 0, "--lr must be a positive number, got ", s.base);
  DDP_CHECK(s.warmup_steps >= 0, "--warmup-steps must be >= 0, got ", s.warmup_steps);
  if (s.kind == "step") {
    DDP_CHECK(s.step_size > 0, "--lr-schedule step needs --lr-step-size > 0 (steps between decays)");
    DDP_CHECK(std::isfinite(s.gamma) && s.gamma > 0 && s.gamma <= 1, "--lr-gamma must be in (0, 1], got ",
              s.gamma);
  }
  if (s.kind == "cosine") {
    DDP_CHECK(std::isfinite(s.lr_min) && s.lr_min >= 0 && s.lr_min <= s.base, "--lr-min must be from 0 to --lr (",
              s.base, "), got ", s.lr_min);
    DDP_CHECK(s.total_steps > s.warmup_steps, "--warmup-steps ", s.warmup_steps,
              " leaves no steps for the cosine: the run has ", s.total_steps, " steps");
  }
}

}  // namespace ddp::optim
