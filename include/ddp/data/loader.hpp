// ddp::data::Loader: batches of a dataset in a given index order, assembled by
// a background thread a few batches ahead, so the step never waits on copies.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/data/dataset.hpp"

namespace ddp::data {

struct Batch {
  int size = 0;
  std::vector<float> x;     // size * sample_numel
  std::vector<int32_t> y;   // size
};

class Loader {
 public:
  // Batches of `batch` consecutive entries of `indices`, starting at batch
  // `first_batch` (for resuming mid-epoch). With drop_last a partial last
  // batch is dropped. The dataset must outlive the loader.
  Loader(const Dataset& data, std::vector<int64_t> indices, int batch, bool drop_last = true,
         int64_t first_batch = 0, int prefetch = 2);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t num_batches() const { return num_batches_; }
  // Next batch into out (its buffers are reused); false at the end.
  // Rethrows an error of the prefetch thread.
  bool next(Batch& out);

 private:
  void run();
  const Dataset& data_;
  std::vector<int64_t> indices_;
  int batch_;
  int64_t num_batches_, next_batch_;
  int prefetch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::vector<Batch> free_;
  bool stop_ = false, done_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace ddp::data
