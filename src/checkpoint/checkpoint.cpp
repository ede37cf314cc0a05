#include "ddp/checkpoint/checkpoint.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ddp/core/error.hpp"
#include "ddp/core/finite.hpp"

namespace ddp::checkpoint {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "ddp-checkpoint";
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".safetensors";

// Note [checkpoint contents]: the CRC covers the tensor bytes, then each
// metadata entry but the CRC itself as "key=value\n" in key order.
uint32_t payload_crc(const std::string& data, const std::map<std::string, std::string>& meta) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t off = 0; off < data.size(); off += (1u << 30)) {
    const size_t n = std::min(data.size() - off, size_t(1) << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + off), static_cast<uInt>(n));
  }
  for (const auto& [k, v] : meta) {
    if (k == "payload_crc32") continue;
    const std::string line = k + "=" + v + "\n";
    crc = crc32(crc, reinterpret_cast<const Bytef*>(line.data()), static_cast<uInt>(line.size()));
  }
  return static_cast<uint32_t>(crc);
}

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::map<std::string, std::string> state_metadata(const RunState& s) {
  std::map<std::string, std::string> m;
  m["format"] = kFormat;
  m["epoch"] = std::to_string(s.epoch);
  m["step_in_epoch"] = std::to_string(s.step_in_epoch);
  m["global_step"] = std::to_string(s.global_step);
  m["samples_consumed"] = std::to_string(s.samples_consumed);
  m["world_size"] = std::to_string(s.world_size);
  m["epoch_loss_sum"] = fmt_double(s.epoch_loss_sum);
  m["epoch_correct"] = fmt_double(s.epoch_correct);
  m["epoch_samples"] = fmt_double(s.epoch_samples);
  m["epoch_train_sec"] = fmt_double(s.epoch_train_sec);
  for (const auto& [k, v] : s.config) m["config." + k] = v;
  return m;
}

const std::string& field(const std::string& path, const std::map<std::string, std::string>& m,
                         const std::string& key) {
  const auto it = m.find(key);
  DDP_CHECK(it != m.end(), path, ": checkpoint metadata lacks '", key, "'");
  return it->second;
}

// Positions (epochs, steps, samples) beyond this are no run's: 2^50 leaves
// room to add and multiply without overflow.
constexpr int64_t kMaxPosition = int64_t(1) << 50;

int64_t int_field(const std::string& path, const std::map<std::string, std::string>& m, const std::string& key,
                  int64_t max) {
  const std::string& v = field(path, m, key);
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size() && x >= 0 && x <= max) return x;
  } catch (const std::exception&) {
  }
  DDP_FAIL(path, ": checkpoint metadata '", key, "' is not an integer from 0 to ", max, ": '", v, "'");
}

// A finite number >= 0 (sums and seconds).
double double_field(const std::string& path, const std::map<std::string, std::string>& m, const std::string& key) {
  const std::string& v = field(path, m, key);
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x) && x >= 0) return x;
  } catch (const std::exception&) {
  }
  DDP_FAIL(path, ": checkpoint metadata '", key, "' is not a finite number >= 0: '", v, "'");
}

// The global step in a name list_checkpoints accepted ("ckpt-<10 digits>...").
int64_t step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return std::stoll(name.substr(std::strlen(kPrefix), 10));
}

}  // namespace

std::string checkpoint_file_name(int64_t global_step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%010lld%s", kPrefix, static_cast<long long>(global_step), kSuffix);
  return buf;
}

std::string encode_checkpoint(const RunState& state, const std::vector<TensorView>& tensors, int version) {
  auto meta = state_metadata(state);
  meta["format_version"] = std::to_string(version);
  std::string payload;
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const char* p = t.ints ? reinterpret_cast<const char*>(t.ints) : reinterpret_cast<const char*>(t.data);
    payload.append(p, static_cast<size_t>(n) * element_size(t.dtype()));
  }
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", payload_crc(payload, meta));
  meta["payload_crc32"] = crc;
  return encode_safetensors(tensors, meta);
}

Checkpoint decode_checkpoint(const std::string& path, const std::string& bytes) {
  Checkpoint c;
  c.file = decode_safetensors(path, bytes);
  const auto& m = c.file.metadata;
  const auto fmt = m.find("format");
  DDP_CHECK(fmt != m.end() && fmt->second == kFormat, path, ": not a ddp checkpoint (metadata 'format' is ",
            fmt == m.end() ? std::string("missing") : "'" + fmt->second + "'", ")");
  const int64_t version = int_field(path, m, "format_version", INT32_MAX);
  DDP_CHECK(version <= kFormatVersion, path, ": checkpoint format version ", version,
            " is newer than this ddp_train understands (", kFormatVersion, "); use a newer ddp_train");
  DDP_CHECK(version >= 1, path, ": checkpoint format version ", version, " is not valid");
  // The CRC is over the tensor bytes as stored, in file order.
  std::string payload;
  for (const auto& t : c.file.tensors) payload.append(t.bytes(), t.byte_size());
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", payload_crc(payload, m));
  DDP_CHECK(field(path, m, "payload_crc32") == crc, path, ": checksum mismatch (stored ",
            field(path, m, "payload_crc32"), ", computed ", crc, "): the file is corrupt");
  // Each field within what a run can have written (the trainer checks them
  // against the run it resumes: Note [resume position] in train/resume.cpp).
  RunState& s = c.state;
  s.epoch = int_field(path, m, "epoch", kMaxPosition);
  s.step_in_epoch = int_field(path, m, "step_in_epoch", kMaxPosition);
  s.global_step = int_field(path, m, "global_step", kMaxPosition);
  s.samples_consumed = int_field(path, m, "samples_consumed", kMaxPosition);
  s.world_size = static_cast<int>(int_field(path, m, "world_size", INT32_MAX));
  DDP_CHECK(s.world_size >= 1, path, ": checkpoint metadata 'world_size' is 0; a run has at least one rank");
  s.epoch_loss_sum = double_field(path, m, "epoch_loss_sum");
  s.epoch_correct = double_field(path, m, "epoch_correct");
  s.epoch_samples = double_field(path, m, "epoch_samples");
  s.epoch_train_sec = double_field(path, m, "epoch_train_sec");
  // A training state with a non-finite number in it is no state to go on from.
  for (const auto& t : c.file.tensors) {
    const size_t bad = first_non_finite(t.data.data(), t.data.size());
    DDP_CHECK(bad == t.data.size(), path, ": tensor '", t.name, "' holds a NaN or an infinity (element ", bad,
              "): the run had diverged when this was written");
  }
  for (const auto& [k, v] : m)
    if (k.rfind("config.", 0) == 0) s.config[k.substr(7)] = v;
  return c;
}

std::string save_checkpoint(const std::string& dir, const RunState& state,
                            const std::vector<TensorView>& tensors, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DDP_CHECK(!ec, dir, ": cannot create the checkpoint directory (--checkpoint-dir): ", ec.message());
  const std::string path = (fs::path(dir) / checkpoint_file_name(state.global_step)).string();
  const std::string bytes = encode_checkpoint(state, tensors);
  try {
    write_file_atomic(path, bytes);
  } catch (const Error& e) {
    // A full disk or a quota: say where and how much room there is. The
    // write went to a temporary file that is gone again, and nothing older
    // was touched (rotation comes after a successful write).
    const fs::space_info room = fs::space(dir, ec);
    const auto mib = [](uintmax_t b) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f MiB", double(b) / double(1 << 20));
      return std::string(text);
    };
    DDP_FAIL("cannot write the checkpoint of global step ", state.global_step, " into ", dir,
             " (--checkpoint-dir): ", e.what(),
             ec ? std::string() : detail::concat("; ", dir, " has ", mib(room.available), " free of ", mib(room.capacity),
                                                 " and the checkpoint takes ", mib(bytes.size())),
             "; the checkpoints already there are untouched");
  }
  // Only once the new file is durable do older ones go, and with them any
  // temporary file a killed writer left behind. The newest `keep` up to this
  // step stay, this one first; files of later steps (a trajectory this run
  // left when it resumed from an earlier checkpoint) are not this run's to
  // rotate: it replaces each when it reaches its step. So rotation never
  // removes the checkpoint just written.
  size_t kept = 0;
  for (const auto& p : list_checkpoints(dir)) {
    if (step_of(p) > state.global_step) continue;
    if (++kept > static_cast<size_t>(std::max(keep, 1))) fs::remove(p, ec);
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name.find(std::string(kSuffix) + ".tmp.") != std::string::npos)
      fs::remove(e.path(), ec);
  }
  return path;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    if (!e.is_regular_file(type_ec)) continue;  // a directory named like a checkpoint is not one
    const std::string name = e.path().filename().string();
    const size_t pre = std::strlen(kPrefix), suf = std::strlen(kSuffix);
    if (name.size() == pre + 10 + suf && name.rfind(kPrefix, 0) == 0 &&
        name.compare(name.size() - suf, suf, kSuffix) == 0 &&
        std::all_of(name.begin() + pre, name.begin() + pre + 10, ::isdigit))
      out.push_back(e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in, path, ": cannot open: ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DDP_CHECK(!in.bad(), path, ": read failed");
  return bytes;
}

void check_compatible(const std::string& path, const std::map<std::string, std::string>& saved,
                      const std::map<std::string, std::string>& current) {
  auto check = [&](const std::string& k, const std::string& v) {
    const auto it = saved.find(k);
    const std::string was = it == saved.end() ? "(not recorded)" : it->second;
    DDP_CHECK(was == v, path, ": cannot resume: ", k, " differs: the checkpoint has ", was,
              ", this run has ", v);
  };
  // The model first: another model differs in everything derived from it,
  // and its name says more than a fingerprint; so does the optimizer, for
  // its settings.
  for (const char* first : {"model", "optimizer"})
    if (const auto m = current.find(first); m != current.end()) check(m->first, m->second);
  for (const auto& [k, v] : current) check(k, v);
  // Settings recorded only where they are not their default: one the
  // checkpoint has and this run does not is this run at its default.
  static const std::map<std::string, std::string> kDefaults = {{"precision", "fp32"}};
  for (const auto& [k, v] : kDefaults)
    if (saved.count(k) && !current.count(k)) check(k, v);
}

}  // namespace ddp::checkpoint
