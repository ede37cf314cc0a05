// The model-level loss and accuracy the trainer calls (float, CPU).
#include "ddp/core/error.hpp"
#include "ddp/nn/cpu_ops.hpp"
#include "ddp/nn/model.hpp"

namespace ddp::nn {

float softmax_cross_entropy(const float* logits, const int32_t* labels, int batch, int classes,
                            float* dlogits) {
  return cpu::softmax_cross_entropy<float>(logits, labels, batch, classes, dlogits);
}

int64_t count_correct(const float* logits, const int32_t* labels, int batch, int classes) {
  DDP_CHECK(classes > 0, "count_correct: classes must be positive, got ", classes);
  int64_t correct = 0;
  for (int r = 0; r < batch; ++r) {
    const float* z = logits + int64_t(r) * classes;
    // First maximum wins ties, as torch.argmax does.
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace ddp::nn
