// ddp::data::Loader: batches of a dataset in a given index order, assembled by
// a background thread a few batches ahead, so the step never waits on copies.
#pragma once

#include <condition_variable>
#include <cstdint>
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

  // Batches in the whole epoch, the skipped first_batch ones included: next()
  // yields num_batches() - first_batch() of them.
  int64_t num_batches() const { return num_batches_; }
  int64_t first_batch() const { return first_batch_; }
  // Next batch into out (its buffers are reused); false at the end.
  // out's previous buffers go back to the prefetch thread, so nothing may
  // still read them (an async device copy must be complete) when next() is
  // called. Rethrows an error of the prefetch thread.
  bool next(Batch& out);

 private:
  void run();
  void fill(Batch& b, int64_t batch_index) const;

  const Dataset& data_;
  std::vector<int64_t> indices_;
  int batch_;
  int64_t num_batches_, first_batch_;
  // A ring of prefetch slots: [head_, head_ + ready_) hold finished batches in
  // order, the slot after them is the one the thread fills. next() swaps a
  // slot with the caller's batch, so buffers circulate and, once every buffer
  // has grown to a batch, nothing is allocated.
  std::vector<Batch> slots_;
  size_t head_ = 0, ready_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, done_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once everything above is in place
};

}  // namespace ddp::data
