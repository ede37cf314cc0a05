// How a replica test gets its backend on world w: the CPU's here, a GPU's in
// mpi/cuda (gpu_test_support.hpp's gpu_backend), so that one check runs on
// either device.
#pragma once

#include <functional>
#include <memory>

#include "ddp/runtime/world.hpp"  // World
#include "ddp/train/config.hpp"   // Config
#include "ddp/train/replica.hpp"  // Backend

namespace ddp::train::test {

using MakeBackend = std::function<std::unique_ptr<Backend>(const World& w, const Config& cfg)>;

}  // namespace ddp::train::test
