// Command-line flags of ddp_train, read like PyTorch's examples.
#pragma once

#include <optional>
#include <string>

#include "ddp/train/config.hpp"

namespace ddp::cli {

struct Parsed {
  train::Config config;
  std::optional<std::string> help;  // set when --help was asked for: print it and exit 0
};

// Parses and validates argv against the world size. Throws ddp::UsageError
// naming the flag at fault.
Parsed parse_options(int argc, char** argv, int world_size);

}  // namespace ddp::cli
