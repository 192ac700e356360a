#pragma once
// The frame the documentation's code fragments are compiled in (tests/docs/snippets.py): the names a
// fragment may use without declaring them, with the types a reader would expect. Fragments are
// compiled, never run, so nothing here is ever constructed.
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nitro_docs {

/// A loss function as the guides write it: cross-entropy of the model's output and the batch's
/// target; with a torch::nn::Sequential model it may take the loop's forward first.
struct CrossEntropy {
  mutable torch::nn::Sequential model;
  template <class Batch>
  at::Tensor operator()(const Batch& b) const { return torch::cross_entropy_loss(model->forward(b.data), b.target); }
};

/// Makes a batch of `rows` samples (what the batch-size finder and level::Auto's tune() call).
struct MakeBatch {
  torch::data::Example<> operator()(std::int64_t rows) const;
};

/// A stage function of a data pipeline: a batch in, a batch out.
struct Stage {
  nitro::data::RecordBatch operator()(nitro::data::RecordBatch b, const nitro::data::StageContext& c) const;
};

/// A user's own sample-level data set.
struct MyDataset : torch::data::datasets::Dataset<MyDataset> {
  torch::data::Example<> get(size_t index) override;
  std::optional<size_t> size() const override;
};

/// The names a fragment of the guides uses as given.
struct Frame {
  Frame();  // never defined: the fragments are compiled, not run

  torch::nn::Sequential model;
  torch::optim::SGD optimizer;
  CrossEntropy loss_fn;
  torch::data::Example<> batch;           // .data [N, 3, 32, 32], .target [N]
  std::vector<torch::data::Example<>>* loader;   // `for (auto& batch : *loader)`
  std::vector<torch::data::Example<>> batches;
  nitro::data::SyntheticImages images;
  MyDataset dataset;
  MakeBatch make_batch;
  Stage flip_jitter_normalise;
  c10::Device device;
  at::Tensor image;                        // one sample, no batch dimension
  at::Tensor batch_u8;                     // uint8 [N, 3, H, W]
  std::vector<at::Tensor> boxes;           // YOLO boxes, one [n_i, 5] tensor per sample
  int epochs;
  std::int64_t steps;
  std::string dir;
  nitro::StateDict extras;
  nitro::data::ResumableSampler sampler;
  torch::nn::Sequential generator, discriminator;   // a GAN's two models
  torch::nn::Sequential teacher;                    // a trained model distilled into `model`
  torch::optim::Adam g_optimizer, d_optimizer;
};

/// What a custom module's members look like in the guides.
struct ModuleFrame : torch::nn::Module {
  torch::nn::Sequential features;
  std::vector<torch::nn::Sequential> blocks_;
  torch::nn::Linear head{nullptr};
};

}  // namespace nitro_docs
