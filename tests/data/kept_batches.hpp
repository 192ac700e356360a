#pragma once
// A batch data set for the data tests (test_data): it keeps every batch it makes, so a test can see
// which are still held after a prefetcher or pipeline ended an epoch.
#include <torch/data/datasets/base.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace nitro::test {

// Keeps a reference to every batch it makes (shared by the workers' copies), so a test can see which
// are still held elsewhere; the batch holding index `fail_at` throws after a pause.
struct KeptBatches : torch::data::datasets::BatchDataset<KeptBatches, at::Tensor, std::vector<std::size_t>> {
  struct Made {
    std::mutex mutex;
    std::vector<at::Tensor> batches;
  };
  std::size_t n = 0;
  std::int64_t fail_at = -1;
  std::shared_ptr<Made> made = std::make_shared<Made>();
  at::Tensor get_batch(std::vector<std::size_t> indices) override {
    for (auto i : indices)
      if (static_cast<std::int64_t>(i) == fail_at) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the later batches are made meanwhile
        throw std::runtime_error("bad sample " + std::to_string(i));
      }
    auto t = torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()));
    std::lock_guard guard(made->mutex);
    made->batches.push_back(t);
    return t;
  }
  std::optional<std::size_t> size() const override { return n; }
  // Waits up to 5 s until no batch but those in `kept` is held outside this record; true if so.
  bool only_kept_held(const std::vector<at::Tensor>& kept) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      bool held = false;
      {
        std::lock_guard guard(made->mutex);
        for (const auto& t : made->batches) {
          const bool mine = std::any_of(kept.begin(), kept.end(), [&](const at::Tensor& k) { return k.is_same(t); });
          held = held || (!mine && t.use_count() > 1);
        }
      }
      if (!held) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
};

}  // namespace nitro::test
