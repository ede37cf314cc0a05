// ddp::abandon: memory that must outlive its owner, to the process's end.
//
// Note [abandoned requests] (comm/mpi_communicator.cpp): MPI cannot cancel a
// collective, so when an error leaves one in flight, the buffer it writes
// must stay allocated for whatever is left of the job. abandon() keeps the
// object reachable from a list that is never freed: nothing frees it, and a
// leak checker sees memory still held, not lost.
#pragma once

#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp {

// Called from destructors while an error unwinds: never throws. Out of
// memory, the object is leaked unlisted rather than freed.
template <typename T>
void abandon(T&& value) noexcept {
  using V = std::decay_t<T>;
  static auto* const mu = new std::mutex;
  static auto* const kept = new std::vector<std::shared_ptr<void>>;
  std::shared_ptr<void> held;
  try {
    held = std::make_shared<V>(std::forward<T>(value));
    std::lock_guard<std::mutex> lk(*mu);
    kept->push_back(held);
  } catch (...) {
    if (held) new std::shared_ptr<void>(std::move(held));  // unlisted, never freed
  }
}

}  // namespace ddp
