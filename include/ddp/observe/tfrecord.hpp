// TFRecord framing, the container of TensorBoard's event files: each record is
// its length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the
// data, and the masked CRC-32C of the data (CRCs as uint32, little-endian).
#pragma once

#include <string>

namespace ddp::observe {

// Appends one framed record holding `data` to `out`.
void append_tfrecord(std::string& out, const std::string& data);

}  // namespace ddp::observe
