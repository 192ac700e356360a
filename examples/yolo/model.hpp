#pragma once
// A YOLOv8 detector (n, s, m, l, x) in LibTorch C++, written from the yolov8 layer specification:
// a Conv/C2f/SPPF backbone, the PAN neck and the decoupled anchor-free head that regresses each box
// side as a distribution over reg_max = 16 bins (GFL's distribution focal loss). The modules and
// their names follow the specification's layer list, `model.<i>.<part>`, so a state dict of a model
// built from yolov8<scale>.yaml moves here by name (examples/yolo/convert.py).
//
//   auto net = yolo::Detector(yolo::Config{.scale = 'n', .classes = 80});
//   net->train();  auto maps = net->forward(images);          // 3 maps [B, 4 * 16 + classes, H/s, W/s]
//   net->eval();   auto y = net->predict(images);             // [B, 4 + classes, anchors]: cx, cy, w, h
//                                                             // in pixels, then class probabilities
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/pooling.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo {

/// The model's size (yolov8's scales) and its number of classes.
struct Config {
  char scale = 'n';
  std::int64_t classes = 80;
  std::int64_t reg_max = 16;
};

/// depth, width and the channel cap of a scale (yolov8.yaml's `scales`).
struct Scale {
  double depth, width;
  std::int64_t max_channels;
};

inline Scale scale_of(char s) {
  switch (s) {
    case 'n': return {0.33, 0.25, 1024};
    case 's': return {0.33, 0.50, 1024};
    case 'm': return {0.67, 0.75, 768};
    case 'l': return {1.00, 1.00, 512};
    case 'x': return {1.00, 1.25, 512};
    default: throw std::invalid_argument(std::string("yolo: unknown scale '") + s + "' (n, s, m, l or x)");
  }
}

/// Convolution (no bias), batch norm (eps 1e-3, momentum 0.03), SiLU; `same` padding for odd kernels.
struct ConvImpl : torch::nn::Module {
  ConvImpl(std::int64_t in, std::int64_t out, std::int64_t k = 1, std::int64_t stride = 1)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k)
                                                            .stride(stride)
                                                            .padding(k / 2)
                                                            .bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(out).eps(1e-3).momentum(0.03)))) {}
  at::Tensor forward(const at::Tensor& x) { return at::silu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(Conv);

/// Two 3x3 Convs, with the input added back when `shortcut` and the shapes allow.
struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(std::int64_t in, std::int64_t out, bool shortcut)
      : cv1(register_module("cv1", Conv(in, out, 3))), cv2(register_module("cv2", Conv(out, out, 3))),
        add(shortcut && in == out) {}
  at::Tensor forward(const at::Tensor& x) { return add ? x + cv2(cv1(x)) : cv2(cv1(x)); }
  Conv cv1, cv2;
  bool add;
};
TORCH_MODULE(Bottleneck);

/// C2f: a 1x1 Conv split in two halves, n bottlenecks on the second half, every intermediate kept,
/// all concatenated into a 1x1 Conv.
struct C2fImpl : torch::nn::Module {
  C2fImpl(std::int64_t in, std::int64_t out, std::int64_t n, bool shortcut)
      : c(out / 2),
        cv1(register_module("cv1", Conv(in, 2 * c, 1))),
        cv2(register_module("cv2", Conv((2 + n) * c, out, 1))),
        m(register_module("m", torch::nn::ModuleList())) {
    for (std::int64_t i = 0; i < n; ++i) m->push_back(Bottleneck(c, c, shortcut));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto y = cv1(x).chunk(2, 1);
    for (const auto& b : *m) y.push_back(b->as<Bottleneck>()->forward(y.back()));
    return cv2(at::cat(y, 1));
  }
  std::int64_t c;
  Conv cv1, cv2;
  torch::nn::ModuleList m;
};
TORCH_MODULE(C2f);

/// SPPF: a 1x1 Conv to half the channels, three 5x5 max pools in a row, all four concatenated, a 1x1 Conv.
struct SPPFImpl : torch::nn::Module {
  SPPFImpl(std::int64_t in, std::int64_t out, std::int64_t k = 5)
      : cv1(register_module("cv1", Conv(in, in / 2, 1))),
        cv2(register_module("cv2", Conv(in / 2 * 4, out, 1))),
        m(register_module("m", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(k).stride(1).padding(k / 2)))) {}
  at::Tensor forward(const at::Tensor& x) {
    std::vector<at::Tensor> y{cv1(x)};
    for (int i = 0; i < 3; ++i) y.push_back(m(y.back()));
    return cv2(at::cat(y, 1));
  }
  Conv cv1, cv2;
  torch::nn::MaxPool2d m;
};
TORCH_MODULE(SPPF);

/// The decoupled head: for each of the three levels a box branch (4 x reg_max logits: each side of
/// the box as a distribution over 0 .. reg_max - 1 strides) and a class branch (one logit a class).
struct DetectImpl : torch::nn::Module {
  DetectImpl(std::int64_t classes, std::int64_t reg_max, const std::array<std::int64_t, 3>& channels)
      : classes(classes), reg_max(reg_max),
        cv2(register_module("cv2", torch::nn::ModuleList())),
        cv3(register_module("cv3", torch::nn::ModuleList())) {
    const auto c2 = std::max({std::int64_t{16}, channels[0] / 4, reg_max * 4});
    const auto c3 = std::max(channels[0], std::min<std::int64_t>(classes, 100));
    for (const auto ch : channels) {
      cv2->push_back(torch::nn::Sequential(Conv(ch, c2, 3), Conv(c2, c2, 3),
                                           torch::nn::Conv2d(torch::nn::Conv2dOptions(c2, 4 * reg_max, 1))));
      cv3->push_back(torch::nn::Sequential(Conv(ch, c3, 3), Conv(c3, c3, 3),
                                           torch::nn::Conv2d(torch::nn::Conv2dOptions(c3, classes, 1))));
    }
    // The DFL's fixed 1x1 convolution (the expectation over the bins): a buffer-like parameter, no gradient.
    auto dfl = register_module("dfl", std::make_shared<torch::nn::Module>());
    dfl_weight = dfl->register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(reg_max, 1, 1).bias(false)))
                     ->weight;
    {
      const at::NoGradGuard no_grad;
      dfl_weight.copy_(at::arange(reg_max, dfl_weight.options()).view({1, reg_max, 1, 1}));
    }
    dfl_weight.set_requires_grad(false);
  }

  /// Each level's raw map [B, 4 reg_max + classes, H, W].
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& x) {
    std::vector<at::Tensor> out;
    for (std::size_t i = 0; i < x.size(); ++i)
      out.push_back(at::cat({cv2[i]->as<torch::nn::Sequential>()->forward(x[i]),
                             cv3[i]->as<torch::nn::Sequential>()->forward(x[i])},
                            1));
    return out;
  }

  std::int64_t classes, reg_max;
  torch::nn::ModuleList cv2, cv3;
  at::Tensor dfl_weight;
};
TORCH_MODULE(Detect);

/// Anchor points (cell centres, in cells) and their strides for maps of the given sizes.
inline std::pair<at::Tensor, at::Tensor> make_anchors(const std::vector<at::Tensor>& maps,
                                                      const std::array<double, 3>& strides, double offset = 0.5) {
  std::vector<at::Tensor> points, stride;
  const auto o = maps[0].options();
  for (std::size_t i = 0; i < maps.size(); ++i) {
    const auto h = maps[i].size(2), w = maps[i].size(3);
    const auto sx = at::arange(w, o) + offset, sy = at::arange(h, o) + offset;
    const auto grid = at::meshgrid({sy, sx}, "ij");
    points.push_back(at::stack({grid[1], grid[0]}, -1).view({-1, 2}));
    stride.push_back(at::full({h * w, 1}, strides[i], o));
  }
  return {at::cat(points), at::cat(stride)};
}

/// YOLOv8: the backbone, the neck and the head, as `model.0` .. `model.22`.
struct DetectorImpl : torch::nn::Module {
  explicit DetectorImpl(const Config& config = {}) : config(config), layers(register_module("model", torch::nn::ModuleList())) {
    const auto s = scale_of(config.scale);
    const auto ch = [&](std::int64_t c) {  // make_divisible(min(c, max) * width, 8)
      return static_cast<std::int64_t>(std::ceil(static_cast<double>(std::min(c, s.max_channels)) * s.width / 8.0)) * 8;
    };
    const auto n = [&](std::int64_t r) { return r > 1 ? std::max<std::int64_t>(std::llround(r * s.depth), 1) : r; };
    const std::int64_t c64 = ch(64), c128 = ch(128), c256 = ch(256), c512 = ch(512), c1024 = ch(1024);
    // backbone
    layers->push_back(Conv(3, c64, 3, 2));           // 0  P1/2
    layers->push_back(Conv(c64, c128, 3, 2));        // 1  P2/4
    layers->push_back(C2f(c128, c128, n(3), true));  // 2
    layers->push_back(Conv(c128, c256, 3, 2));       // 3  P3/8
    layers->push_back(C2f(c256, c256, n(6), true));  // 4
    layers->push_back(Conv(c256, c512, 3, 2));       // 5  P4/16
    layers->push_back(C2f(c512, c512, n(6), true));  // 6
    layers->push_back(Conv(c512, c1024, 3, 2));      // 7  P5/32
    layers->push_back(C2f(c1024, c1024, n(3), true));  // 8
    layers->push_back(SPPF(c1024, c1024, 5));        // 9
    // neck: 10 and 13 upsample, 11, 14, 17 and 20 concatenate (no parameters, no modules of their own
    // but placeholders, so the indices stay the specification's)
    const auto none = [&] { layers->push_back(std::make_shared<torch::nn::Module>()); };
    none();                                            // 10 upsample
    none();                                            // 11 cat 6
    layers->push_back(C2f(c1024 + c512, c512, n(3), false));  // 12
    none();                                            // 13 upsample
    none();                                            // 14 cat 4
    layers->push_back(C2f(c512 + c256, c256, n(3), false));   // 15 P3 out
    layers->push_back(Conv(c256, c256, 3, 2));               // 16
    none();                                                   // 17 cat 12
    layers->push_back(C2f(c256 + c512, c512, n(3), false));   // 18 P4 out
    layers->push_back(Conv(c512, c512, 3, 2));               // 19
    none();                                                   // 20 cat 9
    layers->push_back(C2f(c512 + c1024, c1024, n(3), false));  // 21 P5 out
    layers->push_back(Detect(config.classes, config.reg_max, std::array<std::int64_t, 3>{c256, c512, c1024}));  // 22
  }

  /// Training: the head's three raw maps.
  std::vector<at::Tensor> forward(const at::Tensor& images) {
    const auto at = [&](int i) { return layers[static_cast<std::size_t>(i)]; };
    const auto conv = [&](int i, const at::Tensor& x) { return at(i)->as<Conv>()->forward(x); };
    const auto c2f = [&](int i, const at::Tensor& x) { return at(i)->as<C2f>()->forward(x); };
    const auto up = [](const at::Tensor& x) {
      return at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2});
    };
    auto x = conv(1, conv(0, images));
    x = conv(3, c2f(2, x));
    const auto p3 = c2f(4, x);
    const auto p4 = c2f(6, conv(5, p3));
    const auto p5 = at(9)->as<SPPF>()->forward(c2f(8, conv(7, p4)));
    const auto h12 = c2f(12, at::cat({up(p5), p4}, 1));
    const auto h15 = c2f(15, at::cat({up(h12), p3}, 1));
    const auto h18 = c2f(18, at::cat({conv(16, h15), h12}, 1));
    const auto h21 = c2f(21, at::cat({conv(19, h18), p5}, 1));
    return head()->forward({h15, h18, h21});
  }

  /// Inference: boxes (cx, cy, w, h in input pixels, from the expected distance of each side) and
  /// class probabilities for every anchor: [B, 4 + classes, anchors].
  at::Tensor predict(const at::Tensor& images) {
    const auto maps = forward(images);
    auto h = head();
    const auto b = images.size(0), no = 4 * h->reg_max + h->classes;
    std::vector<at::Tensor> flat;
    for (const auto& m : maps) flat.push_back(m.view({b, no, -1}));
    const auto all = at::cat(flat, 2);
    const auto parts = all.split({4 * h->reg_max, h->classes}, 1);
    const auto anchors_strides = make_anchors(maps, strides);
    const auto anchors = anchors_strides.first.t().unsqueeze(0), stride = anchors_strides.second.t();
    const auto a = all.size(2);
    const auto dist = at::conv2d(parts[0].view({b, 4, h->reg_max, a}).transpose(2, 1).softmax(1), h->dfl_weight)
                          .view({b, 4, a});
    const auto lt_rb = dist.chunk(2, 1);
    const auto x1y1 = anchors - lt_rb[0], x2y2 = anchors + lt_rb[1];
    const auto box = at::cat({(x1y1 + x2y2) / 2, x2y2 - x1y1}, 1) * stride;
    return at::cat({box, parts[1].sigmoid()}, 1);
  }

  Detect head() { return Detect(std::dynamic_pointer_cast<DetectImpl>(layers[22])); }

  Config config;
  torch::nn::ModuleList layers;
  std::array<double, 3> strides{8, 16, 32};
};
TORCH_MODULE(Detector);

}  // namespace yolo
