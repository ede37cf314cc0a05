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
  if (spec == "proven") return proven();
  const std::string head = spec.substr(0, spec.find(','));
  DDP_CHECK(head == "next",
            "--gpu-kernels must be proven, next, or next,-NAME,... to leave kernels of next out (docs/gpus.md), got '",
            spec, "'");
  GpuKernels g = next();
  for (size_t at = head.size(); at < spec.size();) {
    const size_t end = std::min(spec.find(',', at + 1), spec.size());
    const std::string item = spec.substr(at + 1, end - at - 1);
    bool known = false;
    for (NextKernel k : next_kernels())
      if (item == std::string("-") + name_of(k)) {
        g = g.without(k);
        known = true;
      }
    DDP_CHECK(known, "--gpu-kernels ", spec, ": '", item, "' is not -NAME of a kernel of next (", piece_names(),
              ")");
    at = end;
  }
  return g;
}

std::string GpuKernels::describe() const {
  if (!any()) return "proven";
  std::string out;
  for (NextKernel k : next_kernels())
    if (!on(k)) out += std::string(out.empty() ? " without " : ", ") + name_of(k);
  return "next" + out;
}

}  // namespace ddp
