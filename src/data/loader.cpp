// Loader: one producer thread gathers samples into batches ahead of the step.
#include "ddp/data/loader.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ddp/core/error.hpp"

namespace ddp::data {

Loader::Loader(const Dataset& data, std::vector<int64_t> indices, int batch, bool drop_last,
               int64_t first_batch, int prefetch)
    : data_(data), indices_(std::move(indices)), batch_(batch) {
  DDP_CHECK(batch >= 1, "loader: batch size ", batch, " must be at least 1");
  DDP_CHECK(prefetch >= 1, "loader: prefetch ", prefetch, " must be at least 1");
  DDP_CHECK(data.n >= 0 && data.images.size() == size_t(data.n * data.sample_numel()) &&
                data.labels.size() == size_t(data.n),
            "loader: dataset ", data.source, " is inconsistent (n = ", data.n, ", ",
            data.images.size(), " pixels, ", data.labels.size(), " labels)");
  const auto len = static_cast<int64_t>(indices_.size());
  num_batches_ = drop_last ? len / batch : (len + batch - 1) / batch;
  DDP_CHECK(first_batch >= 0 && first_batch <= num_batches_, "loader: first batch ", first_batch,
            " is outside the epoch's ", num_batches_, " batches");
  first_batch_ = first_batch;
  slots_.resize(static_cast<size_t>(prefetch));
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Loader::fill(Batch& b, int64_t batch_index) const {
  const int64_t begin = batch_index * batch_;
  const int64_t end = std::min<int64_t>(begin + batch_, static_cast<int64_t>(indices_.size()));
  const int64_t numel = data_.sample_numel();
  b.size = static_cast<int>(end - begin);
  b.x.resize(static_cast<size_t>(b.size * numel));  // no allocation once grown
  b.y.resize(static_cast<size_t>(b.size));
  for (int64_t k = 0; k < b.size; ++k) {
    const int64_t idx = indices_[static_cast<size_t>(begin + k)];
    DDP_CHECK(idx >= 0 && idx < data_.n, "loader: index ", idx, " at position ", begin + k,
              " is outside the dataset ", data_.source, " (", data_.n, " samples)");
    std::memcpy(b.x.data() + k * numel, data_.images.data() + idx * numel,
                static_cast<size_t>(numel) * sizeof(float));
    b.y[static_cast<size_t>(k)] = data_.labels[static_cast<size_t>(idx)];
  }
}

void Loader::run() {
  try {
    for (int64_t i = first_batch_; i < num_batches_; ++i) {
      size_t slot;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || ready_ < slots_.size(); });
        if (stop_) return;
        slot = (head_ + ready_) % slots_.size();
      }
      // The slot is outside the ready range, so next() does not touch it.
      fill(slots_[slot], i);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++ready_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

bool Loader::next(Batch& out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_ > 0 || done_; });
  if (ready_ == 0) {
    // Batches made before a failure are still delivered; the error surfaces
    // at the batch that could not be made, and again on every later call.
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  std::swap(out, slots_[head_]);
  head_ = (head_ + 1) % slots_.size();
  --ready_;
  lock.unlock();
  cv_.notify_all();
  return true;
}

}  // namespace ddp::data
