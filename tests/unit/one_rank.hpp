// A world of one rank, without MPI, for the ddp/ unit tests: every
// collective leaves the data as it is (the sum or maximum over one rank), and
// all-reduces come back done. Tests that watch the launches override
// allreduce_async.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"

namespace ddp::test {

// A Work that is done from the start and counts its waits.
class DoneWork : public comm::Work {
 public:
  void wait() override { ++waits; }
  bool done() override { return true; }
  int waits = 0;
};

class OneRank : public comm::Communicator {
 public:
  const char* backend() const override { return "one rank"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<comm::Work> allreduce_async(float*, size_t, comm::ReduceOp, std::string) override {
    return std::make_shared<DoneWork>();
  }
  void broadcast(void*, size_t, int, const std::string&) override {}
  void barrier(const std::string&) override {}
  std::vector<char> allgather(const void* mine, size_t bytes, const std::string&) override {
    const char* p = static_cast<const char*>(mine);
    return std::vector<char>(p, p + bytes);
  }
  void allreduce_doubles(double*, size_t, bool, const std::string&) override {}
  void allreduce_int64(int64_t*, size_t, const std::string&) override {}
};

}  // namespace ddp::test
