// TensorBoard event files: scalars that `tensorboard --logdir DIR` plots.
// The file is TFRecord-framed (tfrecord.hpp) tensorflow.Event messages
// (src/observe/proto), the first one saying file_version "brain.Event:2", as
// TensorFlow's own writers make it. Not thread-safe: one thread writes.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::observe {

class TensorBoardWriter {
 public:
  // Creates dir (and its parents) when missing and a new events file in it,
  // events.out.tfevents.<unix seconds>.<hostname>.<pid>, with ".<n>" appended
  // when another writer took that name. Throws ddp::Error naming dir or file.
  explicit TensorBoardWriter(const std::string& dir);
  // Writes what is still buffered; a failure here is lost (a destructor must
  // not throw), so call flush() where errors should be seen.
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One point of the plot `tag` (non-empty UTF-8, else ddp::Error) at `step`,
  // stored as a float (TensorBoard's simple_value). Wall time: now, or seconds
  // since the Unix epoch. Records are buffered; a full buffer is written at
  // once, and a failed write throws ddp::Error naming the file.
  void scalar(const std::string& tag, int64_t step, double value);
  void scalar(const std::string& tag, int64_t step, double value, double wall_time);

  // Writes the buffer and syncs it to storage: a reader sees every scalar
  // given so far, and a full disk or a lost file server is reported here
  // (ddp::Error naming the file) rather than never.
  void flush();

  const std::string& path() const { return path_; }  // the events file

 private:
  void write_buffer();

  std::string path_;
  int fd_ = -1;
  std::string buffer_;  // framed records not yet written
};

}  // namespace ddp::observe
