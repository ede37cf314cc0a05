// ddp::train::run: the epoch loop of one rank. Every rank calls it with the
// same config; rank 0 prints and writes files.
#pragma once

#include <iosfwd>

#include "ddp/runtime/world.hpp"
#include "ddp/train/config.hpp"

namespace ddp::train {

// Trains per config; returns the process exit status (0). Throws ddp::Error on
// any failure (main turns it into the error contract).
int run(const World& world, const Config& config, std::ostream& out);

}  // namespace ddp::train
