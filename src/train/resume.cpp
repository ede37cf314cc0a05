#include "ddp/train/resume.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ddp/core/error.hpp"

namespace ddp::train {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Names and shapes of every parameter, hashed: two models with the same
// fingerprint have interchangeable state dicts.
std::string fingerprint(const nn::Model& model) {
  std::string desc;
  for (const auto& p : model.param_info()) {
    desc += p.name + "[";
    for (int64_t d : p.shape) desc += std::to_string(d) + ",";
    desc += "];";
  }
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

const std::string kMomentumPrefix = "optimizer.momentum_buffer.";

}  // namespace

std::map<std::string, std::string> resume_config(const Config& cfg, const nn::Model& model,
                                                 const data::Dataset& train) {
  return {{"model", cfg.model},
          {"architecture", fingerprint(model)},
          {"global_batch", std::to_string(cfg.batch_size)},
          {"seed", std::to_string(cfg.seed)},
          {"dataset", dataset_id(train)},
          {"optimizer", "sgd"},
          {"lr", num(cfg.lr)},
          {"momentum", num(cfg.momentum)},
          {"weight_decay", num(cfg.weight_decay)},
          {"nesterov", cfg.nesterov ? "true" : "false"},
          {"lr_schedule", "constant"},
          {"rng", "sampler xoshiro256** keyed by (seed, epoch); no other random state"}};
}

std::vector<checkpoint::TensorView> checkpoint_tensors(const nn::Model& model, optim::Sgd& sgd) {
  std::vector<checkpoint::TensorView> views;
  for (const auto& p : model.param_info()) views.push_back({p.name, p.shape, model.params() + p.offset});
  if (sgd.has_momentum_state())
    for (const auto& p : model.param_info())
      views.push_back({kMomentumPrefix + p.name, p.shape, sgd.momentum_buffer().data() + p.offset});
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
void check_resumable(const std::string& path, const checkpoint::Checkpoint& ckpt, const nn::Model& model,
                     int64_t steps, int global_batch) {
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
  // Momentum buffers for every parameter or for none (plain SGD, or no step yet).
  const bool has_momentum = ckpt.file.find(kMomentumPrefix + model.param_info().front().name) != nullptr;
  auto check_tensor = [&](const std::string& name, const nn::ParamInfo& p) {
    const auto* t = ckpt.file.find(name);
    DDP_CHECK(t, path, ": checkpoint has no tensor '", name, "'");
    DDP_CHECK(t->shape == p.shape && t->data.size() == p.numel, path, ": tensor '", name,
              "' has the wrong shape for model ", model.name());
  };
  for (const auto& p : model.param_info()) {
    check_tensor(p.name, p);
    if (has_momentum) check_tensor(kMomentumPrefix + p.name, p);
  }
}

void restore(const checkpoint::Checkpoint& ckpt, nn::Model& model, optim::Sgd& sgd) {
  for (const auto& p : model.param_info())
    std::memcpy(model.params() + p.offset, ckpt.file.find(p.name)->data.data(), p.numel * sizeof(float));
  const bool has_momentum = ckpt.file.find(kMomentumPrefix + model.param_info().front().name) != nullptr;
  if (has_momentum && !sgd.momentum_buffer().empty()) {
    for (const auto& p : model.param_info())
      std::memcpy(sgd.momentum_buffer().data() + p.offset, ckpt.file.find(kMomentumPrefix + p.name)->data.data(),
                  p.numel * sizeof(float));
    sgd.set_started(true);
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
