// ddp::Scoped: a variable set to a value for the length of a scope, and put
// back however the scope is left.
#pragma once

namespace ddp {

template <typename T>
class Scoped {
 public:
  Scoped(T& var, T value) : var_(var), saved_(var) { var_ = value; }
  ~Scoped() { var_ = saved_; }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  T& var_;
  T saved_;
};

}  // namespace ddp
