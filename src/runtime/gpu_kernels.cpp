// GpuKernels (runtime/gpu_kernels.hpp): --gpu-kernels, read and described.
#include "ddp/runtime/gpu_kernels.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"

namespace ddp {

const std::vector<NextKernel>& next_kernels() {
  static const std::vector<NextKernel> all = {
      NextKernel::BnSplitSums,    NextKernel::GraphConv,      NextKernel::ConvBiasSums,  NextKernel::BnAct,
      NextKernel::ConvBn,         NextKernel::BiasInBn,       NextKernel::SyncBnOnDevice, NextKernel::OneRank,
      NextKernel::LossScaleOnDevice, NextKernel::ShardSums,   NextKernel::ShardsTogether, NextKernel::CheckedRuns,
      NextKernel::ShardStreams,   NextKernel::StepGraphs,     NextKernel::WarpRunSums};
  return all;
}

const char* name_of(NextKernel k) {
  switch (k) {
    case NextKernel::BnSplitSums: return "bn-split-sums";
    case NextKernel::GraphConv: return "graph-conv";
    case NextKernel::ConvBiasSums: return "conv-bias-sums";
    case NextKernel::BnAct: return "bn-act";
    case NextKernel::ConvBn: return "conv-bn";
    case NextKernel::BiasInBn: return "bias-in-bn";
    case NextKernel::SyncBnOnDevice: return "sync-bn-on-device";
    case NextKernel::OneRank: return "one-rank";
    case NextKernel::LossScaleOnDevice: return "loss-scale-on-device";
    case NextKernel::ShardSums: return "shard-sums";
    case NextKernel::ShardsTogether: return "shards-together";
    case NextKernel::CheckedRuns: return "checked-runs";
    case NextKernel::ShardStreams: return "shard-streams";
    case NextKernel::StepGraphs: return "step-graphs";
    case NextKernel::WarpRunSums: return "warp-run-sums";
  }
  return "?";
}

GpuKernels GpuKernels::proven() {
  return next().without(NextKernel::StepGraphs);
}

GpuKernels GpuKernels::next() {
  GpuKernels g;
  for (NextKernel k : next_kernels()) g.on_ |= 1u << unsigned(k);
  return g;
}

GpuKernels GpuKernels::without(NextKernel k) const {
  GpuKernels g = *this;
  g.on_ &= ~(1u << unsigned(k));
  return g;
}

namespace {

std::string piece_names() {
  std::string all;
  for (NextKernel k : next_kernels()) all += std::string(all.empty() ? "" : ", ") + name_of(k);
  return all;
}

}  // namespace

GpuKernels GpuKernels::parse(const std::string& spec) {
  if (spec == "reference") return reference();
  const std::string head = spec.substr(0, spec.find(','));
  DDP_CHECK(head == "next" || head == "proven",
            "--gpu-kernels must be proven, next, reference, or proven,-NAME,... or next,-NAME,... to leave kernels "
            "out (docs/gpus.md), got '",
            spec, "'");
  GpuKernels g = head == "next" ? next() : proven();
  for (size_t at = head.size(); at < spec.size();) {
    const size_t end = std::min(spec.find(',', at + 1), spec.size());
    const std::string item = spec.substr(at + 1, end - at - 1);
    const auto piece = std::find_if(next_kernels().begin(), next_kernels().end(),
                                    [&](NextKernel k) { return item == std::string("-") + name_of(k); });
    DDP_CHECK(piece != next_kernels().end(), "--gpu-kernels ", spec, ": '", item,
              "' is not -NAME of a kernel of next (", piece_names(), ")");
    DDP_CHECK(head == "next" || proven().on(*piece), "--gpu-kernels ", spec, ": ", name_of(*piece),
              " is not one of proven's kernels (next,", item, " is next without it)");
    g = g.without(*piece);
    at = end;
  }
  return g;
}

std::string GpuKernels::describe() const {
  if (!any()) return "reference";
  const GpuKernels whole = beyond_proven() ? next() : proven();
  std::string out;
  for (NextKernel k : next_kernels())
    if (whole.on(k) && !on(k)) out += std::string(out.empty() ? " without " : ", ") + name_of(k);
  return (beyond_proven() ? "next" : "proven") + out;
}

std::string GpuKernels::startup_note() const {
  const std::string head = "; --gpu-kernels " + describe() + ": ";
  if (beyond_proven()) return head + "also kernels not yet proven on a GPU (docs/gpus.md)";
  if (!any()) return head + "the first kernels alone, none of the pieces since (docs/gpus.md)";
  if (on_ != proven().on_) return head + "some of the proven kernels left out (docs/gpus.md)";
  return "";
}

}  // namespace ddp
