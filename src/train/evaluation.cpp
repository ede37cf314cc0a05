// Distributed evaluation (evaluation.hpp).
#include "ddp/train/evaluation.hpp"

#include "ddp/data/loader.hpp"   // Loader
#include "ddp/data/sampler.hpp"  // eval_shard

namespace ddp::train {

double evaluate(Replica& replica, const World& world, const data::Dataset& test, int batch) {
  data::Loader loader(test, data::eval_shard(test.n, world.size, world.rank), batch, /*drop_last=*/false);
  data::Batch b;
  while (loader.next(b)) replica.eval_batch(b);
  const Sums s = replica.take_sums();
  double counts[2] = {s.eval_correct, s.eval_samples};
  replica.comm().allreduce_doubles(counts, 2, /*max=*/false, "evaluation counts");
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}

}  // namespace ddp::train
