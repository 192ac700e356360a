// Transfer learning: a backbone trained on one task, saved, loaded under a new, larger head and
// fine-tuned on a second task that has few labelled images (what torchvision's fine-tuning tutorial
// does, for pytorch/examples' C++ users), in two phases:
//
//   1. pretraining: a backbone of 3 conv blocks + a linear head on task A (10 classes of synthetic
//      16x16 images, --pretrain-samples of them); the backbone's weights are saved with torch::save
//      to <dir>/backbone.pt (overwritten by the next run).
//   2. fine-tuning: the same backbone, loaded with torch::load, under a new head of two layers, on
//      task B (10 other classes of the same kind of images, only --samples of them):
//        - the first --frozen blocks of the backbone (2 of 3 by default; 3: all of it) are frozen:
//          requires_grad false, and eval mode, so that their BatchNorm statistics stay the
//          pretraining's (model->train() sets every module back to training mode: set them again);
//        - nitro::optim::groups makes parameter groups by rule: the head a rate --head-lr-ratio times
//          the base rate --lr, no weight decay on biases and norms, what no rule matches (the
//          backbone's unfrozen block) the base options; frozen parameters are in no group;
//        - the loop keeps an EMA of the weights (nitro::ema::Model), evaluated at the end by swapping
//          it into the model for the scope of the evaluation (ema.swap_into).
//
//   build/examples/fine_tune                                              # both phases, a few seconds
//   build/examples/fine_tune --frozen 3                                   # the whole backbone frozen
//   build/examples/fine_tune --pretrained /tmp/nitro-fine-tune/backbone.pt   # phase 2 only, from that file
//   build/examples/fine_tune --no-pretraining --frozen 0                  # the baseline: task B from scratch
//   build/examples/fine_tune --width 32 --pretrain-samples 16384 --samples 1024 --epochs 20 --threads 4
//
// It prints the pretraining's accuracy, what was frozen, each group's rate and members, and task B's
// accuracy before fine-tuning (the new head at random), after it, and of the EMA. On 256 images of
// task B the pretrained backbone does clearly better than the same model trained from scratch.
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/source.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/optim/groups.hpp>
#include <nitro/train/ema.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace {

// A flag's value as a number: all of it, or a nitro::Error naming the flag.
template <class T>
T number(std::string_view flag, const std::string& text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  NITRO_CHECK(ec == std::errc{} && end == text.data() + text.size() && !text.empty(), "fine_tune: ", flag,
              " takes a number", std::is_unsigned_v<T> ? " >= 0" : "", ", got '", text, "'");
  return v;
}

namespace fs = std::filesystem;
namespace nn = torch::nn;

// conv 3x3, BatchNorm, ReLU, halving max-pool. A module of its own: a Sequential cannot hold a
// Sequential (its forward is a template).
struct BlockImpl : nn::Module {
  BlockImpl(std::int64_t in, std::int64_t out)
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(out))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::max_pool2d(torch::relu(bn->forward(conv->forward(x))), 2); }
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(Block);

constexpr std::int64_t kBlocks = 3, kSide = 16;

// 3x16x16 images -> width*4 channels of 2x2, flattened.
nn::Sequential make_backbone(std::int64_t width) {
  return nn::Sequential(Block(3, width), Block(width, width * 2), Block(width * 2, width * 4), nn::Flatten());
}
std::int64_t features(std::int64_t width) { return width * 4 * (kSide / 8) * (kSide / 8); }

// A backbone and a head, named so: parameters are "backbone.1.conv.weight", "head.0.bias", ...
struct ClassifierImpl : nn::Module {
  ClassifierImpl(nn::Sequential backbone_, nn::Sequential head_)
      : backbone(register_module("backbone", std::move(backbone_))), head(register_module("head", std::move(head_))) {}
  at::Tensor forward(const at::Tensor& x) { return head->forward(backbone->forward(x)); }
  nn::Sequential backbone, head;
};
TORCH_MODULE(Classifier);

// The tasks: the same kind of images (blocky class patterns, shifted, in noise), other classes.
nitro::data::SyntheticImages task(std::uint64_t seed, std::int64_t size, std::int64_t offset, double noise) {
  return nitro::data::SyntheticImages(
      {.size = size, .offset = offset, .height = kSide, .width = kSide, .noise = noise, .seed = seed});
}

double accuracy(Classifier& model, nitro::data::SyntheticImages& test) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto [x, y] = test.stacked(0, static_cast<std::int64_t>(*test.size()));
  return model->forward(x).argmax(1).eq(y).to(torch::kFloat).mean().item<double>();
}

// `epochs` shuffled epochs of `train` through `loop`, batches made ahead by two workers. `prepare`
// runs before each epoch (it sets the modes: a frozen block stays in eval mode).
template <class Loop, class Prepare>
void train_epochs(Loop& loop, Classifier& model, nitro::data::SyntheticImages& train, int epochs, std::int64_t batch,
                  nitro::data::SyntheticImages& test, std::string_view phase, Prepare prepare) {
  auto batches = nitro::prefetch<nitro::Cpu>(
      nitro::from_dataset(train.map(torch::data::transforms::Stack<>()),
                          torch::data::samplers::RandomSampler(*train.size()), static_cast<std::size_t>(batch)),
      {.depth = 4, .workers = 2});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    batches.set_epoch(epoch);
    prepare();
    at::Tensor loss_sum = torch::zeros({});
    std::int64_t steps = 0;
    for (auto& b : batches) {
      loss_sum += loop.step(b, [&](const auto& x) { return torch::cross_entropy_loss(model->forward(x.data), x.target); })
                      .loss.detach();
      ++steps;
    }
    std::printf("  %.*s epoch %d/%d  loss %.4f  test acc %.3f\n", static_cast<int>(phase.size()), phase.data(), epoch + 1,
                epochs, loss_sum.item<double>() / static_cast<double>(steps), accuracy(model, test));
  }
}

std::int64_t count(const std::vector<at::Tensor>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

}  // namespace

int main(int argc, char** argv) try {
  fs::path dir = fs::temp_directory_path() / "nitro-fine-tune";
  std::string pretrained;
  std::int64_t width = 16, pretrain_samples = 4096, samples = 256, batch = 32, frozen = 2;
  int pretrain_epochs = 4, epochs = 10;
  double lr = 1e-3, head_lr_ratio = 10, noise = 4;
  bool no_pretraining = false;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "fine_tune: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--dir") dir = value();
    else if (arg == "--pretrained") pretrained = value();
    else if (arg == "--width") width = number<std::int64_t>(arg, value());
    else if (arg == "--pretrain-samples") pretrain_samples = number<std::int64_t>(arg, value());
    else if (arg == "--pretrain-epochs") pretrain_epochs = number<int>(arg, value());
    else if (arg == "--samples") samples = number<std::int64_t>(arg, value());
    else if (arg == "--epochs") epochs = number<int>(arg, value());
    else if (arg == "--batch") batch = number<std::int64_t>(arg, value());
    else if (arg == "--frozen") frozen = number<std::int64_t>(arg, value());
    else if (arg == "--lr") lr = number<double>(arg, value());
    else if (arg == "--head-lr-ratio") head_lr_ratio = number<double>(arg, value());
    else if (arg == "--noise") noise = number<double>(arg, value());
    else if (arg == "--no-pretraining") no_pretraining = true;
    else if (arg == "--threads") threads = number<int>(arg, value());
    else NITRO_CHECK(false, "fine_tune: unknown option ", arg,
                     " (--dir D --pretrained FILE --width C --pretrain-samples N --pretrain-epochs E --samples N "
                     "--epochs E --batch B --frozen K --lr R --head-lr-ratio X --noise S --no-pretraining --threads T)");
  }
  NITRO_CHECK(width >= 1 && batch >= 1 && pretrain_samples >= batch && samples >= batch && pretrain_epochs >= 1 &&
                  epochs >= 1,
              "fine_tune: need --width, --batch, --pretrain-epochs, --epochs >= 1 and --samples, --pretrain-samples >= --batch");
  NITRO_CHECK(frozen >= 0 && frozen <= kBlocks, "fine_tune: --frozen must be 0 to ", kBlocks, " (blocks of the backbone)");
  NITRO_CHECK(lr > 0 && head_lr_ratio > 0, "fine_tune: --lr and --head-lr-ratio must be > 0");
  NITRO_CHECK(threads >= 1, "fine_tune: --threads must be >= 1");
  // LibTorch's threads for each operation: one by default, as the model is small and the prefetcher's
  // two workers want cores too (more threads than free cores make OpenMP spin, many times slower).
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const auto wall = std::chrono::steady_clock::now();

  // ---- Phase 1: pretraining on task A, the backbone saved -----------------------------------------
  fs::path weights = pretrained;
  if (pretrained.empty() && !no_pretraining) {
    auto train_a = task(1, pretrain_samples, 0, noise), test_a = task(1, 512, pretrain_samples, noise);
    Classifier model(make_backbone(width), nn::Sequential(nn::Linear(features(width), 10)));
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(lr));
    nitro::level::Basic loop{model, optimizer};
    std::printf("phase 1: pretraining backbone (%lld parameters) + linear head on task A, %lld images\n",
                static_cast<long long>(count(model->backbone->parameters())), static_cast<long long>(pretrain_samples));
    train_epochs(loop, model, train_a, pretrain_epochs, batch, test_a, "task A", [&] { model->train(); });
    fs::create_directories(dir);
    weights = dir / "backbone.pt";
    torch::save(model->backbone, weights.string());  // overwrites the file of an earlier run
    std::printf("phase 1: task A test accuracy %.3f; backbone saved to %s\n", accuracy(model, test_a), weights.c_str());
  }

  // ---- Phase 2: the saved backbone under a larger head, fine-tuned on task B ----------------------
  auto train_b = task(2, samples, 0, noise), test_b = task(2, 512, samples, noise);
  Classifier model(make_backbone(width),
                   nn::Sequential(nn::Linear(features(width), 128), nn::ReLU(), nn::Dropout(0.2), nn::Linear(128, 10)));
  if (!no_pretraining) {
    NITRO_CHECK(fs::is_regular_file(weights), "fine_tune: no backbone weights at ", weights.string(),
                ": give a file that a first run wrote (--pretrained FILE), or let it pretrain (no --pretrained)");
    try {
      torch::load(model->backbone, weights.string());
    } catch (const c10::Error& e) {
      nitro::detail::fail("fine_tune: the backbone in ", weights.string(), " does not load into this one (is it from a run "
                          "with the same --width?): ", e.what_without_backtrace());
    }
  }
  std::printf("phase 2: backbone %s%s; new head of %lld parameters; task B, %lld images\n",
              no_pretraining ? "at random (--no-pretraining)" : "loaded from ", no_pretraining ? "" : weights.c_str(),
              static_cast<long long>(count(model->head->parameters())), static_cast<long long>(samples));

  // Frozen: no gradient, and eval mode (model->train() would set it back: see prepare below).
  std::vector<std::shared_ptr<nn::Module>> frozen_blocks;
  for (std::int64_t k = 0; k < frozen; ++k) {
    auto b = model->backbone->ptr(static_cast<std::size_t>(k));
    for (auto& p : b->parameters()) p.set_requires_grad(false);
    frozen_blocks.push_back(std::move(b));
  }
  std::int64_t frozen_count = 0, trainable_count = 0;
  for (const auto& p : model->parameters()) (p.requires_grad() ? trainable_count : frozen_count) += p.numel();
  if (frozen > 0)
    std::printf("frozen: backbone blocks 0..%lld of %lld, %lld parameters (requires_grad false, eval mode); "
                "trainable: %lld parameters\n",
                static_cast<long long>(frozen - 1), static_cast<long long>(kBlocks), static_cast<long long>(frozen_count),
                static_cast<long long>(trainable_count));
  else
    std::printf("frozen: nothing (--frozen 0); trainable: all %lld parameters\n", static_cast<long long>(trainable_count));

  // Parameter groups by rule; a parameter no rule matches (the unfrozen backbone) keeps `defaults`.
  using nitro::optim::Kind;
  const auto defaults = torch::optim::AdamWOptions(lr).weight_decay(1e-2);
  torch::optim::AdamW optimizer(
      nitro::optim::groups(*model, defaults,
                           {{"head", {.names = {"head"}}, [&](auto& o) { o.lr(lr * head_lr_ratio); }},
                            {"no_decay", {.kinds = Kind::bias | Kind::norm}, [](auto& o) { o.weight_decay(0); }}}),
      defaults);
  std::map<const void*, std::string> names;
  for (const auto& item : model->named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    auto& group = optimizer.param_groups()[g];
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::string members;
    for (const auto& p : group.params()) members += (members.empty() ? "" : " ") + names[p.unsafeGetTensorImpl()];
    std::printf("group %zu: lr %.0e  weight decay %.0e  %lld parameters: %s\n", g, o.lr(), o.weight_decay(),
                static_cast<long long>(count(group.params())), members.c_str());
  }

  using Loop = nitro::level::with<nitro::level::Basic, nitro::ema::Model>;
  Loop loop{model, optimizer, {.hooks = {nitro::ema::Model::Options{.decay = 0.99, .tau = 20}}}};
  const double before = accuracy(model, test_b);
  std::printf("task B test accuracy before fine-tuning: %.3f (%s backbone, head at random)\n", before,
              no_pretraining ? "random" : "pretrained");
  train_epochs(loop, model, train_b, epochs, batch, test_b, "task B", [&] {
    model->train();
    for (auto& b : frozen_blocks) b->eval();
  });
  const double after = accuracy(model, test_b);

  auto& ema = loop.hook<nitro::ema::Model>();
  const double averaged = [&] {
    auto in_use = ema.swap_into(*model);  // the average in the model until the end of this scope
    return accuracy(model, test_b);
  }();
  std::printf("EMA: %lld updates, decay now %.4f\n", static_cast<long long>(ema.updates()), ema.decay_now());
  std::printf("done in %.1f s: task B test accuracy before %.3f, after %.3f, EMA %.3f\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(), before, after, averaged);
  return 0;
} catch (const std::exception& e) {
  const std::string_view what = e.what();  // Nitro's and this program's messages name the program already
  std::fprintf(stderr, "%s%s\n", what.starts_with("fine_tune: ") ? "" : "fine_tune: ", e.what());
  return 1;
}
