// CheckedRuns (deterministic/checked_runs.hpp): Note [checked runs].
#include "ddp/deterministic/checked_runs.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"

namespace ddp::deterministic {

using nn::OpArgs;

bool checkable_in_runs(nn::OpKind kind) {
  switch (kind) {
    case nn::OpKind::Conv2d:
    case nn::OpKind::ReLU:
    case nn::OpKind::Add:
    case nn::OpKind::AvgPool2d:
    case nn::OpKind::GlobalAvgPool:
    case nn::OpKind::Flatten:
    case nn::OpKind::Linear: return true;
    // BatchNorm's statistics are the batch's; the fused LeNet layer keeps
    // its ReLU mask per image.
    case nn::OpKind::ConvReluPool:
    case nn::OpKind::BatchNorm2d: return false;
  }
  return false;
}

CheckedRuns::CheckedRuns(const nn::Graph& g, size_t op, std::unique_ptr<nn::Kernel> inner, Env env)
    : inner_(std::move(inner)), env_(std::move(env)), name_(g.ops[op].name), out_numel_(g.values[op + 1].numel()) {
  DDP_CHECK(checkable_in_runs(g.ops[op].kind) && inner_->ops() == 1, "op ", name_, ": ", to_string(g.ops[op].kind),
            " cannot take micro-shards in checked runs");
  DDP_CHECK(env_.device && env_.same_bits && env_.say_once, "op ", name_, ": checked runs without a device");
  for (const int v : g.ops[op].inputs) in_numel_.push_back(g.values[size_t(v)].numel());
}

void CheckedRuns::begin_shards(const OpArgs& whole, int shard, bool backward) {
  shard_ = shard;
  current_ = Key{whole.batch, whole.mode, backward};
}

bool CheckedRuns::shards_in_one_call() const { return current_verdict() != Verdict::PerShard; }

CheckedRuns::Verdict CheckedRuns::verdict(int batch, nn::Mode mode, bool backward) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = verdicts_.find(Key{batch, mode, backward});
  return it == verdicts_.end() ? Verdict::Unchecked : it->second;
}

CheckedRuns::Verdict CheckedRuns::current_verdict() const {
  const auto [batch, mode, backward] = current_;
  return verdict(batch, mode, backward);
}

bool CheckedRuns::bias_grads_of_shards(const OpArgs& a, const float* dy, int shard, int shards, float* bias,
                                       size_t stride) {
  auto* inner = dynamic_cast<ShardBias*>(inner_.get());
  return inner && inner->bias_grads_of_shards(a, dy, shard, shards, bias, stride);
}

bool CheckedRuns::concurrent_shard_calls(bool bias) const {
  const auto* inner = dynamic_cast<const ConcurrentShards*>(inner_.get());
  return inner && inner->concurrent_shard_calls(bias);
}

OpArgs CheckedRuns::slice(const OpArgs& a, int64_t first, int count) const {
  OpArgs part = a;
  part.batch = count;
  for (size_t j = 0; j < part.x.size(); ++j) part.x[j] = a.x[j] + first * in_numel_[j];
  part.y = a.y + first * out_numel_;
  return part;
}

void CheckedRuns::each_shard(int batch, const std::function<void(int64_t, int)>& body) const {
  DDP_CHECK(shard_ > 0, "op ", name_, ": a run of micro-shards before begin_shards");
  for (int64_t first = 0; first < batch; first += shard_) body(first, int(std::min<int64_t>(shard_, batch - first)));
}

// A batch size a kernel cannot take in one call (cuDNN with no
// deterministic algorithm for it) fails the check as a different result
// does: the micro-shards' calls are the reference.
std::string CheckedRuns::attempt(const std::function<void()>& call) const {
  try {
    call();
    return "";
  } catch (const Error& e) {
    if (env_.after_failure) env_.after_failure();
    return e.what();
  }
}

void CheckedRuns::record(bool same, const std::string& failed) {
  bool said = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Verdict& v = verdicts_[current_];
    if (!same) {
      said = v != Verdict::PerShard;
      v = Verdict::PerShard;
    } else if (v == Verdict::Unchecked) {
      v = Verdict::OneCall;
    }
  }
  if (!said) return;
  const auto [batch, mode, backward] = current_;
  env_.say_once(detail::concat("checked-runs ", name_, " ", batch, " ", int(mode), " ", backward),
                detail::concat("op ", name_, ": one call over the micro-shards of a batch of ", batch,
                               backward ? " (backward)" : mode == nn::Mode::Train ? " (forward)" : " (evaluation)",
                               failed.empty() ? " does not give each micro-shard its own bits"
                                              : " failed (" + failed + ")",
                               "; it runs micro-shard by micro-shard"));
}

void CheckedRuns::forward(const OpArgs& a, const Lane&) {
  if (a.batch <= shard_ || current_verdict() == Verdict::OneCall) return inner_->forward(a);
  forward_checked(a);
}

// The micro-shards into scratch, then the one call into a.y (the last
// forward is the one whose output stands); where they differ, the
// micro-shards again into a.y.
void CheckedRuns::forward_checked(const OpArgs& a) {
  const size_t n = size_t(a.batch) * size_t(out_numel_);
  const std::unique_ptr<nn::Array> scratch = env_.device->alloc(n);
  each_shard(a.batch, [&](int64_t first, int count) {
    OpArgs part = slice(a, first, count);
    part.y = scratch->data() + first * out_numel_;
    inner_->forward(part);
  });
  const std::string failed = attempt([&] { inner_->forward(a); });
  const bool same = failed.empty() && env_.same_bits(a.y, scratch->data(), n);
  if (!same) each_shard(a.batch, [&](int64_t first, int count) { inner_->forward(slice(a, first, count)); });
  record(same, failed);
}

void CheckedRuns::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane&) {
  const bool run = std::all_of(a.dp.begin(), a.dp.end(), [](const float* d) { return d == nullptr; });
  if (!run || a.batch <= shard_ || current_verdict() == Verdict::OneCall) return inner_->backward(a, dy, dx);
  backward_checked(a, dy, dx);
}

void CheckedRuns::backward_checked(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  std::vector<std::unique_ptr<nn::Array>> scratch(dx.size());
  for (size_t j = 0; j < dx.size(); ++j)
    if (dx[j]) scratch[j] = env_.device->alloc(size_t(a.batch) * size_t(in_numel_[j]));
  const auto shards_into = [&](const std::function<float*(size_t, int64_t)>& base) {
    each_shard(a.batch, [&](int64_t first, int count) {
      std::vector<float*> d(dx.size(), nullptr);
      for (size_t j = 0; j < dx.size(); ++j)
        if (dx[j]) d[j] = base(j, first) + first * in_numel_[j];
      inner_->backward(slice(a, first, count), dy + first * out_numel_, d);
    });
  };
  shards_into([&](size_t j, int64_t) { return scratch[j]->data(); });
  const std::string failed = attempt([&] { inner_->backward(a, dy, dx); });
  bool same = failed.empty();
  for (size_t j = 0; j < dx.size() && same; ++j)
    if (dx[j]) same = env_.same_bits(dx[j], scratch[j]->data(), size_t(a.batch) * size_t(in_numel_[j]));
  if (!same) shards_into([&](size_t j, int64_t) { return dx[j]; });
  record(same, failed);
}

}  // namespace ddp::deterministic
