#include "ddp/optim/grad_scaler.hpp"

#include <cmath>

#include "ddp/core/error.hpp"

namespace ddp::optim {

GradScaler::GradScaler(const ScalerOptions& o) : opt_(o), state_{static_cast<float>(o.init_scale), 0} {
  DDP_CHECK(std::isfinite(state_.scale) && state_.scale > 0,
            "loss scale: the initial scale must be a positive float, got ", o.init_scale);
  DDP_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor), "loss scale: growth factor ", o.growth_factor,
            " must be more than 1");
  DDP_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "loss scale: backoff factor ", o.backoff_factor,
            " must be in (0, 1)");
  DDP_CHECK(o.growth_interval >= 1, "loss scale: growth interval ", o.growth_interval, " must be at least 1");
}

void GradScaler::update(bool found_inf) {
  update_loss_scale(state_, found_inf, opt_.growth_factor, opt_.backoff_factor, opt_.growth_interval);
}

void GradScaler::set_state(float scale, int64_t growth_tracker) {
  DDP_CHECK(std::isfinite(scale) && scale > 0, "loss scale ", scale, " is not a positive float");
  DDP_CHECK(growth_tracker >= 0 && growth_tracker < opt_.growth_interval, "loss scale: ", growth_tracker,
            " good steps counted, outside [0, growth interval ", opt_.growth_interval, ")");
  state_ = {scale, growth_tracker};
}

}  // namespace ddp::optim
