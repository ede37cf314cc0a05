// Softmax cross-entropy on the CPU, shifted by each row's max so exp never
// overflows, summed in double so a large batch's mean keeps its digits.
#include <algorithm>
#include <cmath>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/model.hpp"  // softmax_cross_entropy, count_correct: the host's, here

namespace ddp::nn::cpu {

template <typename T>
T softmax_cross_entropy(const T* logits, const int32_t* labels, int batch, int classes,
                        T* dlogits, int grad_batch) {
  DDP_CHECK(classes > 0, "softmax_cross_entropy: classes must be positive, got ", classes);
  DDP_CHECK(batch > 0, "softmax_cross_entropy: empty batch");
  double total = 0;
  const double inv_batch = 1.0 / batch;
  const double inv_grad = 1.0 / (grad_batch > 0 ? grad_batch : batch);
  for (int r = 0; r < batch; ++r) {
    const int32_t label = labels[r];
    DDP_CHECK(label >= 0 && label < classes, "softmax_cross_entropy: label ", label, " of row ", r,
              " outside [0, ", classes, ")");
    const T* z = logits + int64_t(r) * classes;
    const double m = double(*std::max_element(z, z + classes));
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(double(z[c]) - m);
    const double log_sum = std::log(sum);
    total += log_sum - (double(z[label]) - m);
    if (dlogits) {
      T* d = dlogits + int64_t(r) * classes;
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(double(z[c]) - m - log_sum);
        d[c] = T((p - (c == label ? 1.0 : 0.0)) * inv_grad);
      }
    }
  }
  return T(total * inv_batch);
}

template float softmax_cross_entropy<float>(const float*, const int32_t*, int, int, float*, int);
template double softmax_cross_entropy<double>(const double*, const int32_t*, int, int, double*, int);

}  // namespace ddp::nn::cpu

namespace ddp::nn {

// model.hpp's host versions.
float softmax_cross_entropy(const float* logits, const int32_t* labels, int batch, int classes, float* dlogits,
                            int grad_batch) {
  return cpu::softmax_cross_entropy<float>(logits, labels, batch, classes, dlogits, grad_batch);
}

int64_t count_correct(const float* logits, const int32_t* labels, int batch, int classes) {
  DDP_CHECK(classes > 0, "count_correct: classes must be positive, got ", classes);
  int64_t correct = 0;
  for (int r = 0; r < batch; ++r) {
    const float* z = logits + int64_t(r) * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace ddp::nn
