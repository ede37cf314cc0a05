// Fuzz target "checkpoint": the bytes are a checkpoint file, validated by
// decode_checkpoint (what --resume does with a file's bytes, before the
// trainer compares it with its own run: check_compatible, here against the
// checkpoint's own configuration).
//
// Mutated bytes rarely keep the CRC right, so the validation behind it would
// go unexercised: each input that is a well-formed safetensors file is
// decoded a second time with its payload_crc32 made right (Note [checkpoint
// contents]). A checkpoint accepted either way must round-trip: written again
// from its run state and tensors, it reads back as the same state.
// Seeds: checkpoints written by a short ddp_train run, cut short and with
// their tensors shrunk (scripts/fuzz.sh).
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace ddp::checkpoint;
using ddp::fuzz::finding;

const std::string kPath = "ckpt-0000000001.safetensors";

std::vector<TensorView> views_of(const SafetensorsFile& f) {
  // TensorView tells I64 by a non-null pointer, also for no elements.
  static const int64_t no_ints = 0;
  std::vector<TensorView> views;
  for (const auto& t : f.tensors)
    views.push_back({t.name, t.shape, t.dtype == Dtype::F32 ? t.data.data() : nullptr,
                     t.dtype == Dtype::I64 ? (t.ints.empty() ? &no_ints : t.ints.data()) : nullptr});
  return views;
}

// Note [checkpoint contents]: the tensor bytes in file order, then every
// metadata entry but the CRC as "key=value\n", in key order.
std::string payload_crc(const SafetensorsFile& f) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& t : f.tensors)
    crc = crc32(crc, reinterpret_cast<const Bytef*>(t.bytes()), static_cast<uInt>(t.byte_size()));
  for (const auto& [k, v] : f.metadata) {
    if (k == "payload_crc32") continue;
    const std::string line = k + "=" + v + "\n";
    crc = crc32(crc, reinterpret_cast<const Bytef*>(line.data()), static_cast<uInt>(line.size()));
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08lx", crc);
  return buf;
}

bool same_state(const RunState& a, const RunState& b) {
  return a.epoch == b.epoch && a.step_in_epoch == b.step_in_epoch && a.global_step == b.global_step &&
         a.samples_consumed == b.samples_consumed && a.world_size == b.world_size &&
         a.epoch_loss_sum == b.epoch_loss_sum && a.epoch_correct == b.epoch_correct &&
         a.epoch_samples == b.epoch_samples && a.epoch_train_sec == b.epoch_train_sec && a.config == b.config;
}

void check_accepted(const Checkpoint& c) {
  const RunState& s = c.state;
  if (s.epoch < 0 || s.step_in_epoch < 0 || s.global_step < 0 || s.samples_consumed < 0 || s.world_size < 1)
    finding("a checkpoint accepted with a negative position or no ranks");
  ddp::fuzz::read_or_error({kPath}, [&] { check_compatible(kPath, s.config, s.config); });
  try {
    const Checkpoint d = decode_checkpoint(kPath, encode_checkpoint(s, views_of(c.file)));
    if (!same_state(s, d.state)) finding("the checkpoint written from what was read reads back differently");
  } catch (const ddp::Error& e) {
    finding(std::string("the checkpoint written from what was read is refused: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Checkpoint c;
  if (ddp::fuzz::read_or_error({kPath}, [&] { c = decode_checkpoint(kPath, bytes); })) check_accepted(c);
  // The same file with its CRC made right, written the way the writer does.
  SafetensorsFile f;
  if (!ddp::fuzz::read_or_error({kPath}, [&] { f = decode_safetensors(kPath, bytes); })) return 0;
  if (f.metadata.count("payload_crc32") == 0) return 0;
  f.metadata["payload_crc32"] = payload_crc(f);
  const std::string fixed = encode_safetensors(views_of(f), f.metadata);
  if (ddp::fuzz::read_or_error({kPath}, [&] { c = decode_checkpoint(kPath, fixed); })) check_accepted(c);
  return 0;
}
