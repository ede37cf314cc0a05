// --deterministic's fixed-point gradient sum: Note [fixed-point gradients]
// in exact_sum.hpp.
#include "ddp/deterministic/exact_sum.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ddp/core/abandon.hpp"  // abandon: buffers an in-flight collective may write
#include "ddp/core/error.hpp"
#include "ddp/core/fixed_point.hpp"  // to_fixed, from_fixed: the GPU's arithmetic too
#include "ddp/deterministic/shards.hpp"  // sum_in_shard_order

namespace ddp {

int fixed_point_limit_bits(int shards) {
  DDP_CHECK(shards >= 1, "fixed point: need at least one micro-shard, got ", shards);
  int bits = 0;
  while ((int64_t(1) << bits) < shards) ++bits;
  return 62 - bits;
}

int fixed_point_exponent(double max_abs, int limit_bits) {
  DDP_CHECK(max_abs > 0 && std::isfinite(max_abs), "fixed point: no exponent for a largest element of ", max_abs);
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs < 2^e
  return std::clamp(limit_bits - kHeadroomBits - e, -kMaxExponent, kMaxExponent);
}

void dequantize(const int64_t* acc, size_t n, int exponent, float* g) {
  const double inv_scale = std::ldexp(1.0, -exponent);
  for (size_t i = 0; i < n; ++i) g[i] = fixed_point::from_fixed(acc[i], inv_scale);
}

void sum_shards_in_order(comm::Communicator& comm, const double* per_shard, int shards, size_t n, double* out,
                         const std::string& what) {
  DDP_CHECK(shards > 0 && n > 0, what, ": ", shards, " micro-shards of ", n, " values");
  const std::vector<char> all = comm.allgather(per_shard, size_t(shards) * n * sizeof(double), what);
  const size_t total = all.size() / (n * sizeof(double));
  std::vector<double> v(total * n);
  std::memcpy(v.data(), all.data(), v.size() * sizeof(double));
  deterministic::sum_in_shard_order(v.data(), total, n, out);
}

ExactGradientSum::ExactGradientSum(std::vector<size_t> param_numels, int shards)
    : numels_(std::move(param_numels)), limit_bits_(fixed_point_limit_bits(shards)) {
  for (size_t n : numels_) {
    offsets_.push_back(total_);
    total_ += n;
  }
  // Before any step: gradients below 2^kHeadroomBits in magnitude (a redo
  // otherwise).
  exponents_.assign(numels_.size(), limit_bits_ - kHeadroomBits);
  started_.assign(numels_.size(), 0);
}

void ExactGradientSum::set_exponents(const std::vector<int64_t>& e) {
  DDP_CHECK(e.size() == numels_.size(), "--deterministic: ", e.size(), " gradient exponents for ", numels_.size(),
            " parameters");
  for (int64_t x : e)
    DDP_CHECK(x >= -kMaxExponent && x <= kMaxExponent, "--deterministic: gradient exponent ", x, " is outside [",
              -kMaxExponent, ", ", kMaxExponent, "]");
  exponents_ = e;
}

void ExactGradientSum::check_params(size_t first, size_t count) const {
  DDP_CHECK(first + count <= numels_.size(), "--deterministic: parameters ", first, " .. ", first + count, " of ",
            numels_.size());
}

void ExactGradientSum::check_add(int lane, int lanes, size_t first, size_t count) const {
  DDP_CHECK(lane >= 0 && lane < lanes && first + count <= numels_.size(), "--deterministic: lane ", lane, " of ",
            lanes, " adds parameters ", first, " .. ", first + count, " of ", numels_.size());
}

void ExactGradientSum::ready(comm::Communicator& comm, size_t first, size_t count) {
  check_params(first, count);
  if (count > 0) start_reduce(comm, first, count);
}

void ExactGradientSum::start_reduce(comm::Communicator& comm, size_t first, size_t count) {
  for (size_t p = first; p < first + count; ++p)
    DDP_CHECK(!started_[p], "--deterministic: the sums of parameter ", p, " started twice in one step");
  std::fill(started_.begin() + long(first), started_.begin() + long(first + count), 1);
  const size_t base = offsets_[first], span = offsets_[first + count - 1] + numels_[first + count - 1] - base;
  if (span == 0) return;
  inflight_.push_back(comm.allreduce_int64_async(
      sums() + base, span,
      detail::concat("--deterministic: fixed-point gradient sums of parameters ", first, " .. ", first + count - 1)));
}

void ExactGradientSum::reduce_all(comm::Communicator& comm) {
  for (size_t p = 0; p < numels_.size();) {
    if (started_[p]) {
      ++p;
      continue;
    }
    size_t end = p;
    while (end < numels_.size() && !started_[end]) ++end;
    start_reduce(comm, p, end - p);
    p = end;
  }
  drop_reduces();  // every sum is in sums() now
}

void ExactGradientSum::drop_reduces() {
  // Waited in the order started (each wait throws on a failure or a
  // timeout, naming the sums).
  for (auto& w : inflight_) w->wait();
  inflight_.clear();
  std::fill(started_.begin(), started_.end(), 0);
}

bool ExactGradientSum::in_flight() const noexcept {
  // A sum whose communicator failed (a wait in drop_reduces threw and left
  // it listed) counts as in flight.
  for (const auto& w : inflight_)
    if (!comm::done_nothrow(*w)) return true;
  return false;
}

HostExactGradientSum::HostExactGradientSum(std::vector<size_t> param_numels, int shards)
    : ExactGradientSum(std::move(param_numels), shards) {
  acc_.assign(total_, 0);
  max_.assign(numels_.size(), 0.0);
}

HostExactGradientSum::~HostExactGradientSum() {
  // An error left sums in flight: the communicator writes into acc_ whenever
  // MPI moves them (Note [abandoned requests], mpi_communicator.cpp), so its
  // memory outlives this object, on purpose, for the little that is left of
  // the job.
  if (in_flight()) abandon(std::move(acc_));
}

void HostExactGradientSum::clear_sums() {
  drop_reduces();  // nothing may write into acc_ from here on
  std::fill(acc_.begin(), acc_.end(), 0);
  std::fill(max_.begin(), max_.end(), 0.0);
  for (size_t l = 0; l < lane_acc_.size(); ++l) {  // what an interrupted step left
    std::fill(lane_acc_[l].begin(), lane_acc_[l].end(), 0);
    std::fill(lane_max_[l].begin(), lane_max_[l].end(), 0.0);
    lane_added_[l] = 0;
  }
}

void HostExactGradientSum::set_lanes(int lanes) {
  DDP_CHECK(lanes >= 1, "--deterministic: ", lanes, " lanes");
  lane_acc_.assign(size_t(lanes - 1), {});
  lane_max_.assign(size_t(lanes - 1), std::vector<double>(numels_.size(), 0.0));
  lane_added_.assign(size_t(lanes - 1), 0);
}

void HostExactGradientSum::add(int lane, const float* g, size_t first, size_t count) {
  check_add(lane, lanes(), first, count);
  if (count == 0) return;
  std::vector<fixed_point::Sink> to(count);
  sinks(lane, first, count, to.data());
  const size_t base = offsets_[first];
  for (size_t p = first; p < first + count; ++p) quantize_add(g + (offsets_[p] - base), numels_[p], to[p - first]);
}

bool HostExactGradientSum::sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) {
  check_add(lane, lanes(), first, count);
  if (count == 0) return true;
  const size_t base = offsets_[first];
  int64_t* acc = acc_.data() + base;
  double* max = max_.data();
  if (lane > 0) {
    std::vector<int64_t>& mine = lane_acc_[size_t(lane - 1)];
    const size_t span = offsets_[first + count - 1] + numels_[first + count - 1] - base;
    if (mine.size() < span) mine.resize(span, 0);  // this lane's own: no other thread touches it
    acc = mine.data();
    max = lane_max_[size_t(lane - 1)].data();
    lane_added_[size_t(lane - 1)] = 1;
  }
  for (size_t p = first; p < first + count; ++p)
    out[p - first] = {acc + (offsets_[p] - base), int(exponents_[p]), limit_bits_, max + p};
  return true;
}

void HostExactGradientSum::fold(size_t first, size_t count) {
  check_params(first, count);
  if (count == 0) return;
  const size_t base = offsets_[first], span = offsets_[first + count - 1] + numels_[first + count - 1] - base;
  for (size_t l = 0; l < lane_acc_.size(); ++l) {
    if (!lane_added_[l]) continue;
    int64_t* mine = lane_acc_[l].data();
    for (size_t i = 0; i < span; ++i) {
      acc_[base + i] += mine[i];
      mine[i] = 0;
    }
    for (size_t p = first; p < first + count; ++p) {
      max_[p] = std::max(max_[p], lane_max_[l][p]);
      lane_max_[l][p] = 0.0;
    }
    lane_added_[l] = 0;
  }
}

void HostExactGradientSum::local_maxima(double* out) { std::copy(max_.begin(), max_.end(), out); }

void HostExactGradientSum::dequantize_into(float* grads) {
  for (size_t p = 0; p < numels_.size(); ++p)
    dequantize(acc_.data() + offsets_[p], numels_[p], int(exponents_[p]), grads + offsets_[p]);
}

void HostExactGradientSum::fill_nan(float* grads) {
  std::fill(grads, grads + total_, std::numeric_limits<float>::quiet_NaN());
}

ExactGradientSum::Result ExactGradientSum::finish(comm::Communicator& comm, float* grads) {
  // The maxima first (small): from them every rank decides alike whether the
  // sums are usable.
  std::vector<double> max(numels_.size(), 0.0);
  local_maxima(max.data());
  comm.allreduce_doubles(max.data(), max.size(), /*max=*/true, "--deterministic: largest gradient per parameter");
  bool finite = true, fits = true;
  for (size_t p = 0; p < numels_.size(); ++p) {
    finite &= std::isfinite(max[p]);
    fits &= max[p] < std::ldexp(1.0, limit_bits_ - int(exponents_[p]));
  }
  if (!finite) {
    drop_reduces();
    fill_nan(grads);
    return Result::NonFinite;
  }
  auto next_exponents = [&] {
    for (size_t p = 0; p < numels_.size(); ++p)
      if (max[p] > 0) exponents_[p] = fixed_point_exponent(max[p], limit_bits_);
  };
  if (!fits) {
    drop_reduces();
    next_exponents();
    return Result::Redo;
  }
  reduce_all(comm);
  dequantize_into(grads);  // with this step's exponents
  next_exponents();
  return Result::Done;
}

}  // namespace ddp
