#include "ddp/train/resume.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ddp/core/error.hpp"
#include "ddp/deterministic/exact_sum.hpp"  // kMaxExponent: what a checkpoint's exponents may be
#include "ddp/train/optim_config.hpp"  // optimizer_options

namespace ddp::train {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Names and shapes of every parameter (then buffer and counter, where the
// model has any), hashed: two models with the same fingerprint have
// interchangeable state dicts.
std::string fingerprint(const nn::Graph& g) {
  std::string desc;
  auto add = [&](const nn::TensorInfo& t) {
    desc += t.name + "[";
    for (int64_t d : t.shape) desc += std::to_string(d) + ",";
    desc += "];";
  };
  for (const auto& p : g.params) add(p);
  for (const auto& b : g.buffers) add(b);
  for (const auto& c : g.counters) desc += c + ";";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08lx",
                crc32(0L, reinterpret_cast<const Bytef*>(desc.data()), static_cast<uInt>(desc.size())));
  return buf;
}

// The dataset by content, not by path: the same files mounted elsewhere on
// the resuming nodes are the same dataset.
std::string dataset_id(const data::Dataset& d) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(d.labels.data()), static_cast<uInt>(d.labels.size() * sizeof(int32_t)));
  const char* img = reinterpret_cast<const char*>(d.images.data());
  const size_t bytes = d.images.size() * sizeof(float);
  for (size_t off = 0; off < bytes; off += (size_t(1) << 30))
    crc = crc32(crc, reinterpret_cast<const Bytef*>(img + off), static_cast<uInt>(std::min(bytes - off, size_t(1) << 30)));
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%lld images %dx%dx%d, crc32 %08lx", static_cast<long long>(d.n), d.c, d.h, d.w, crc);
  return buf;
}

// Note [checkpoint contents]: optimizer state as "optimizer.<state>.<param>",
// PyTorch's per-parameter state names, and its step count.
const std::string kOptimizerPrefix = "optimizer.";
const std::string kOptimizerStep = "optimizer.step";
// --deterministic's fixed-point exponent per parameter, flat order (Note
// [fixed-point gradients], deterministic/exact_sum.hpp).
const std::string kGradExponents = "ddp.deterministic.grad_exponents";
// --precision fp16's loss scaler, as torch.amp.GradScaler's state_dict names
// them (optim/grad_scaler.hpp).
const std::string kScalerScale = "scaler.scale";
const std::string kScalerTracker = "scaler._growth_tracker";

}  // namespace

std::map<std::string, std::string> resume_config(const Config& cfg, const nn::Graph& g,
                                                 const data::Dataset& train, const optim::LrSchedule& schedule) {
  const optim::Options o = optimizer_options(cfg);
  std::map<std::string, std::string> c = {
      {"model", cfg.model},
      {"architecture", fingerprint(g)},
      {"global_batch", std::to_string(cfg.batch_size)},
      {"seed", std::to_string(cfg.seed)},
      {"dataset", dataset_id(train)},
      {"optimizer", optim::kind_name(o.kind)},
      {"lr", num(schedule.base)},
      {"weight_decay", num(o.weight_decay)},
      {"lr_schedule", schedule.kind == "constant" && schedule.warmup_steps == 0 ? "constant" : schedule.describe()},
      {"rng", "sampler xoshiro256** keyed by (seed, epoch); no other random state"}};
  if (o.kind == optim::Kind::Sgd) {
    c["momentum"] = num(o.momentum);
    c["nesterov"] = o.nesterov ? "true" : "false";
  } else {
    c["betas"] = num(o.beta1) + "," + num(o.beta2);
    c["eps"] = num(o.eps);
  }
  // Recorded where used, so checkpoints of runs without them stay resumable.
  if (o.no_decay_norm_bias) c["no_decay_norm_bias"] = "true";
  if (o.max_grad_norm > 0) c["clip_grad_norm"] = num(o.max_grad_norm);
  // Where there are batch statistics, whose they are is part of the run.
  if (!g.counters.empty()) c["sync_bn"] = cfg.sync_bn ? "true" : "false";
  // Another cut of the global batch sums other floats: not the same run.
  if (cfg.deterministic_shards > 0) c["deterministic_shards"] = std::to_string(cfg.deterministic_shards);
  // Other roundings are another run (a checkpoint that has it, resumed
  // without it, is refused too: checkpoint::check_compatible).
  if (cfg.precision != "fp32") c["precision"] = cfg.precision;
  if (cfg.precision == "fp16") c["loss_scale_growth_interval"] = std::to_string(cfg.growth_interval);
  return c;
}

std::vector<checkpoint::TensorView> checkpoint_tensors(const nn::Graph& g, const TrainState& s) {
  std::vector<checkpoint::TensorView> views;
  for (const auto& p : g.params) views.push_back({p.name, p.shape, s.model.params.data() + p.offset});
  for (const auto& b : g.buffers) views.push_back({b.name, b.shape, s.model.buffers.data() + b.offset});
  for (size_t i = 0; i < g.counters.size(); ++i)
    views.push_back({g.counters[i], {}, nullptr, &s.model.counters[i]});
  if (s.optimizer.step > 0) views.push_back({kOptimizerStep, {}, nullptr, &s.optimizer.step});
  if (!s.grad_exponents.empty())
    views.push_back({kGradExponents, {int64_t(s.grad_exponents.size())}, nullptr, s.grad_exponents.data()});
  for (const auto& [name, data] : s.optimizer.buffers)
    for (const auto& p : g.params)
      views.push_back({kOptimizerPrefix + name + "." + p.name, p.shape, data.data() + p.offset});
  if (s.loss_scale > 0) {
    views.push_back({kScalerScale, {}, &s.loss_scale});
    views.push_back({kScalerTracker, {}, nullptr, &s.scaler_growth_tracker});
  }
  return views;
}

// Note [resume position]: a checkpoint's position must be one this run can
// stand at. The global batch and the dataset are the run's (check_compatible),
// so the steps per epoch are too, and then step_in_epoch < steps, global_step
// = epoch * steps + step_in_epoch, samples_consumed = global_step * global
// batch, and the epoch's sums cover at most the part of the epoch done. The
// writer's world size divided the global batch. All of it is checked before
// the trainer counts on from these values, so no hostile value can make that
// arithmetic overflow (the decoder already bounds each one by 2^50).
void check_resumable(const std::string& path, const checkpoint::Checkpoint& ckpt, const nn::Graph& g,
                     int64_t steps, int global_batch, const optim::Options& opt) {
  const checkpoint::RunState& s = ckpt.state;
  DDP_CHECK(s.step_in_epoch < steps, path, ": checkpoint is at step ", s.step_in_epoch,
            " of an epoch that has only ", steps, " steps here");
  int64_t at = 0, samples = 0;
  const bool overflow = __builtin_mul_overflow(s.epoch, steps, &at) ||
                        __builtin_add_overflow(at, s.step_in_epoch, &at) ||
                        __builtin_mul_overflow(at, int64_t(global_batch), &samples);
  DDP_CHECK(!overflow && s.global_step == at, path, ": checkpoint's global step ", s.global_step,
            " is not epoch ", s.epoch, " x ", steps, " steps + step ", s.step_in_epoch);
  DDP_CHECK(s.samples_consumed == samples, path, ": checkpoint counts ", s.samples_consumed,
            " samples consumed, not global step ", s.global_step, " x global batch ", global_batch);
  DDP_CHECK(global_batch % s.world_size == 0, path, ": checkpoint was written by ", s.world_size,
            " ranks, which do not divide the global batch ", global_batch);
  const double done = double(s.step_in_epoch) * global_batch;
  DDP_CHECK(s.epoch_samples <= done && s.epoch_correct <= s.epoch_samples, path,
            ": checkpoint's epoch sums (", s.epoch_samples, " samples, ", s.epoch_correct,
            " correct) exceed the ", done, " samples of the epoch done");
  auto check_tensor = [&](const std::string& name, const std::vector<int64_t>& shape, checkpoint::Dtype dtype) {
    const auto* t = ckpt.file.find(name);
    DDP_CHECK(t, path, ": checkpoint has no tensor '", name, "'");
    DDP_CHECK(t->dtype == dtype && t->shape == shape, path, ": tensor '", name, "' has the wrong shape or type for model ",
              g.model);
  };
  for (const auto& p : g.params) check_tensor(p.name, p.shape, checkpoint::Dtype::F32);
  for (const auto& b : g.buffers) check_tensor(b.name, b.shape, checkpoint::Dtype::F32);
  for (const auto& c : g.counters) check_tensor(c, {}, checkpoint::Dtype::I64);
  if (const auto* e = ckpt.file.find(kGradExponents)) {
    check_tensor(kGradExponents, {int64_t(g.params.size())}, checkpoint::Dtype::I64);
    for (int64_t x : e->ints)
      DDP_CHECK(x >= -kMaxExponent && x <= kMaxExponent, path, ": tensor '", kGradExponents, "' holds ", x,
                ", outside [", -kMaxExponent, ", ", kMaxExponent, "]");
  }
  if (const auto* scale = ckpt.file.find(kScalerScale)) {
    check_tensor(kScalerScale, {}, checkpoint::Dtype::F32);
    check_tensor(kScalerTracker, {}, checkpoint::Dtype::I64);
    const float v = scale->data.at(0);
    const int64_t t = ckpt.file.find(kScalerTracker)->ints.at(0);
    DDP_CHECK(std::isfinite(v) && v > 0, path, ": tensor '", kScalerScale, "' holds ", v,
              ", not a positive loss scale");
    DDP_CHECK(t >= 0, path, ": tensor '", kScalerTracker, "' holds ", t, ", a negative count of steps");
  }
  // The optimizer's buffers for every parameter, once it has stepped (older
  // checkpoints have no step count: their buffers say whether it has).
  const auto* step = ckpt.file.find(kOptimizerStep);
  if (step) {
    check_tensor(kOptimizerStep, {}, checkpoint::Dtype::I64);
    DDP_CHECK(step->ints.at(0) >= 0, path, ": optimizer step ", step->ints.at(0), " is negative");
  }
  for (const auto& name : optim::buffer_names(opt)) {
    const std::string prefix = kOptimizerPrefix + name + ".";
    const bool stepped = step ? step->ints.at(0) > 0 : ckpt.file.find(prefix + g.params.front().name) != nullptr;
    if (stepped)
      for (const auto& p : g.params) check_tensor(prefix + p.name, p.shape, checkpoint::Dtype::F32);
  }
}

void restore(const checkpoint::Checkpoint& ckpt, const nn::Graph& g, const optim::Options& opt, TrainState& s) {
  s.model.params.assign(g.num_params, 0.0f);
  s.model.buffers.assign(g.num_buffers, 0.0f);
  s.model.counters.assign(g.counters.size(), 0);
  auto copy = [&](const std::string& name, float* dst) {
    const auto& src = ckpt.file.find(name)->data;
    std::copy(src.begin(), src.end(), dst);
  };
  for (const auto& p : g.params) copy(p.name, s.model.params.data() + p.offset);
  for (const auto& b : g.buffers) copy(b.name, s.model.buffers.data() + b.offset);
  for (size_t i = 0; i < g.counters.size(); ++i) s.model.counters[i] = ckpt.file.find(g.counters[i])->ints.at(0);
  s.grad_exponents.clear();
  if (const auto* e = ckpt.file.find(kGradExponents)) s.grad_exponents = e->ints;
  s.loss_scale = 0;
  s.scaler_growth_tracker = 0;
  if (const auto* scale = ckpt.file.find(kScalerScale)) {
    s.loss_scale = scale->data.at(0);
    s.scaler_growth_tracker = ckpt.file.find(kScalerTracker)->ints.at(0);
  }
  s.optimizer = {};
  const auto names = optim::buffer_names(opt);
  if (const auto* step = ckpt.file.find(kOptimizerStep))
    s.optimizer.step = step->ints.at(0);
  else if (!names.empty() && ckpt.file.find(kOptimizerPrefix + names[0] + "." + g.params.front().name))
    s.optimizer.step = 1;  // an older checkpoint: its buffers say a step was taken
  if (s.optimizer.step == 0) return;
  for (const auto& name : names) {
    std::vector<float> data(g.num_params, 0.0f);
    for (const auto& p : g.params) copy(kOptimizerPrefix + name + "." + p.name, data.data() + p.offset);
    s.optimizer.buffers.emplace_back(name, std::move(data));
  }
}

std::optional<Resumed> find_resume_point(comm::Communicator& comm, const Config& cfg,
                                         const std::map<std::string, std::string>& current,
                                         const ResumeCheck& usable, std::ostream& out, std::ostream& log) {
  if (cfg.resume.empty()) return std::nullopt;
  std::string path, bytes;
  if (comm.rank() == 0) {
    if (cfg.resume != "auto") {
      path = cfg.resume;
      bytes = checkpoint::read_file_bytes(path);
      const auto c = checkpoint::decode_checkpoint(path, bytes);
      checkpoint::check_compatible(path, c.state.config, current);
      usable(path, c);
    } else {
      // Corrupt or foreign checkpoints are skipped, each named in a warning.
      // But when every checkpoint there is of another configuration, a fresh
      // start would soon rotate them away: that is refused instead.
      std::string incompatible;
      auto skip = [&](const Error& e) {
        log << "ddp_train: warning: skipping checkpoint " << e.what() << "\n" << std::flush;
      };
      for (const auto& candidate : checkpoint::list_checkpoints(cfg.checkpoint_dir)) {
        std::string b;
        checkpoint::Checkpoint c;
        try {
          b = checkpoint::read_file_bytes(candidate);
          c = checkpoint::decode_checkpoint(candidate, b);
        } catch (const Error& e) {
          skip(e);
          continue;
        }
        try {
          checkpoint::check_compatible(candidate, c.state.config, current);
        } catch (const Error& e) {
          skip(e);
          if (incompatible.empty()) incompatible = e.what();
          continue;
        }
        try {
          usable(candidate, c);
        } catch (const Error& e) {
          skip(e);
          continue;
        }
        path = candidate;
        bytes = std::move(b);
        break;
      }
      DDP_CHECK(!path.empty() || incompatible.empty(), incompatible,
                " (no checkpoint in ", cfg.checkpoint_dir, " fits this run; use another --checkpoint-dir to start afresh)");
      if (path.empty())
        out << "ddp_train: no valid checkpoint in " << cfg.checkpoint_dir << ": starting fresh\n" << std::flush;
    }
  }
  int64_t sizes[2] = {static_cast<int64_t>(path.size()), path.empty() ? -1 : static_cast<int64_t>(bytes.size())};
  comm.broadcast(sizes, sizeof(sizes), 0, "resume: checkpoint size");
  if (sizes[1] < 0) return std::nullopt;
  path.resize(static_cast<size_t>(sizes[0]));
  bytes.resize(static_cast<size_t>(sizes[1]));
  comm.broadcast(path.data(), path.size(), 0, "resume: checkpoint name");
  comm.broadcast(bytes.data(), bytes.size(), 0, "resume: checkpoint contents");
  Resumed r{path, checkpoint::decode_checkpoint(path, bytes)};
  if (comm.rank() == 0) {
    const auto& s = r.checkpoint.state;
    out << "ddp_train: resuming from " << path << ": epoch " << s.epoch + 1 << ", step " << s.step_in_epoch
        << " (global step " << s.global_step << ", written by " << s.world_size << " rank"
        << (s.world_size == 1 ? "" : "s") << ")\n"
        << std::flush;
  }
  return r;
}

}  // namespace ddp::train
