// The divergence checks (divergence.hpp).
#include "ddp/train/divergence.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"  // CollectiveError

namespace ddp::train {

namespace {

// --precision fp16: a loss scale below this (40 halvings of the default
// 65536 in a row) ends the run as diverged.
constexpr float kMinLossScale = 0x1p-24f;

// A step whose averaged gradients are not finite: every rank has the same
// gradients, so all of them are here; they say which had a non-finite loss
// (where the host has it: not on GPUs), and the job ends naming the step.
[[noreturn]] void diverged(comm::Communicator& comm, const StepHealth& health, int64_t epoch, int64_t step,
                           int64_t global_step) {
  const double mine[2] = {health.loss, health.loss_known ? 1.0 : 0.0};
  const std::vector<char> all = comm.allgather(mine, sizeof mine, "divergence: every rank's loss");
  std::string ranks;
  int bad = 0, known = 0;
  for (int r = 0; r < comm.size(); ++r) {
    double theirs[2];
    std::memcpy(theirs, all.data() + r * sizeof mine, sizeof mine);
    if (theirs[1] == 0) continue;
    ++known;
    if (!std::isfinite(theirs[0])) ranks += detail::concat(bad++ ? ", " : "", r);
  }
  std::string what = "the averaged gradients hold a NaN or an infinity";
  if (known == comm.size())
    what += bad == 0             ? ", and the loss was finite on every rank"
            : bad == comm.size() ? ", and the loss was NaN or infinite on every rank"
                                 : detail::concat(", and the loss was NaN or infinite on rank", bad > 1 ? "s " : " ",
                                                  ranks);
  throw CollectiveError(detail::concat("training diverged at epoch ", epoch + 1, ", step ", step, " (global step ",
                                       global_step, "): ", what,
                                       ". Nothing of this step was saved; a smaller --lr may help"));
}

}  // namespace

bool check_step(comm::Communicator& comm, const StepHealth& health, const optim::GradScaler* scaler, int64_t epoch,
                int64_t step, int64_t global_step) {
  if (health.skipped) {
    // fp16's scaler skipped the step (every rank alike) and halved its
    // scale; a scale this small means the gradients are not finite at any
    // scale.
    if (scaler->scale() < kMinLossScale)
      throw CollectiveError(detail::concat(
          "training diverged at epoch ", epoch + 1, ", step ", step - health.steps_ago, " (global step ",
          global_step - health.steps_ago,
          "): --precision fp16's loss scale fell to ", scaler->scale(),
          ", every step skipped for non-finite gradients; nothing of it was saved. A smaller --lr, or "
          "--precision bf16, may help"));
    return true;
  }
  if (!health.grads_finite) diverged(comm, health, epoch, step, global_step);
  return false;
}

void check_epoch_loss(double loss_sum, int64_t epoch) {
  if (!std::isfinite(loss_sum))
    throw CollectiveError(detail::concat("training diverged in epoch ", epoch + 1, ": its loss sums to ", loss_sum,
                                         "; a smaller --lr may help"));
}

}  // namespace ddp::train
