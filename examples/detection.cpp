// Object detection from a YOLO folder (Ultralytics' layout), with a detector small enough to train in
// seconds on a CPU:
//
//   root/images/<split>/<name>.jpg, root/labels/<split>/<name>.txt (one `class cx cy w h` line a box,
//   centre and size as fractions of the image)
//     -> data::YoloDataset (the images in sorted order, each with its label file's boxes; an image with
//        no label file, or an empty one, has no objects)
//     -> read: DetectionBatches decodes each file and letterboxes it (sample::Letterbox: the longer side
//        to --size, the aspect kept, centred on a grey square; the boxes follow) on --workers threads
//     -> targets: a random horizontal flip of images and boxes together, keyed by (seed, epoch, sample)
//        (data/augment.hpp), normalisation, and the grid targets: the cell holding each box's centre
//        gets objectness 1, the box's class and the box
//     -> Prefetcher (on a GPU: pinned staging and the copy stream) -> the loop's step
//
// The detector is single-scale and anchor-free (YOLOX's or FCOS's head without the pyramid): five
// 3x3 convolutions down to a grid of stride 8, then a 1x1 convolution predicting, per cell,
// objectness, one score per class and a box (the centre's offset in the cell, width and height as
// fractions of the image). The loss: binary cross-entropy of objectness on every cell, of the classes
// on the cells holding a box centre, and L1 + (1 - GIoU) of their boxes; computed with masks, no
// host synchronisation. The loop is level::Basic with the phase monitor (level::with<level::Basic,
// monitor::Phases>), whose report at the end says whether the pipeline or the model limits the run.
//
// Without --folder it first writes a synthetic YOLO folder, <tmp>/nitro-detection-demo-<images>:
// JPEG images of 48 to 112 pixels a side, each with 0 to 3 objects of 3 classes (0: red rectangles,
// 1: green ellipses, 2: blue triangles) at known boxes; one image in six has no object (half of those
// have no label file, half an empty one). Written once (a marker file says it is complete), reused.
//
// It prints the loss per epoch and, at the end, on the val split (the training images when there is
// none): recall, the share of objects whose best-overlapping detection (objectness > 0.5, after
// per-class NMS) has IoU > 0.5 and the right class, and precision, the share of detections that
// match an object of their class so.
//
//   build-release/examples/detection [--folder DIR] [--epochs 12] [--batch 32] [--images 384]
//       [--size 64] [--workers 2]
//   build-release/examples/detection --folder datasets/coco128 --size 320 --epochs 30
// With --folder DIR: DIR/images/train (and DIR/images/val, when there) with labels/ beside images/,
// or else every image under DIR/images (or under DIR, when DIR is itself an images folder). The
// number of classes is the largest class id in the label files plus one.
#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/pipeline.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/io/file.hpp>
#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace aug = nitro::data::augment;
namespace sample = nitro::data::sample;
namespace fs = std::filesystem;

struct Args {
  std::string folder;
  int epochs = 12;
  std::int64_t batch = 32;
  std::int64_t images = 384;
  std::int64_t size = 64;
  std::size_t workers = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--folder") a.folder = value();
    else if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--images") a.images = std::stoll(value());
    else if (arg == "--size") a.size = std::stoll(value());
    else if (arg == "--workers") a.workers = static_cast<std::size_t>(std::stoul(value()));
    else nitro::detail::fail("unknown option ", arg, "; use --folder, --epochs, --batch, --images, --size, --workers");
  }
  NITRO_CHECK(a.epochs >= 1 && a.batch >= 1 && a.workers >= 1 && a.images >= 12,
              "epochs, batch and workers must be >= 1, images >= 12");
  NITRO_CHECK(a.size >= 32 && a.size % 8 == 0, "--size must be a multiple of 8 (the grid's stride), >= 32; got ", a.size);
  return a;
}

constexpr std::int64_t kStride = 8;  // pixels of the input per grid cell
constexpr std::uint64_t kSeed = 7;   // the flips' keys

// ---- the synthetic folder ---------------------------------------------------------------------------

// One split: `count` JPEG images under root/images/<split>, their labels under root/labels/<split>.
void write_split(const fs::path& root, const std::string& split, std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto images = root / "images" / split, labels = root / "labels" / split;
  fs::create_directories(images);
  fs::create_directories(labels);
  const std::array<std::array<float, 3>, 3> colours{{{220, 40, 40}, {40, 200, 60}, {50, 70, 230}}};
  for (std::int64_t i = 0; i < count; ++i) {
    const int w = integer(48, 112), h = integer(48, 112);
    auto img = torch::full({3, h, w}, uniform(70, 180)) + 14 * torch::randn({3, h, w}, gen);
    const auto xs = torch::arange(w, at::kFloat).add_(0.5).view({1, w});
    const auto ys = torch::arange(h, at::kFloat).add_(0.5).view({h, 1});
    std::vector<std::array<double, 4>> placed;  // x0, y0, x1, y1
    std::string lines;
    const int objects = i % 6 == 5 ? 0 : integer(1, 3);
    for (int k = 0, tries = 0; k < objects && tries < 50; ++tries) {
      const double side = uniform(0.2, 0.45) * std::min(w, h);
      const double bw = side * uniform(0.75, 1.3), bh = side * uniform(0.75, 1.3);
      const double x0 = uniform(0, w - bw), y0 = uniform(0, h - bh), x1 = x0 + bw, y1 = y0 + bh;
      // Apart from the others (a little overlap at most), so that every object is visible.
      const bool apart = std::all_of(placed.begin(), placed.end(), [&](const auto& p) {
        return std::max(0.0, std::min(x1, p[2]) - std::max(x0, p[0])) * std::max(0.0, std::min(y1, p[3]) - std::max(y0, p[1])) <
               0.05 * bw * bh;
      });
      if (!apart) continue;
      placed.push_back({x0, y0, x1, y1});
      ++k;
      const int cls = integer(0, 2);
      const double cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
      at::Tensor mask;
      if (cls == 0) mask = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1);
      else if (cls == 1) mask = ((xs - cx) / (bw / 2)).square() + ((ys - cy) / (bh / 2)).square() <= 1;
      else mask = (ys >= y0) & (ys < y1) & ((xs - cx).abs() <= (ys - y0) / bh * (bw / 2));  // apex up
      auto colour = torch::tensor(std::vector<float>(colours[cls].begin(), colours[cls].end())) + 25 * torch::randn({3}, gen);
      img = torch::where(mask.unsqueeze(0), colour.view({3, 1, 1}), img);
      char line[96];
      std::snprintf(line, sizeof line, "%d %.6f %.6f %.6f %.6f\n", cls, cx / w, cy / h, bw / w, bh / h);
      lines += line;
    }
    char name[32];
    std::snprintf(name, sizeof name, "%05lld", static_cast<long long>(i));
    const auto bytes = nitro::image::encode_jpeg(img.clamp(0, 255).to(at::kByte),
                                                 {.quality = 92, .subsampling = nitro::image::Subsampling::s444});
    std::ofstream(images / (std::string(name) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    // An image without objects: no label file (every other one), or an empty one.
    if (objects > 0 || (i / 6) % 2 == 1) std::ofstream(labels / (std::string(name) + ".txt")) << lines;
  }
}

// The demo folder: written once, reused afterwards (a run stopped while writing it leaves no marker,
// so the next run writes it again).
fs::path demo_folder(const Args& args) {
  const auto root = fs::temp_directory_path() / ("nitro-detection-demo-" + std::to_string(args.images));
  if (fs::exists(root / "complete")) return root;
  const auto start = std::chrono::steady_clock::now();
  if (fs::exists(root)) nitro::io::remove_tree(root);
  const std::int64_t val = std::max<std::int64_t>(args.images / 4, 12);
  write_split(root, "train", args.images, 1);
  write_split(root, "val", val, 2);
  std::ofstream(root / "complete") << "ok\n";
  std::printf("wrote %s: %lld training and %lld val images with their labels in %.2f s\n", root.c_str(),
              static_cast<long long>(args.images), static_cast<long long>(val),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return root;
}

// ---- batches with grid targets ----------------------------------------------------------------------

/// What the loss reads: the images and, per grid cell, the targets of the box whose centre it holds.
struct GridBatch {
  at::Tensor images;      // float [N, 3, S, S], normalised
  at::Tensor objectness;  // float [N, G, G]: 1 at the cells holding a box centre
  at::Tensor classes;     // int64 [N, G, G]: that box's class (0 elsewhere; read only where objectness is 1)
  at::Tensor boxes;       // float [N, 4, G, G]: that box, (cx, cy, w, h) as fractions of the image
  template <class F>
  friend GridBatch nitro_map_tensors(const GridBatch& b, F&& f) {
    return {f(b.images), f(b.objectness), f(b.classes), f(b.boxes)};
  }
};

const aug::Normalize normalize{.mean = {0.5, 0.5, 0.5}, .std = {0.25, 0.25, 0.25}};
using TrainAugment = aug::Compose<aug::ToFloat, aug::HFlip, aug::Normalize>;
const TrainAugment train_augment{{}, {.p = 0.5}, normalize};
using EvalAugment = aug::Compose<aug::ToFloat, aug::Normalize>;
const EvalAugment eval_augment{{}, normalize};

GridBatch to_grid(at::Tensor images, const aug::Boxes& boxes, std::int64_t classes) {
  const std::int64_t n = images.size(0), g = images.size(2) / kStride;
  auto objectness = torch::zeros({n, g, g});
  auto cls = torch::zeros({n, g, g}, at::kLong);
  auto target = torch::zeros({n, 4, g, g});
  auto o = objectness.accessor<float, 3>();
  auto c = cls.accessor<std::int64_t, 3>();
  auto t = target.accessor<float, 4>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto rows = boxes[static_cast<std::size_t>(i)].to(at::kFloat).contiguous();
    const auto r = rows.accessor<float, 2>();
    for (std::int64_t k = 0; k < rows.size(0); ++k) {
      const auto id = static_cast<std::int64_t>(r[k][0]);
      NITRO_CHECK(id >= 0 && id < classes, "a box of class ", id, "; the model has classes 0..", classes - 1);
      const auto gx = std::clamp<std::int64_t>(static_cast<std::int64_t>(r[k][1] * static_cast<float>(g)), 0, g - 1);
      const auto gy = std::clamp<std::int64_t>(static_cast<std::int64_t>(r[k][2] * static_cast<float>(g)), 0, g - 1);
      o[i][gy][gx] = 1;  // two centres in one cell: the later box is the cell's
      c[i][gy][gx] = id;
      for (int j = 0; j < 4; ++j) t[i][j][gy][gx] = r[k][j + 1];
    }
  }
  return {std::move(images), objectness, cls, target};
}

// ---- the detector and its loss ----------------------------------------------------------------------

torch::nn::Sequential detector(std::int64_t classes) {
  namespace nn = torch::nn;
  torch::manual_seed(0);
  nn::Sequential model;
  for (const auto [in, out, stride] : {std::array<std::int64_t, 3>{3, 16, 2}, {16, 32, 2}, {32, 64, 2}, {64, 64, 1}, {64, 64, 1}}) {
    model->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    model->push_back(nn::BatchNorm2d(out));
    model->push_back(nn::SiLU());
  }
  nn::Conv2d head(nn::Conv2dOptions(64, 5 + classes, 1));
  {
    torch::NoGradGuard no_grad;
    head->bias[0].fill_(-4.0);  // objectness starts near 0.02: most cells hold no centre
  }
  model->push_back(head);
  return model;
}

// The head's raw output [N, 5 + C, G, G] as boxes [N, G, G, 4]: (cx, cy, w, h), fractions of the image.
at::Tensor decode_boxes(const at::Tensor& out) {
  const auto g = out.size(-1);
  const auto cells = torch::arange(g, out.options());
  const auto cx = (cells.view({1, 1, g}) + out.select(1, 1).sigmoid()) / static_cast<double>(g);
  const auto cy = (cells.view({1, g, 1}) + out.select(1, 2).sigmoid()) / static_cast<double>(g);
  return torch::stack({cx, cy, out.select(1, 3).sigmoid(), out.select(1, 4).sigmoid()}, -1);
}

// IoU and GIoU of boxes a and b, [..., 4] (cx, cy, w, h), broadcast.
std::pair<at::Tensor, at::Tensor> box_iou(const at::Tensor& a, const at::Tensor& b) {
  const auto corners = [](const at::Tensor& x) {
    const auto half = x.narrow(-1, 2, 2) / 2;
    return std::pair{x.narrow(-1, 0, 2) - half, x.narrow(-1, 0, 2) + half};
  };
  const auto [a0, a1] = corners(a);
  const auto [b0, b1] = corners(b);
  const auto inter = (torch::minimum(a1, b1) - torch::maximum(a0, b0)).clamp_min(0).prod(-1);
  const auto area = [](const at::Tensor& x) { return x.select(-1, 2) * x.select(-1, 3); };
  const auto uni = area(a) + area(b) - inter + 1e-7;
  const auto iou = inter / uni;
  const auto hull = (torch::maximum(a1, b1) - torch::minimum(a0, b0)).prod(-1) + 1e-7;
  return {iou, iou - (hull - uni) / hull};
}

// ---- evaluation -------------------------------------------------------------------------------------

struct Detection {
  float score;
  std::int64_t cls;
  at::Tensor box;  // [4]
};

struct Counts {
  std::int64_t objects = 0, found = 0, detections = 0, matched = 0;
};

Counts evaluate(torch::nn::Sequential& model, const nitro::data::YoloDataset& set, std::int64_t size, std::int64_t classes,
                const c10::Device& device) {
  nitro::data::DetectionBatches batches(set, sample::Letterbox{.size = size});
  torch::NoGradGuard no_grad;
  model->eval();
  Counts n;
  std::vector<size_t> all(set.size());
  std::iota(all.begin(), all.end(), size_t{0});
  for (std::size_t from = 0; from < all.size(); from += 64) {
    const std::vector<size_t> part(all.begin() + static_cast<std::ptrdiff_t>(from),
                                   all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), from + 64)));
    const auto b = batches.get_batch(part);
    const auto out = model->forward(eval_augment(b.data, {.index = b.index}).to(device)).cpu();
    const auto objectness = out.select(1, 0).sigmoid();
    const auto [cls_score, cls] = out.slice(1, 5, 5 + classes).sigmoid().max(1);
    const auto boxes = decode_boxes(out);
    for (std::int64_t i = 0; i < out.size(0); ++i) {
      // Cells with objectness > 0.5, best first; a cell overlapping a better one of its class
      // (IoU > 0.5) is the same object seen again: dropped (NMS).
      std::vector<Detection> found;
      const auto cells = (objectness[i] > 0.5).nonzero();
      for (std::int64_t k = 0; k < cells.size(0); ++k) {
        const auto y = cells[k][0].item<std::int64_t>(), x = cells[k][1].item<std::int64_t>();
        found.push_back({objectness[i][y][x].item<float>() * cls_score[i][y][x].item<float>(), cls[i][y][x].item<std::int64_t>(),
                         boxes[i][y][x]});
      }
      std::sort(found.begin(), found.end(), [](const auto& p, const auto& q) { return p.score > q.score; });
      std::vector<Detection> kept;
      for (const auto& d : found)
        if (std::none_of(kept.begin(), kept.end(), [&](const Detection& k) {
              return k.cls == d.cls && box_iou(k.box, d.box).first.item<double>() > 0.5;
            }))
          kept.push_back(d);
      const auto truth = b.boxes[static_cast<std::size_t>(i)];
      n.objects += truth.size(0);
      n.detections += static_cast<std::int64_t>(kept.size());
      if (kept.empty()) continue;
      std::vector<at::Tensor> kept_boxes;
      for (const auto& d : kept) kept_boxes.push_back(d.box);
      const auto iou = box_iou(truth.slice(1, 1).unsqueeze(1), torch::stack(kept_boxes).unsqueeze(0)).first;  // [objects, kept]
      for (std::int64_t t = 0; t < truth.size(0); ++t) {
        const auto best = iou[t].argmax().item<std::int64_t>();
        if (iou[t][best].item<double>() > 0.5 && kept[static_cast<std::size_t>(best)].cls == truth[t][0].item<std::int64_t>())
          ++n.found;
      }
      for (std::size_t k = 0; k < kept.size(); ++k) {
        bool match = false;
        for (std::int64_t t = 0; t < truth.size(0) && !match; ++t)
          match = iou[t][static_cast<std::int64_t>(k)].item<double>() > 0.5 && kept[k].cls == truth[t][0].item<std::int64_t>();
        n.matched += match ? 1 : 0;
      }
    }
  }
  model->train();
  return n;
}

// The number of classes: the largest id in the label files, plus one.
std::int64_t count_classes(const std::vector<const nitro::data::YoloDataset*>& sets) {
  std::int64_t top = -1;
  for (const auto* s : sets)
    for (std::size_t i = 0; i < s->size(); ++i) {
      const auto b = s->boxes(i);
      if (b.size(0) > 0) top = std::max(top, b.select(1, 0).max().item<std::int64_t>());
    }
  NITRO_CHECK(top >= 0, "the label files hold no box; nothing to learn");
  return top + 1;
}

// ---- training ---------------------------------------------------------------------------------------

void run(const Args& args, const nitro::data::YoloDataset& train_set, const nitro::data::YoloDataset& eval_set,
         const std::string& eval_name) {
  const c10::Device device = nitro::Cuda::available() ? nitro::Cuda::device() : nitro::Cpu::device();
  const std::int64_t classes = count_classes({&train_set, &eval_set});
  std::printf("detection: %zu training images (%lld boxes, %lld without a label file), %lld classes, letterboxed to "
              "%lldx%lld, a %lldx%lld grid, batch %lld, %d epochs, on %s\n",
              train_set.size(), static_cast<long long>(train_set.box_count()), static_cast<long long>(train_set.unlabelled()),
              static_cast<long long>(classes), static_cast<long long>(args.size), static_cast<long long>(args.size),
              static_cast<long long>(args.size / kStride), static_cast<long long>(args.size / kStride),
              static_cast<long long>(args.batch), args.epochs, device.str().c_str());

  auto model = detector(classes);
  model->to(device);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-4));
  using Loop = nitro::level::with<nitro::level::Basic, nitro::monitor::Phases>;
  Loop loop{model, optimizer};

  // Decoding and letterboxing (the most work) on `workers` threads; flip, normalise and targets on one more.
  nitro::data::DetectionBatches images(train_set, sample::Letterbox{.size = args.size}, {.seed = kSeed, .skip_bad = true});
  nitro::data::ResumableSampler sampler(train_set.size(), {.seed = 1});
  auto targets = [classes](nitro::data::DetectionBatch b, const nitro::data::StageContext& c) {
    auto [x, boxes] = train_augment(b.data, b.boxes, {.seed = kSeed, .epoch = c.epoch, .index = b.index});
    return to_grid(std::move(x), boxes, classes);
  };
  auto batches = nitro::data::pipeline(nitro::from_dataset(images, sampler, static_cast<std::size_t>(args.batch)),
                                       {.name = "letterbox", .workers = args.workers, .queue = 4},
                                       nitro::data::stage({.name = "targets", .workers = 1, .queue = 4}, targets));
  nitro::Prefetcher<nitro::Auto, decltype(batches)> on_device{std::move(batches), {.depth = 4, .device = device}};

  const auto loss_fn = [classes](auto& forward, const GridBatch& b) {
    const auto out = forward(b.images);  // [N, 5 + C, G, G]
    const auto& pos = b.objectness;
    const auto positives = pos.sum().clamp_min(1);
    const auto objectness = at::binary_cross_entropy_with_logits(out.select(1, 0), pos, {}, {}, at::Reduction::Sum) /
                            static_cast<double>(out.size(0));
    const auto one_hot = at::one_hot(b.classes, classes).permute({0, 3, 1, 2}).to(out.scalar_type());
    const auto cls = (at::binary_cross_entropy_with_logits(out.slice(1, 5), one_hot, {}, {}, at::Reduction::None).sum(1) * pos)
                         .sum() / positives;
    const auto predicted = decode_boxes(out), target = b.boxes.permute({0, 2, 3, 1});
    const auto l1 = ((predicted - target).abs().sum(-1) * pos).sum() / positives;
    const auto giou = ((1 - box_iou(predicted, target).second) * pos).sum() / positives;
    return objectness + cls + 5 * l1 + 2 * giou;
  };

  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    on_device.set_epoch(epoch);  // the sampler's order and the flips' keys
    const auto start = std::chrono::steady_clock::now();
    at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    std::int64_t steps = 0;
    for (auto& b : on_device) {
      loss_sum += loop.step(b, loss_fn).loss.detach();
      ++steps;
    }
    std::printf("epoch %2d  %5.2f s  loss %.4f  (%lld batches)\n", epoch,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                loss_sum.item<double>() / static_cast<double>(steps), static_cast<long long>(steps));
  }
  if (images.skipped() > 0) std::printf("files that could not be decoded (skipped): %lld\n", static_cast<long long>(images.skipped()));
  std::printf("\n%s\n", nitro::monitor::format(nitro::monitor::summarize(loop, on_device.source().stats())).c_str());

  const auto n = evaluate(model, eval_set, args.size, classes, device);
  std::printf("%s: %lld of %lld objects found (best detection IoU > 0.5, right class): recall %.3f, precision %.3f "
              "(%lld detections)\n",
              eval_name.c_str(), static_cast<long long>(n.found), static_cast<long long>(n.objects),
              static_cast<double>(n.found) / static_cast<double>(std::max<std::int64_t>(n.objects, 1)),
              static_cast<double>(n.matched) / static_cast<double>(std::max<std::int64_t>(n.detections, 1)),
              static_cast<long long>(n.detections));
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const fs::path root = args.folder.empty() ? demo_folder(args) : fs::path(args.folder);
  if (fs::is_directory(root / "images" / "train")) {
    const nitro::data::YoloDataset train(root / "images" / "train");
    if (fs::is_directory(root / "images" / "val")) run(args, train, nitro::data::YoloDataset(root / "images" / "val"), "val");
    else run(args, train, train, "train (no val split)");
  } else {
    const nitro::data::YoloDataset train(root);
    run(args, train, train, "train (no val split)");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "detection: %s\n", e.what());
  return 1;
}
