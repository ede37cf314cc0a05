// What every backend shares: the words for a wire format, all-reduces that
// travel in 16 bits refused where a backend has none, and the integer
// all-reduce as work done at once where a backend has no asynchronous one.
#include "ddp/comm/communicator.hpp"

#include <cstdint>

#include "ddp/core/error.hpp"

namespace ddp::comm {

const char* wire_name(Wire w) {
  switch (w) {
    case Wire::F16: return "fp16";
    case Wire::BF16: return "bf16";
    default: return "none";
  }
}

size_t wire_bytes(Wire w) { return w == Wire::F32 ? sizeof(float) : sizeof(uint16_t); }

std::string allreduce_label(const std::string& what, size_t count, Wire w) {
  if (w == Wire::F32) return detail::concat(what, " (", format_bytes(count * wire_bytes(w)), ")");
  return detail::concat(what, " (", format_bytes(count * wire_bytes(w)), " as ", wire_name(w), ")");
}

std::shared_ptr<Work> Communicator::allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                               std::string what) {
  if (wire == Wire::F32) return allreduce_async(data, count, op, std::move(what));
  DDP_FAIL(what, ": --grad-compression ", wire_name(wire), " is not available on the ", backend(), " backend");
}

std::shared_ptr<Work> Communicator::allreduce_int64_async(int64_t* data, size_t count, std::string what) {
  allreduce_int64(data, count, what);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> Communicator::allreduce_doubles_async(double* data, size_t count, std::string what) {
  allreduce_doubles(data, count, /*max=*/false, what);
  return std::make_shared<DoneWork>();
}

}  // namespace ddp::comm
