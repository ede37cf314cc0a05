// StepGraphPlan (train/step_graphs.hpp, Note [step graphs]).
#include "ddp/train/step_graphs.hpp"

namespace ddp::train {

StepRun StepGraphPlan::decide(const StepKey& key, uint64_t generation, bool* drop) {
  *drop = false;
  Entry& e = keys_[key];
  if (e.graph && e.generation == generation) return StepRun::kReplay;
  if (e.graph) {
    // Captured before memory it may read was freed or moved.
    *drop = true;
    e.graph = false;
    e.clean = 0;
    return StepRun::kIssue;
  }
  if (e.clean >= kWarmup && graphs() < kMaxGraphs) return StepRun::kCapture;
  return StepRun::kIssue;
}

void StepGraphPlan::done(const StepKey& key, StepRun run, uint64_t before, uint64_t after) {
  Entry& e = keys_[key];
  switch (run) {
    case StepRun::kIssue:
      e.clean = after == before ? e.clean + 1 : 0;
      break;
    case StepRun::kCapture:
      // Stale at once where the capture freed or moved memory: the next
      // decide drops it.
      e.graph = true;
      e.generation = before;
      e.clean = 0;
      break;
    case StepRun::kReplay:
      break;
  }
}

bool StepGraphPlan::stale(uint64_t generation) const {
  for (const auto& [key, e] : keys_)
    if (e.graph && e.generation != generation) return true;
  return false;
}

size_t StepGraphPlan::graphs() const {
  size_t n = 0;
  for (const auto& [key, e] : keys_) n += e.graph;
  return n;
}

}  // namespace ddp::train
