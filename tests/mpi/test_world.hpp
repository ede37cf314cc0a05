// What the MPI tests of this area share: a World over MPI_COMM_WORLD (the test
// main has initialised MPI) and data that differs on every rank.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>

#include <string>

#include "ddp/runtime/world.hpp"

namespace ddp::test {

inline World test_world(MPI_Comm comm = MPI_COMM_WORLD) {
  World w;
  w.comm = comm;
  MPI_Comm_rank(comm, &w.rank);
  MPI_Comm_size(comm, &w.size);
  return w;
}

// Small integers, so sums over ranks are exact in float.
inline float rank_value(int rank, size_t i) { return float((rank + 1) * int(i % 13) - rank); }

inline float sum_over_ranks(int size, size_t i) {
  float s = 0;
  for (int r = 0; r < size; ++r) s += rank_value(r, i);
  return s;
}

inline void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in: " << text;
}

// Rank 0 gives up first; the others start only after it has (this MPI_Barrier
// on the world is where they wait, and where rank 0's MPI progresses its
// abandoned request once they do join).
inline void others_join_late(const std::function<void()>& join) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != 0) join();
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace ddp::test
