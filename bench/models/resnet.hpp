#pragma once
// ResNet-50 as torchvision builds it (torchvision.models.resnet50, "ResNet v1.5": the stride on the 3x3
// convolution of a bottleneck), for the benchmarks and the comparison with Python PyTorch
// (bench/peers/). The same modules and parameter names, registered in the same order, as torchvision's,
// so a state_dict moves between the two by name; the same initialisation rules (kaiming_normal_ with
// fan_out for convolutions, ones and zeros for batch norms, nn.Linear's default for the classifier),
// drawn from the current seed (other numbers than Python's: the comparisons move the weights by file). The Python twin is bench/peers/models.py; tests/peers/models.py checks
// both against torchvision's resnet50 given the same weights.
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <ATen/ops/adaptive_avg_pool2d.h>
#include <ATen/ops/relu.h>

#include <array>

#include <cstdint>
#include <string>

namespace nitro::bench {

/// torchvision's Bottleneck: 1x1 (in -> width), 3x3 with the stride (width -> width), 1x1 (width ->
/// 4 width), each followed by a batch norm, ReLU after the first two and after the sum with the
/// shortcut (a 1x1 convolution and batch norm where the shape changes).
struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(std::int64_t in, std::int64_t width, std::int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, width, 1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(width))),
        conv2(register_module(
            "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(width, width, 3).stride(stride).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(width))),
        conv3(register_module("conv3", torch::nn::Conv2d(torch::nn::Conv2dOptions(width, 4 * width, 1).bias(false)))),
        bn3(register_module("bn3", torch::nn::BatchNorm2d(4 * width))) {
    if (stride != 1 || in != 4 * width) {
      downsample = register_module(
          "downsample",
          torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, 4 * width, 1).stride(stride).bias(false)),
                                torch::nn::BatchNorm2d(4 * width)));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    auto out = at::relu(bn1(conv1(x)));
    out = at::relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    out += downsample ? downsample->forward(x) : x;
    return at::relu_(out);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d conv3;
  torch::nn::BatchNorm2d bn3;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

/// torchvision's ResNet with bottleneck blocks; `blocks` {3, 4, 6, 3} is ResNet-50.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl(std::array<std::int64_t, 4> blocks, std::int64_t classes)
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(64))),
        maxpool(register_module("maxpool", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)))) {
    std::int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      const std::int64_t width = std::int64_t{64} << stage;
      torch::nn::Sequential layer;
      for (std::int64_t b = 0; b < blocks[static_cast<std::size_t>(stage)]; ++b) {
        layer->push_back(Bottleneck(in, width, b == 0 && stage > 0 ? 2 : 1));
        in = 4 * width;
      }
      layers[stage] = register_module("layer" + std::to_string(stage + 1), layer);
    }
    fc = register_module("fc", torch::nn::Linear(in, classes));
    // torchvision's initialisation, in its order (module by module, as self.modules() walks them).
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<torch::nn::BatchNorm2d>()) {
        torch::nn::init::ones_(bn->weight);
        torch::nn::init::zeros_(bn->bias);
      }
    }
  }

  /// images [N, 3, H, W] -> logits [N, classes].
  at::Tensor forward(const at::Tensor& images) {
    auto x = maxpool(at::relu(bn1(conv1(images))));
    for (auto& layer : layers) x = layer->forward(x);
    return fc(at::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::MaxPool2d maxpool;
  std::array<torch::nn::Sequential, 4> layers{nullptr, nullptr, nullptr, nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

using ResNet50 = ResNet;

/// ResNet-50 (25,557,032 parameters for 1000 classes), its weights from the current seed.
inline ResNet50 resnet50(std::int64_t classes = 1000) { return ResNet(std::array<std::int64_t, 4>{3, 4, 6, 3}, classes); }

}  // namespace nitro::bench
