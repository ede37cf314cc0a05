// One micro-shard's gradients into a fixed-point sum as a rank's backward
// adds them: from lane 0, params [first, first + count) at a time
// (ExactGradientSum::add), grads being the whole flat buffer (host or
// device memory) of the sum's params, whose sizes are numels.
#pragma once

#include <cstddef>
#include <vector>

#include "ddp/deterministic/exact_sum.hpp"

namespace ddp::test {

inline void add_shard(ExactGradientSum& sum, const std::vector<size_t>& numels, const float* grads, size_t first = 0,
                      size_t count = 0) {
  if (count == 0) count = numels.size() - first;
  size_t offset = 0;
  for (size_t p = 0; p < first; ++p) offset += numels[p];
  sum.add(0, grads + offset, first, count);
}

}  // namespace ddp::test
