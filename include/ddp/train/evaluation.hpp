// ddp::train::evaluate: exact distributed accuracy. Every rank evaluates its
// eval_shard of the test set (eval mode: BatchNorm on its running
// statistics) and the counts are summed: no sample twice, none left out.
#pragma once

#include "ddp/data/dataset.hpp"   // Dataset
#include "ddp/runtime/world.hpp"  // World
#include "ddp/train/replica.hpp"  // Replica

namespace ddp::train {

// The test accuracy over every rank, in batches of `batch` per rank. Takes
// the replica's sums: training's must have been taken before. Collective.
double evaluate(Replica& replica, const World& world, const data::Dataset& test, int batch);

}  // namespace ddp::train
