// Helpers for the nn tests: deterministic random tensors, central finite
// differences in double, convolution geometries.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "ddp/core/rng.hpp"
#include "ddp/nn/cpu/ops.hpp"  // cpu::ConvGeom

namespace ddp::nn::test {

inline cpu::ConvGeom conv_geom(int batch, int c, int h, int w, int oc, int k, int stride = 1, int pad = 0) {
  cpu::ConvGeom g;
  g.batch = batch;
  g.in_c = c;
  g.in_h = h;
  g.in_w = w;
  g.out_c = oc;
  g.k = k;
  g.stride = stride;
  g.pad = pad;
  return g;
}

inline std::vector<double> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed, 77);
  std::vector<double> v(n);
  for (double& x : v) x = scale * rng.normal();
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// d f / d v[i] for every i by central differences; f reads v.
inline std::vector<double> numeric_grad(std::vector<double>& v, const std::function<double()>& f,
                                        double h = 1e-5) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = f();
    v[i] = keep - h;
    const double down = f();
    v[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// Max |a - b| / (atol + |b|) style check, reported with the worst index.
inline double max_rel_err(const std::vector<double>& a, const std::vector<double>& b,
                          double atol = 1e-6, size_t* worst = nullptr) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double e = std::abs(a[i] - b[i]) / (atol + std::abs(b[i]));
    if (e > m) {
      m = e;
      if (worst) *worst = i;
    }
  }
  return m;
}

// Max |a - b| relative to max |b|: the right scale for float-vs-double checks,
// and for any two roundings of one result, where entries near zero carry the
// absolute rounding of their larger peers.
template <typename A>
double scaled_err(const std::vector<A>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return a.size() == b.size() ? diff / ref : 1e30;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ddp::nn::test
