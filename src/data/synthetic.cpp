// make_synthetic: ten stroke shapes drawn with jitter, for when no data is at
// hand.
//
// A class is recognisable only from spatial structure: every image is shifted,
// rotated, scaled, drawn with its own stroke width and contrast, and noised,
// so no single pixel gives the class away and a model has to use its
// convolutions, as on real images.
//
// Why large, bright, nearly centred shapes: with d2l's N(0, 0.01) weights a
// LeNet first sits at chance until its weights grow, and that plateau is
// shorter the more the class means differ. These shapes give class means
// about as distinct as Fashion-MNIST's (and a similar mean pixel, 0.28), so
// the plateau is no longer than on the real data, ~200-300 SGD steps at
// lr 0.2; after it the test accuracy passes 95%.
#include "ddp/data/dataset.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"

namespace ddp::data {
namespace {

constexpr int kSide = 28, kClasses = 10;
constexpr int kMaxSegs = 4;

struct Seg {
  float ax, ay, bx, by;
};

// A class: up to four line segments, or a ring, in a frame centred on the
// image with y pointing down, 16 units across (drawn 1.35-1.65 px a unit).
struct Shape {
  int nsegs;
  Seg segs[kMaxSegs];
  float ring_radius;  // > 0: a ring instead of segments
};

constexpr Shape kShapes[kClasses] = {
    {1, {{-8, 0, 8, 0}}, 0},                                                   // -
    {1, {{0, -8, 0, 8}}, 0},                                                   // |
    {1, {{-6, 6, 6, -6}}, 0},                                                  // /
    {1, {{-6, -6, 6, 6}}, 0},                                                  // backslash
    {2, {{-7, 0, 7, 0}, {0, -7, 0, 7}}, 0},                                    // +
    {2, {{-6, -6, 6, 6}, {-6, 6, 6, -6}}, 0},                                  // x
    {4, {{-6, -6, 6, -6}, {6, -6, 6, 6}, {6, 6, -6, 6}, {-6, 6, -6, -6}}, 0},  // square
    {0, {}, 6.5f},                                                             // ring
    {2, {{-7, -4, 7, -4}, {-7, 4, 7, 4}}, 0},                                  // =
    {2, {{-7, 5, 0, -6}, {0, -6, 7, 5}}, 0},                                   // ^
};

float uniform(Rng& rng, float lo, float hi) { return lo + (hi - lo) * rng.uniform(); }

// Note [same bytes everywhere]: the dataset must come out bit for bit the
// same in every build type and on every CPU, because resuming checks it by
// CRC. So this file uses IEEE arithmetic only: no libm (whose cos and sin may
// take another code path on another CPU) and no contraction of a * b + c into
// one fused multiply-add (CMakeLists.txt compiles it with -ffp-contract=off,
// which optimised builds would otherwise do and debug builds not).
// cos and sin of |a| <= 0.2 by their Taylor series to a^10 (error < 1e-14),
// in double, rounded once.
float small_angle_cos(float a) {
  const double x = a, x2 = x * x;
  return float(1.0 - x2 / 2.0 * (1.0 - x2 / 12.0 * (1.0 - x2 / 30.0 * (1.0 - x2 / 56.0 * (1.0 - x2 / 90.0)))));
}
float small_angle_sin(float a) {
  const double x = a, x2 = x * x;
  return float(x * (1.0 - x2 / 6.0 * (1.0 - x2 / 20.0 * (1.0 - x2 / 42.0 * (1.0 - x2 / 72.0)))));
}

// Squared distance from (px, py) to the segment a + t (b - a), t in [0, 1].
float seg_dist2(float px, float py, float ax, float ay, float dx, float dy, float inv_len2) {
  const float qx = px - ax, qy = py - ay;
  const float t = std::clamp((qx * dx + qy * dy) * inv_len2, 0.0f, 1.0f);
  const float ex = qx - t * dx, ey = qy - t * dy;
  return ex * ex + ey * ey;
}

// One 28x28 image of class c into out, every random choice drawn from rng.
void draw(int c, Rng& rng, float* out) {
  const float angle = uniform(rng, -0.17f, 0.17f);  // +-10 degrees
  const float scale = uniform(rng, 1.35f, 1.65f);
  const float cx = 13.5f + uniform(rng, -1.5f, 1.5f);
  const float cy = 13.5f + uniform(rng, -1.5f, 1.5f);
  const float half_width = uniform(rng, 2.2f, 3.2f);
  const float amp = uniform(rng, 0.8f, 1.0f);
  const float noise = uniform(rng, 0.0f, 0.1f);

  const float cs = small_angle_cos(angle) * scale, sn = small_angle_sin(angle) * scale;
  const Shape& shape = kShapes[c];
  // Segments in pixel coordinates, as origin, direction and 1 / length^2.
  float ax[kMaxSegs], ay[kMaxSegs], dx[kMaxSegs], dy[kMaxSegs], il[kMaxSegs];
  for (int s = 0; s < shape.nsegs; ++s) {
    const Seg& g = shape.segs[s];
    ax[s] = cx + cs * g.ax - sn * g.ay;
    ay[s] = cy + sn * g.ax + cs * g.ay;
    const float bx = cx + cs * g.bx - sn * g.by, by = cy + sn * g.bx + cs * g.by;
    dx[s] = bx - ax[s];
    dy[s] = by - ay[s];
    il[s] = 1.0f / (dx[s] * dx[s] + dy[s] * dy[s]);
  }
  const float radius = shape.ring_radius * scale;
  const float radius2 = radius * radius, inv_2r = radius > 0 ? 0.5f / radius : 0.0f;
  // A pixel is lit within half_width of a stroke, with a one-pixel ramp so
  // sub-pixel shifts change the image smoothly: full at distance reach - 1,
  // dark at reach, the ramp taken in squared distance (no sqrt).
  const float reach = half_width + 0.5f, reach2 = reach * reach;
  const float inv_ramp = 1.0f / (2.0f * reach - 1.0f);

  // Row at a time, each loop simple enough for the compiler to vectorise:
  // 60000 images take well under a second.
  float d2[kSide], xs[kSide];
  uint16_t noise_bits[kSide];
  static_assert(kSide % 4 == 0, "four 16-bit noise draws per 64-bit word");
  for (int x = 0; x < kSide; ++x) xs[x] = float(x);
  for (int y = 0; y < kSide; ++y) {
    const float py = float(y);
    if (shape.nsegs == 0) {
      // Distance to the circle, |p - c| - r, to first order: no sqrt, which
      // would keep these loops from vectorising (errno).
      for (int x = 0; x < kSide; ++x) {
        const float r = ((xs[x] - cx) * (xs[x] - cx) + (py - cy) * (py - cy) - radius2) * inv_2r;
        d2[x] = r * r;
      }
    } else {
      for (int x = 0; x < kSide; ++x) d2[x] = 1e30f;
    }
    for (int s = 0; s < shape.nsegs; ++s) {
      for (int x = 0; x < kSide; ++x)
        d2[x] = std::min(d2[x], seg_dist2(xs[x], py, ax[s], ay[s], dx[s], dy[s], il[s]));
    }
    for (int k = 0; k < kSide; k += 4) {
      const uint64_t bits = rng.next_u64();
      for (int j = 0; j < 4; ++j) noise_bits[k + j] = uint16_t(bits >> (16 * j));
    }
    float* row = out + y * kSide;
    for (int x = 0; x < kSide; ++x) {
      const float lit = amp * std::clamp((reach2 - d2[x]) * inv_ramp, 0.0f, 1.0f);
      const float u = float(noise_bits[x]) * (1.0f / 65536.0f);
      row[x] = std::clamp(lit + noise * (2.0f * u - 1.0f), 0.0f, 1.0f);
    }
  }
}

// n images with labels 0..9 equally often (up to one) in a shuffled order;
// `stream` keeps train and test draws apart.
Dataset generate(int64_t n, uint64_t seed, uint64_t stream, const char* split) {
  Dataset d;
  d.n = n;
  d.c = 1;
  d.h = d.w = kSide;
  d.classes = kClasses;
  d.source = detail::concat("synthetic ", split, " (n = ", n, ", seed = ", seed, ")");
  d.images.resize(static_cast<size_t>(n * d.sample_numel()));
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d.labels[i] = static_cast<int32_t>(i % kClasses);
  Rng order(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(d.labels[i], d.labels[static_cast<int64_t>(order.below(uint64_t(i) + 1))]);
  }
  // One generator per image, keyed by its index: an image does not depend on
  // how many came before it.
  const uint64_t key = order.next_u64();
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(key, static_cast<uint64_t>(i));
    draw(d.labels[i], rng, d.images.data() + i * d.sample_numel());
  }
  return d;
}

}  // namespace

Split make_synthetic(int64_t n, uint64_t seed) {
  DDP_CHECK(n >= 1, "synthetic dataset: size ", n, " must be at least 1");
  Split s;
  s.train = generate(n, seed, 1, "train");
  s.test = generate(std::max<int64_t>(1, n / 5), seed, 2, "test");
  return s;
}

}  // namespace ddp::data
