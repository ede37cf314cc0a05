// ddp::train::Sums: what training steps and evaluation batches add up to on
// one rank, in one place. The backend counts the loss and the correct
// predictions where the logits are (a GPU's stay in device memory until they
// are taken), the replica adds what the host knows of each step, and the
// trainer takes them (Replica::take_sums), adds them into the epoch's and
// reduces those over the ranks.
#pragma once

namespace ddp::train {

struct Sums {
  // Training.
  double samples = 0;    // samples stepped over
  double loss = 0;       // their per-sample losses, summed
  double correct = 0;    // those whose arg-max was the label
  double comm_wait = 0;  // seconds the host waited for the gradients' all-reduces
  // The same on every rank, as the averaged gradients and the bucket plan are.
  double grad_norm = 0;        // the steps' gradient norms before clipping, summed (0 without clipping)
  double allreduces = 0;       // gradient all-reduces launched
  double allreduce_bytes = 0;  // and their bytes
  // --deterministic: steps computed again, their gradients having outgrown
  // their fixed-point exponents (deterministic/exact_sum.hpp).
  double redone_steps = 0;
  // Evaluation.
  double eval_samples = 0;
  double eval_correct = 0;

  Sums& operator+=(const Sums& o) {
    samples += o.samples;
    loss += o.loss;
    correct += o.correct;
    comm_wait += o.comm_wait;
    grad_norm += o.grad_norm;
    allreduces += o.allreduces;
    allreduce_bytes += o.allreduce_bytes;
    redone_steps += o.redone_steps;
    eval_samples += o.eval_samples;
    eval_correct += o.eval_correct;
    return *this;
  }
};

}  // namespace ddp::train
