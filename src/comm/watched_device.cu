// Watchdog::watch for the GPU communicators (comm/watchdog.hpp).
#include "ddp/comm/device_communicator.hpp"
#include "ddp/comm/watchdog.hpp"
#include "watched.hpp"

namespace ddp::comm {

namespace {

// The device all-reduces are numbered when issued and complete when their
// event has fired (done()); synchronize is a wait on this device, not a
// collective, and is only given the backstop timeout.
class WatchedDevice final : public Watched<DeviceCommunicator> {
 public:
  using Watched<DeviceCommunicator>::Watched;
  void synchronize(cudaStream_t stream, const std::string& what) override {
    inner_->set_timeout(timeout() + grace_);
    Tracker::Nested inside;
    inner_->synchronize(stream, what);
  }
  std::chrono::milliseconds wait_limit() const override { return timeout() + grace_; }
  void abort_now() override { inner_->abort_now(); }
  void check_errors(const std::string& what) override { inner_->check_errors(what); }
  void capturing(bool on) override {
    unwatched_ = on;
    inner_->capturing(on);
  }
  // Watched as an all-reduce is, and completed by the watchdog's thread when
  // it sees it done (nothing waits for it).
  std::shared_ptr<Work> issued_on(cudaStream_t stream, std::string what, const std::string& bytes) override {
    return watched_async(what, bytes, [&] { return inner_->issued_on(stream, what, bytes); });
  }
};

}  // namespace

std::unique_ptr<DeviceCommunicator> Watchdog::watch(std::unique_ptr<DeviceCommunicator> inner) {
  return std::make_unique<WatchedDevice>(std::move(inner), tracker(), grace());
}

}  // namespace ddp::comm
