// ddp::deterministic::CheckedRuns: a plain kernel that takes a run of
// micro-shards in one call where that call is checked to give the
// micro-shards' own bits.
//
// Note [checked runs]: on a device with one lane (a GPU) --deterministic
// calls every op but BatchNorm once per micro-shard (Note [micro-shards] in
// deterministic/shards.hpp): 16 small calls where the plain run makes one,
// which leaves most of a GPU idle. An op whose every sample's output and
// input gradient come from that sample alone (a convolution, a linear
// layer, ReLU, the residual add, pooling, flatten) could take all of them in
// one call (Note [shard runs]), if its kernel gives each sample the same
// bits whatever batch the call holds. A library's kernel cannot be read for
// that (cuDNN chooses its algorithm by batch size, cuBLAS its GEMM's by the
// matrices' sides), so it is checked: the first run call of each batch
// size, mode and direction also runs the micro-shards one by one, into
// scratch, and the two are compared bit for bit on the batch's own values.
// Equal: the one call stands, and that batch size, mode and
// direction go in one call from then on. Different (or the one call
// failed: cuDNN may have no deterministic algorithm for the larger batch):
// the micro-shards' calls are made again into the real output, the device
// says so once, and that batch size, mode and direction go micro-shard by
// micro-shard from then on.
// The micro-shard calls stay the reference, as their bits are what they are
// at every world size; parameter gradients are summed per micro-shard
// anyway (a run's backward takes none).
//
// A check on one batch's values is not a proof: a kernel that summed in
// another order there would differ there, but one could in principle agree
// on one batch and not on another. The world-size tests
// (`On/DeterministicNext.*`) compare whole runs at 1, 2 and 4 ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/deterministic/shards.hpp"  // LaneKernel
#include "ddp/nn/device.hpp"             // Device, Kernel

namespace ddp::deterministic {

// The op kinds a device may hand to CheckedRuns: no parameters summed in a
// run's call that matter to it, no batch statistics (BatchNorm), nothing
// kept per sample between forward and backward (the fused conv-ReLU-pool).
bool checkable_in_runs(nn::OpKind kind);

class CheckedRuns final : public nn::Kernel, public LaneKernel, public ShardBias, public ConcurrentShards {
 public:
  // What the device lends the check.
  struct Env {
    nn::Device* device = nullptr;  // scratch (alloc)
    // Whether n floats at a and b (the device's memory) are the same bits.
    std::function<bool(const float* a, const float* b, size_t n)> same_bits;
    // Said once per key (the device's warn-once).
    std::function<void(const std::string& key, const std::string& message)> say_once;
    // After a call that failed: what it left behind that the next call
    // would take for its own failure (the GPU's last error); may be empty.
    std::function<void()> after_failure;
  };
  enum class Verdict { Unchecked, OneCall, PerShard };

  // inner: op `op` of g's plain kernel.
  CheckedRuns(const nn::Graph& g, size_t op, std::unique_ptr<nn::Kernel> inner, Env env);

  void forward(const nn::OpArgs& a) override { inner_->forward(a); }
  void backward(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    inner_->backward(a, dy, dx);
  }
  bool set_precision(nn::Precision p) override { return inner_->set_precision(p); }

  void begin_shards(const nn::OpArgs& whole, int shard, bool backward) override;
  // True unless a check of this batch size, mode and direction failed.
  bool shards_in_one_call() const override;
  void forward(const nn::OpArgs& a, const Lane& lane) override;
  // A run's backward (every a.dp nullptr); a micro-shard's as it is.
  void backward(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane) override;

  // The inner kernel's, where it is a ShardBias; else false.
  bool bias_grads_of_shards(const nn::OpArgs& a, const float* dy, int shard, int shards, float* bias,
                            size_t stride) override;
  // The inner kernel's, where it is a ConcurrentShards (a micro-shard's call
  // goes to it untouched); else false.
  bool concurrent_shard_calls(bool bias) const override;

  // What the checks of whole batches of `batch` found so far.
  Verdict verdict(int batch, nn::Mode mode, bool backward) const;

 private:
  using Key = std::tuple<int, nn::Mode, bool>;  // whole batch, mode, backward
  // a's samples first .. first + count.
  nn::OpArgs slice(const nn::OpArgs& a, int64_t first, int count) const;
  // body(first, count) for each micro-shard of a run of `batch` samples.
  void each_shard(int batch, const std::function<void(int64_t, int)>& body) const;
  void forward_checked(const nn::OpArgs& a);
  void backward_checked(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx);
  Verdict current_verdict() const;  // begin_shards' batch, mode and direction
  // "" where call returned, else what it threw.
  std::string attempt(const std::function<void()>& call) const;
  // A check's outcome for begin_shards' key (failed: the one call's error);
  // a failure is said once.
  void record(bool same, const std::string& failed);

  std::unique_ptr<nn::Kernel> inner_;
  Env env_;
  std::string name_;
  std::vector<int64_t> in_numel_;  // per sample, per input
  int64_t out_numel_;
  int shard_ = 0;
  Key current_{0, nn::Mode::Train, false};  // begin_shards'
  mutable std::mutex mu_;
  std::map<Key, Verdict> verdicts_;
};

}  // namespace ddp::deterministic
