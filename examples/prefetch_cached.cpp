// A training loop fed by a prefetcher over a cached data set: decoded samples stay in a cache of half
// the data set's bytes (NoEvict: the best policy for shuffled epochs), a Prefetcher reads batches
// with worker threads ahead of the step (on the GPU when one is present, copied from pinned memory on
// a copy stream), and level::Basic trains on them.
//
//   build/examples/prefetch_cached        (per epoch: seconds, loss, cache hit %)
#include <nitro/cache/cached_dataset.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr std::int64_t samples = 4096;
constexpr std::int64_t batch_size = 64;

torch::nn::Sequential cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                               torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

template <nitro::DeviceTag Device>
void train(int epochs) {
  const c10::Device device = Device::type == c10::DeviceType::CUDA ? nitro::Cuda::device() : nitro::Cpu::device();
  nitro::data::SyntheticImages images{{.size = samples, .noise = 4.0, .seed = 1}};
  const auto sample_bytes = nitro::TensorBytes{}(images.get(0));
  // The cache sits in front of the data set; its copies in the workers share it.
  auto cached = nitro::cached<nitro::evict::NoEvict>(
      images, {.capacity_bytes = static_cast<std::size_t>(samples / 2 * sample_bytes)});
  auto model = cnn();
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  nitro::level::Basic loop{model, optimizer};
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    cached.cache().reset_stats();
    const auto start = std::chrono::steady_clock::now();
    auto source = nitro::from_dataset(cached.map(torch::data::transforms::Stack<>()),
                                      torch::data::samplers::RandomSampler(samples), batch_size);
    at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    std::int64_t steps = 0;
    for (auto& batch : nitro::prefetch<Device>(std::move(source), {.depth = 4, .workers = 2})) {
      auto r = loop.step(batch, [](auto& forward, const auto& b) {
        return torch::cross_entropy_loss(forward(b.data), b.target);
      });
      loss_sum += r.loss.detach();  // no host synchronisation per step
      ++steps;
    }
    const double loss = loss_sum.item<double>() / static_cast<double>(steps);  // one sync per epoch
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d  %6.2f s  loss %.4f  cache hits %5.1f%%  (%lld batches)\n", epoch, seconds, loss,
                100 * cached.cache().stats().hit_ratio(), static_cast<long long>(steps));
  }
}

}  // namespace

int main() {
  torch::manual_seed(0);
  const bool gpu = nitro::Cuda::available();
  std::printf("prefetch_cached: %lld synthetic images, batch %lld, cache of half the bytes (NoEvict), "
              "Prefetcher<%s> with 2 workers, level::Basic\n",
              static_cast<long long>(samples), static_cast<long long>(batch_size), gpu ? "Cuda" : "Cpu");
  if (gpu) train<nitro::Cuda>(3);
  else train<nitro::Cpu>(3);
}
