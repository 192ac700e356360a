// A 32-layer MLP (width 1024, batch 256) with and without checkpoint::Sqrt: peak activation bytes
// (exact, CPU: nitro::memory::ScopedCpuTracking; GPU: the caching allocator's peak) and step time.
// RESULT checkpoint_memory = peak with / without, goal <= 0.35; checkpoint_time, goal <= 1.40.
//
// Peak activation bytes: the most CPU tensor bytes live at once during forward + backward, above
// what was live before (parameters, and gradients allocated beforehand and zeroed in place). It
// includes backward's temporaries, which checkpointing does not remove: each Linear's weight
// gradient is computed into a fresh buffer (4 MB at width 1024) before it is added to .grad.
//
// Where the checkpointed peak comes from (info lines, in units of one activation A, batch x width
// floats): it is reached in the backward of the last recomputed segment, with the segments' stored
// inputs (7 A for 8 segments), that segment's recomputed activations still needed (up to 4 A: one per
// Linear + ReLU pair; a Linear's own output is freed by the ReLU after it), the gradient flowing in
// and out (2 A) and a weight gradient (4 A): 16 A measured against 37 without checkpointing. Equal
// segments cannot go below that; segments that shrink toward the
// end (the first longest: the later a segment, the more stored inputs sit beside its recomputation)
// balance the two terms, and the row "decreasing segments" shows what they give (the optimum of
// recomputing each segment once, found by search over this model; PyTorch's checkpoint_sequential,
// also of equal segments, measures as Nitro's equal ones in bench/peers' checkpoint workload).
#include "common.hpp"

#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/train/checkpoint.hpp>

#include <torch/torch.h>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdio>
#include <cstdlib>

namespace {

torch::nn::Sequential mlp(int layers, int width) {
  torch::nn::Sequential net;
  for (int i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::Functional(torch::relu));
  }
  return net;
}

// Live-at-start to peak, in bytes, of what f allocates (CPU tensors, or the current CUDA device).
template <class F>
std::int64_t peak_bytes(bool gpu, F&& f) {
#if NITRO_WITH_CUDA
  if (gpu) {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const auto dev = c10::cuda::current_device();
    nitro::bench::synchronize();
    alloc::resetPeakStats(dev);
    const auto before = alloc::getDeviceStats(dev).allocated_bytes[0].current;
    f();
    nitro::bench::synchronize();
    return alloc::getDeviceStats(dev).allocated_bytes[0].peak - before;
  }
#endif
  (void)gpu;
  nitro::memory::ScopedCpuTracking track;
  f();
  return track.stats().peak_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gpu = nitro::Cuda::available();
  const int layers = 32, width = gpu ? 4096 : 1024, batch = gpu ? 1024 : 256;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  torch::manual_seed(0);
  auto net = mlp(layers, width);
  net->to(device);
  const auto x = torch::randn({batch, width}, torch::TensorOptions().device(device));
  const auto segments = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(net->size()))));

  // Gradients exist before measuring and are zeroed in place, so the peaks are activations (and
  // backward's temporaries), not the parameters' gradients.
  // The loss in a statement of its own, as a TrainingLoop's loss function returns it: C++ keeps the
  // temporaries of a full expression until its end, so `net->forward(x).pow(2).mean().backward()`
  // would hold the output and its square (2 A) through the backward, which Python frees at once.
  auto plain = [&] {
    const auto loss = net->forward(x).pow(2).mean();
    loss.backward();
  };
  auto checkpointed = [&] {
    const auto loss = nitro::checkpoint::sequential(net, segments, x).pow(2).mean();
    loss.backward();
  };
  // Segments of 7, 6, 6, 4, 4, 2, 2 and 1 Linear + ReLU pairs (in layers: twice that), each but the
  // last recomputed: what the search over partitions finds least for this model.
  const std::vector<std::int64_t> decreasing_pairs{7, 6, 6, 4, 4, 2, 2, 1};
  auto decreasing = [&] {
    at::Tensor h = x;
    std::int64_t begin = 0;
    for (std::size_t k = 0; k < decreasing_pairs.size(); ++k) {
      const auto end = begin + 2 * decreasing_pairs[k];
      auto piece = [&net, begin, end](const at::Tensor& in) {
        at::Tensor y = in;
        for (auto i = begin; i < end; ++i) y = (net->begin() + i)->forward(y);
        return y;
      };
      h = k + 1 < decreasing_pairs.size() ? nitro::checkpoint::run(piece, h) : piece(h);
      begin = end;
    }
    const auto loss = h.pow(2).mean();
    loss.backward();
  };
  auto zero = [&] {
    for (auto& p : net->parameters()) p.mutable_grad().zero_();
  };
  plain();
  checkpointed();  // warm-up
  zero();

  const auto mem_plain = peak_bytes(gpu, plain);
  zero();
  const auto mem_ckpt = peak_bytes(gpu, checkpointed);
  zero();
  decreasing();  // warm-up
  zero();
  const auto mem_decreasing = peak_bytes(gpu, decreasing);
  std::vector<double> t_plain, t_ckpt;
  for (int r = 0; r < reps; ++r) {
    zero();
    t_plain.push_back(nitro::bench::seconds(plain));
    zero();
    t_ckpt.push_back(nitro::bench::seconds(checkpointed));
  }
  const double tp = nitro::bench::median(t_plain), tc = nitro::bench::median(t_ckpt);
  std::printf("bench_checkpoint: MLP %d x Linear(%d) + ReLU, batch %d, forward + backward, %s (%s), median of %d\n",
              layers, width, batch, gpu ? "cuda" : "cpu", nitro::bench::machine().c_str(), reps);
  std::printf("%-28s %16s %12s\n", "", "peak activation MB", "step ms");
  std::printf("%-28s %16.1f %12.1f\n", "no checkpointing", mem_plain / 1048576.0, tp * 1e3);
  std::printf("checkpoint::Sqrt (%2lld segs)    %16.1f %12.1f\n", static_cast<long long>(segments),
              mem_ckpt / 1048576.0, tc * 1e3);
  const double activation = static_cast<double>(batch) * width * 4;
  std::printf("decreasing segments (8)      %16.1f %12s\n", mem_decreasing / 1048576.0, "-");
  std::printf("in activations A (%.1f MB): plain %.1f A, equal segments %.1f A, decreasing %.1f A "
              "(%.3f of plain)\n",
              activation / 1048576.0, mem_plain / activation, mem_ckpt / activation, mem_decreasing / activation,
              static_cast<double>(mem_decreasing) / static_cast<double>(mem_plain));
  nitro::bench::result("checkpoint_memory", static_cast<double>(mem_ckpt) / static_cast<double>(mem_plain), "<=", 0.35);
  nitro::bench::result("checkpoint_time", tc / tp, "<=", 1.40);
  return 0;
}
