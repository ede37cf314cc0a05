// ddp::Error and the checks that raise it. Inside the library every failure is
// an exception with context; main turns it into the one-line contract
// "ddp_train: error: <what> (rank R)" and ends the whole job.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An error every rank raises alike, at the same point (from what they all
// know, or agreed on by a collective), so rank 0 alone reports it.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// An error in what the user asked for (flags, their combination with the world
// size). It depends only on the command line and the world size, so every rank
// raises the same one and rank 0 alone reports it.
class UsageError : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ddp

// DDP_CHECK(cond, parts...): throw ddp::Error built from parts when cond fails.
#define DDP_CHECK(cond, ...)                                        \
  do {                                                              \
    if (!(cond)) throw ::ddp::Error(::ddp::detail::concat(__VA_ARGS__)); \
  } while (0)

#define DDP_FAIL(...) throw ::ddp::Error(::ddp::detail::concat(__VA_ARGS__))
