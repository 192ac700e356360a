#pragma once
// Folders of images as data sets, and the per-sample steps that make images of any size into one batch.
// Link nitro::image (TurboJPEG and libpng; data/image.hpp).
//
//   nitro::data::ImageFolder train("imagenet/train");        // classes = sorted subfolders (torchvision's)
//   nitro::data::YoloDataset coco("coco128");                // images/ and labels/ side by side (Ultralytics)
//
//   namespace sample = nitro::data::sample;
//   auto batches = nitro::data::ImageBatches(train, sample::RandomResizedCrop{.height = 224, .width = 224},
//                                            {.seed = 7});
//   auto source = nitro::from_dataset(batches, nitro::data::ResumableSampler(train.size(), {.seed = 7}), 64);
//   // each batch: a RecordBatch {data uint8 [64, 3, 224, 224], target int64 [64], index int64 [64]},
//   // then the batched stages of data/augment.hpp (flip, jitter, normalise) on the workers or the GPU.
//
// ImageFolder: root/<class>/**/<file>, the classes the sorted names of root's subfolders and the files
// in torchvision's order (each class's folder walked recursively, folders in sorted path order, files
// sorted within each), with torchvision's extensions (IMG_EXTENSIONS, case-insensitive), so
// class_to_idx() and the sample order equal torchvision.datasets.ImageFolder's. Nitro decodes JPEG and
// PNG: another format listed there (.bmp, .webp, ...) is an error when read, naming the file, or a
// skipped file (ImageBatchOptions::skip_bad).
//
// YoloDataset: the Ultralytics layout. Every JPEG or PNG under root/images (or under root, when root is
// itself an images folder, e.g. coco/images/train2017), in sorted path order; each image's labels in
// the file named by replacing the last "/images/" of its path with "/labels/" and its extension with
// ".txt"; one box a line, `class cx cy w h`, the centre and size as fractions of the image (0..1).
// A missing label file is an image with no boxes; a malformed line is a nitro::Error naming file:line.
// Labels are read once, when the data set is made. Boxes come as data/augment.hpp's stages take them:
// float [n, 5] rows (class, cx, cy, w, h).
//
// Per-sample geometry (namespace sample), each taking the encoded bytes to a fixed-size uint8 image:
//   Resize             to height x width (the aspect not kept), antialiased bilinear
//   ResizeCenterCrop   the shorter side to `resize`, then the centre height x width (validation)
//   RandomResizedCrop  torchvision's crop (scale, ratio) drawn from the keyed generator of
//                      data/augment.hpp (seed, epoch, the sample's index, stage `kStage`): the same
//                      crop for a sample in any batch, on any worker, after a resume. Only the crop's
//                      region of a JPEG is decoded (image::DecodeOptions::partial: the rows above it
//                      entropy-decoded only, those below not at all), and its size picks the reduction
//                      (draft): a crop at least twice the output is decoded at 1/2 (or 1/4, 1/8), then
//                      resized. The pixels are those of a whole decode's window.
//   Letterbox          YOLO's: the longer side to `size` keeping the aspect, centred on a size x size
//                      canvas of grey 114; the boxes follow
// With `draft` (default on) a JPEG is decoded at the largest reduction 1/2, 1/4, 1/8 that keeps what is
// resized at least the output's size, as PIL's draft does: several times faster for photographs larger
// than the output, and not the pixels of a full decode (resizing from a reduced decode is slightly
// softer); `draft = false` decodes at full size.
//
// ImageBatches (classification; a RecordBatch) and DetectionBatches (YOLO; a DetectionBatch with one
// boxes tensor per sample) are torch::data batch data sets over any source of encoded images: an
// ImageFolder, a YoloDataset, or a packed file (data/packed.hpp). The source concept, EncodedImages:
// size(), encoded(i) (bytes: a std::vector<std::uint8_t> or a span viewing a mapping), label(i),
// name(i), and for detection boxes(i). get_batch decodes and resizes each sample on the calling worker
// (from_dataset's N workers, or a data::Pipeline stage). set_epoch(e) (DatasetSource forwards its own)
// keys the random crops; copies made for workers share the epoch and the skip counts.
// skip_bad: a file that cannot be decoded (nitro::Error) is left out of its batch (which is then
// smaller) and counted: skipped(), skipped_names(). Without it the error reaches the consumer.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/record_file.hpp>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::data {

/// torchvision's IMG_EXTENSIONS (torchvision/datasets/folder.py).
NITRO_INLINE const std::vector<std::string>& torchvision_extensions();

namespace detail::images {

NITRO_INLINE std::string lower(std::string s);
NITRO_INLINE bool has_extension(const std::string& name, const std::vector<std::string>& extensions);
NITRO_INLINE bool is_dir(const std::filesystem::path& p);
/// Files under `dir` in sorted(os.walk(dir)) order: folders by their path string, files by name.
NITRO_INLINE void walk(const std::string& dir, const std::vector<std::string>& extensions, std::vector<std::string>& out);
NITRO_INLINE std::string trim_slash(std::string s);

}  // namespace detail::images

/// Options of ImageFolder: which files are samples, whether empty classes are allowed, how get(i) decodes.
struct ImageFolderOptions {
  /// Files with these endings (case-insensitive) are samples; torchvision's by default.
  std::vector<std::string> extensions = torchvision_extensions();
  /// Classes with no file are allowed (torchvision's allow_empty); by default they are an error.
  bool allow_empty = false;
  /// How get(i) decodes (ImageBatches decodes with its geometry's own options).
  image::DecodeOptions decode = {};
};

/// `root/<class>/**/<image>`: torchvision.datasets.ImageFolder's classes and order.
class ImageFolder : public torch::data::datasets::Dataset<ImageFolder> {
 public:
  /// Lists the classes (root's subfolders, sorted) and their files once; copies share the list.
  /// Throws nitro::Error when root is not a folder, cannot be listed or has no class folder, or when a
  /// class has no file with one of the extensions and options.allow_empty is false.
  NITRO_INLINE explicit ImageFolder(const std::filesystem::path& root, ImageFolderOptions options = {});

  /// The root folder as given (without a trailing slash).
  [[nodiscard]] const std::string& root() const noexcept { return d_->root; }
  /// The class names, sorted: label k is classes()[k].
  [[nodiscard]] const std::vector<std::string>& classes() const noexcept { return d_->classes; }
  /// Each class name's label, as torchvision's class_to_idx.
  [[nodiscard]] const std::map<std::string, std::int64_t>& class_to_idx() const noexcept { return d_->class_to_idx; }
  /// The number of samples (image files in all the classes).
  [[nodiscard]] std::optional<size_t> size() const override { return d_->paths.size(); }
  /// The path of sample i (root + "/" + class + "/" + ..., as torchvision's samples[i][0]).
  [[nodiscard]] const std::string& path(std::size_t i) const { return d_->paths.at(i); }
  /// The name error messages and skipped_names() give sample i: its path.
  [[nodiscard]] const std::string& name(std::size_t i) const { return path(i); }
  /// Sample i's class index (0 .. classes().size() - 1). Throws std::out_of_range past size().
  [[nodiscard]] std::int64_t label(std::size_t i) const { return d_->labels.at(i); }
  /// The file's bytes, read now.
  [[nodiscard]] std::vector<std::uint8_t> encoded(std::size_t i) const { return image::read_file(path(i)); }
  /// The decoded image (uint8 [3, H, W] by default; ImageFolderOptions::decode) and its class.
  NITRO_INLINE torch::data::Example<> get(size_t i) override;

 private:
  struct Data {
    std::string root;
    ImageFolderOptions options;
    std::vector<std::string> classes;
    std::map<std::string, std::int64_t> class_to_idx;
    std::vector<std::string> paths;
    std::vector<std::int64_t> labels;
  };
  std::shared_ptr<Data> d_;  // copies (one per worker) share the list
};

/// Options of YoloDataset: which files are images, and how strictly label coordinates are checked.
struct YoloOptions {
  /// The image files (case-insensitive endings): those Nitro decodes.
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"};
  /// Each coordinate must lie in [0, 1] (Ultralytics refuses "non-normalized or out of bounds
  /// coordinates"); false accepts any finite value.
  bool check_normalised = true;
};

/// The Ultralytics layout: images/ and labels/ side by side, one `class cx cy w h` line per box.
class YoloDataset {
 public:
  /// Lists the images under root/images (or root itself, when it is an images folder) and reads every
  /// label file once. Throws nitro::Error when root is not a folder, has no images/ folder, holds no
  /// image, or a label file is unreadable or has a malformed line (the message names file:line).
  NITRO_INLINE explicit YoloDataset(const std::filesystem::path& root, YoloOptions options = {});

  /// Where an image's labels are: the last "/images/" of its path made "/labels/", the extension ".txt".
  [[nodiscard]] NITRO_INLINE static std::string label_path(const std::string& image_path);

  /// The number of images.
  [[nodiscard]] std::size_t size() const noexcept { return d_->paths.size(); }
  /// The path of image i, in sorted path order. Throws std::out_of_range past size().
  [[nodiscard]] const std::string& path(std::size_t i) const { return d_->paths.at(i); }
  /// The name error messages and skipped_names() give image i: its path.
  [[nodiscard]] const std::string& name(std::size_t i) const { return path(i); }
  /// The file's bytes, read now.
  [[nodiscard]] std::vector<std::uint8_t> encoded(std::size_t i) const { return image::read_file(path(i)); }
  /// Detection has no one class per image: -1.
  [[nodiscard]] std::int64_t label(std::size_t /*i*/) const noexcept { return -1; }
  /// Sample i's boxes: float [n, 5] rows (class, cx, cy, w, h), n = 0 without a label file.
  [[nodiscard]] NITRO_INLINE at::Tensor boxes(std::size_t i) const;
  /// Boxes in all the label files.
  [[nodiscard]] std::int64_t box_count() const noexcept { return static_cast<std::int64_t>(d_->rows.size() / 5); }
  /// Images with no label file.
  [[nodiscard]] std::int64_t unlabelled() const noexcept { return d_->missing; }

 private:
  struct Data {
    std::string root;
    std::vector<std::string> paths;
    std::vector<float> rows;          // 5 per box, all images
    std::vector<std::int64_t> first;  // image i's boxes are rows [first[i], first[i + 1])
    std::int64_t missing = 0;
  };

  NITRO_INLINE void read_labels(const std::string& file, const YoloOptions& o);

  std::shared_ptr<Data> d_;
};

/// What ImageBatches reads: encoded images with a label each and a name for messages.
template <class S>
concept EncodedImages = std::copy_constructible<S> && requires(const S& s, std::size_t i) {
  { s.encoded(i) };
  requires std::convertible_to<decltype(s.encoded(i)), std::span<const std::uint8_t>>;
  { s.label(i) } -> std::convertible_to<std::int64_t>;
  { s.name(i) } -> std::convertible_to<std::string>;
};
/// ... with boxes, for DetectionBatches.
template <class S>
concept EncodedDetections = EncodedImages<S> && requires(const S& s, std::size_t i) {
  { s.boxes(i) } -> std::convertible_to<at::Tensor>;
};

namespace sample {

/// The key of one sample's draws: data/augment.hpp's generator for (seed, epoch, index, stage).
struct Key {
  std::uint64_t seed = 0;   ///< ImageBatchOptions::seed.
  std::int64_t epoch = 0;   ///< The epoch set by set_epoch (0 before any).
  std::int64_t index = 0;   ///< The sample's index in the data set.
};
/// The stage number of the per-sample geometry's draws (after it, a batched augment::Compose numbers
/// its stages 0, 1, ...; this one cannot collide with them).
inline constexpr int kStage = 1 << 20;

namespace detail {
/// The decoded (part of the) image, [h0, w0, 3] uint8 as decoded (HWC: no transposition), resized to
/// h x w into `out` ([3, h, w] uint8), antialiased bilinear. Resized as a channels-last view, where
/// ATen's uint8 kernel is fastest, then written into the slot's planes.
NITRO_INLINE void resize_into(const at::Tensor& hwc, const at::Tensor& out);
NITRO_INLINE image::DecodeOptions decode_options(bool draft, bool fast, std::int64_t min_h, std::int64_t min_w);
}  // namespace detail

/// To height x width, the aspect not kept.
struct Resize {
  std::int64_t height = 224;  ///< Output height in pixels (>= 1).
  std::int64_t width = 224;   ///< Output width in pixels (>= 1).
  bool draft = true;  ///< Decode a JPEG at a reduced scale (1/2, 1/4, 1/8) that still covers the output.
  bool fast = false;  ///< libjpeg-turbo's fast IDCT and upsampling

  /// {height, width} of every image this makes.
  [[nodiscard]] std::array<std::int64_t, 2> output_size() const { return {height, width}; }
  /// Throws nitro::Error unless height and width are >= 1.
  NITRO_INLINE void validate() const;
  /// Decodes `bytes` and resizes the image into `out` (uint8 [3, height, width]); boxes, being
  /// fractions of the image, need no change. Throws nitro::Error, naming `name`, on a bad image.
  void operator()(std::span<const std::uint8_t> bytes, std::string_view name, const Key&, const at::Tensor& out,
                  at::Tensor* = nullptr) const {
    detail::resize_into(image::decode(bytes, detail::decode_options(draft, fast, height, width), name), out);
  }
};

/// The shorter side to `resize` (torchvision's Resize(int)), then the centre height x width.
struct ResizeCenterCrop {
  std::int64_t resize = 256;  ///< The shorter side's length after resizing, in pixels (>= height, width).
  std::int64_t height = 224;  ///< Height of the centre crop, in pixels (>= 1).
  std::int64_t width = 224;   ///< Width of the centre crop, in pixels (>= 1).
  bool draft = true;  ///< Decode a JPEG at a reduced scale (1/2, 1/4, 1/8) that still covers the output.
  bool fast = false;  ///< libjpeg-turbo's fast IDCT and upsampling

  /// {height, width} of every image this makes.
  [[nodiscard]] std::array<std::int64_t, 2> output_size() const { return {height, width}; }
  /// Throws nitro::Error unless height and width are >= 1 and at most resize.
  NITRO_INLINE void validate() const;
  /// Decodes the window of `bytes` that becomes the centre crop and resizes it into `out` (uint8
  /// [3, height, width]); boxes, if given, are moved with the crop. Throws nitro::Error, naming `name`,
  /// on a bad image.
  void operator()(std::span<const std::uint8_t> bytes, std::string_view name, const Key&, const at::Tensor& out,
                  at::Tensor* boxes = nullptr) const {
    const auto info = image::probe(bytes, name);
    const double s = static_cast<double>(resize) / static_cast<double>(std::min(info.height, info.width));
    // The full-size window that becomes the centre crop once the shorter side is `resize`.
    const auto ch = std::min(info.height, static_cast<std::int64_t>(std::ceil(static_cast<double>(height) / s))),
               cw = std::min(info.width, static_cast<std::int64_t>(std::ceil(static_cast<double>(width) / s)));
    image::DecodeOptions o = detail::decode_options(draft, fast, height, width);
    o.crop = image::Window{(info.height - ch) / 2, (info.width - cw) / 2, ch, cw};
    detail::resize_into(image::decode(bytes, o, name), out);
    if (boxes != nullptr && boxes->size(0) > 0)  // the window maps linearly onto the output, as a crop's
      *boxes = data::augment::RandomResizedCrop{.height = height, .width = width}
                   .crop_boxes({*boxes}, {{o.crop->top, o.crop->left, ch, cw}}, info.height, info.width)[0];
  }
};

/// torchvision's RandomResizedCrop drawn per sample from its key; the crop picks the JPEG reduction.
struct RandomResizedCrop {
  std::int64_t height = 224;  ///< Output height in pixels (>= 1).
  std::int64_t width = 224;   ///< Output width in pixels (>= 1).
  /// The least crop area, as a fraction of the image's area (> 0).
  double scale_min = 0.08, scale_max = 1.0;  ///< The most crop area, as a fraction of the image's area (<= 1).
  /// The least crop aspect ratio, width / height (> 0); the ratio is drawn log-uniform.
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< The most crop aspect ratio, width / height.
  bool draft = true;  ///< Decode a JPEG at a reduced scale (1/2, 1/4, 1/8) that still covers the output.
  bool fast = false;  ///< libjpeg-turbo's fast IDCT and upsampling

  /// {height, width} of every image this makes.
  [[nodiscard]] std::array<std::int64_t, 2> output_size() const { return {height, width}; }
  /// Throws nitro::Error unless height, width >= 1, 0 < scale_min <= scale_max <= 1 and
  /// 0 < ratio_min <= ratio_max.
  NITRO_INLINE void validate() const;
  /// Sample `key`'s crop of an h x w image: top, left, height, width (the draw augment:: makes).
  [[nodiscard]] NITRO_INLINE std::array<std::int64_t, 4> crop(const Key& key, std::int64_t h, std::int64_t w) const;
  /// Decodes `key`'s crop of `bytes` and resizes it into `out` (uint8 [3, height, width]); boxes, if
  /// given, are moved with the crop. Throws nitro::Error, naming `name`, on a bad image.
  void operator()(std::span<const std::uint8_t> bytes, std::string_view name, const Key& key, const at::Tensor& out,
                  at::Tensor* boxes = nullptr) const {
    const auto info = image::probe(bytes, name);
    const auto c = crop(key, info.height, info.width);
    image::DecodeOptions o = detail::decode_options(draft, fast, height, width);
    o.crop = image::Window{c[0], c[1], c[2], c[3]};
    detail::resize_into(image::decode(bytes, o, name), out);
    if (boxes != nullptr && boxes->size(0) > 0) *boxes = as_augment().crop_boxes({*boxes}, {c}, info.height, info.width)[0];
  }

 private:
  [[nodiscard]] NITRO_INLINE data::augment::RandomResizedCrop as_augment() const;
};

/// YOLO's letterbox: the longer side to `size` (only down unless scaleup), centred on a size x size
/// canvas of `pad`; boxes (fractions of the image) become fractions of the canvas.
struct Letterbox {
  std::int64_t size = 640;  ///< The square canvas's side, in pixels (>= 1).
  std::uint8_t pad = 114;   ///< The grey level of the canvas around the image.
  bool scaleup = true;      ///< Enlarge images smaller than the canvas; false only shrinks.
  bool draft = true;  ///< Decode a JPEG at a reduced scale (1/2, 1/4, 1/8) that still covers the output.
  bool fast = false;  ///< libjpeg-turbo's fast IDCT and upsampling

  /// {size, size}.
  [[nodiscard]] std::array<std::int64_t, 2> output_size() const { return {size, size}; }
  /// Throws nitro::Error unless size >= 1.
  void validate() const { NITRO_CHECK(size >= 1, "data::sample::Letterbox: size must be >= 1; got ", size); }
  /// Where an h x w image lands: its resized height and width and the top and left padding (Ultralytics'
  /// LetterBox: r = min(size / h, size / w), the new size rounded, the padding split, round(d - 0.1)).
  [[nodiscard]] NITRO_INLINE std::array<std::int64_t, 4> placement(std::int64_t h, std::int64_t w) const;
  /// Decodes `bytes`, fills `out` (uint8 [3, size, size]) with `pad` and resizes the image onto it at
  /// placement(); boxes, if given, become fractions of the canvas. Throws nitro::Error, naming `name`,
  /// on a bad image.
  void operator()(std::span<const std::uint8_t> bytes, std::string_view name, const Key&, const at::Tensor& out,
                  at::Tensor* boxes = nullptr) const {
    const auto info = image::probe(bytes, name);
    const auto [nh, nw, top, left] = placement(info.height, info.width);
    out.fill_(pad);
    detail::resize_into(image::decode(bytes, detail::decode_options(draft, fast, nh, nw), name),
                        out.slice(1, top, top + nh).slice(2, left, left + nw));
    if (boxes != nullptr && boxes->size(0) > 0) {
      auto b = boxes->clone();
      const double s = static_cast<double>(size);
      b.select(1, 1).mul_(static_cast<double>(nw) / s).add_(static_cast<double>(left) / s);
      b.select(1, 2).mul_(static_cast<double>(nh) / s).add_(static_cast<double>(top) / s);
      b.select(1, 3).mul_(static_cast<double>(nw) / s);
      b.select(1, 4).mul_(static_cast<double>(nh) / s);
      *boxes = b;
    }
  }
};

}  // namespace sample

/// A per-sample geometry: a fixed output size, and a call that fills one [3, h, w] uint8 slot.
template <class G>
concept SampleGeometry = std::copy_constructible<G> && requires(const G& g, std::span<const std::uint8_t> b,
                                                                const sample::Key& k, const at::Tensor& out, at::Tensor* boxes) {
  { g.output_size() } -> std::convertible_to<std::array<std::int64_t, 2>>;
  g.validate();
  g(b, std::string_view{}, k, out, boxes);
};

/// Options of ImageBatches and DetectionBatches.
struct ImageBatchOptions {
  /// The seed of the per-sample draws (the random crops).
  std::uint64_t seed = 0;
  /// Leave out, and count, samples whose file cannot be decoded, instead of failing the batch.
  bool skip_bad = false;
};

/// A batch of detection samples: images uint8 [N, 3, h, w], one float [n_i, 5] boxes tensor each (as
/// data/augment.hpp's Compose takes them), and the data-set indices.
struct DetectionBatch {
  at::Tensor data;                ///< The images, uint8 [N, 3, h, w].
  std::vector<at::Tensor> boxes;  ///< Sample k's boxes, float [n_k, 5] rows (class, cx, cy, w, h).
  at::Tensor index;               ///< The samples' data-set indices, int64 [N].
  /// A copy with `f` applied to every tensor (data, each boxes tensor, index): how Nitro moves the
  /// batch between devices (nitro::map_tensors, core/device.hpp).
  template <class F>
  friend DetectionBatch nitro_map_tensors(const DetectionBatch& b, F&& f) {
    std::vector<at::Tensor> boxes;
    boxes.reserve(b.boxes.size());
    for (const auto& t : b.boxes) boxes.push_back(f(t));
    return {f(b.data), std::move(boxes), f(b.index)};
  }
};

namespace detail::images {

inline std::size_t source_size(const auto& s) {
  if constexpr (requires { s.size().value(); }) return s.size().value();
  else return static_cast<std::size_t>(s.size());
}

/// What ImageBatches and DetectionBatches share: the source, the geometry, the epoch, the skips.
template <class Source, class Geometry>
class Batcher {
 public:
  Batcher(Source source, Geometry geometry, ImageBatchOptions options)
      : source_(std::move(source)), geometry_(std::move(geometry)), options_(options), shared_(std::make_shared<Shared>()) {
    geometry_.validate();
  }
  /// The epoch the random crops are keyed by; copies (one per worker) share it.
  void set_epoch(std::int64_t epoch) { shared_->epoch.store(epoch); }
  [[nodiscard]] std::int64_t epoch() const { return shared_->epoch.load(); }
  /// Samples left out (skip_bad) so far, by this data set and its copies.
  [[nodiscard]] std::int64_t skipped() const { return shared_->skipped.load(); }
  [[nodiscard]] std::vector<std::string> skipped_names() const {
    std::lock_guard g(shared_->mutex);
    return shared_->names;
  }
  [[nodiscard]] const Source& source() const noexcept { return source_; }
  [[nodiscard]] const Geometry& geometry() const noexcept { return geometry_; }

 protected:
  /// Fills slot k of `images` (and, for detection, `boxes`) with sample i; false if it was skipped.
  void check_index(std::size_t i, const char* who) const {
    NITRO_CHECK(i < source_size(source_), "data::", who, ": index ", i, " of a data set of ", source_size(source_));
  }
  bool fill(std::size_t i, const at::Tensor& slot, at::Tensor* boxes) const {
    try {
      const auto bytes = source_.encoded(i);
      const std::span<const std::uint8_t> view(bytes);
      const sample::Key key{options_.seed, shared_->epoch.load(), static_cast<std::int64_t>(i)};
      geometry_(view, source_.name(i), key, slot, boxes);
      return true;
    } catch (const nitro::Error& e) {
      if (!options_.skip_bad) throw;
      shared_->skipped.fetch_add(1);
      std::lock_guard g(shared_->mutex);
      if (shared_->names.size() < 1000) shared_->names.push_back(std::string(source_.name(i)));
      return false;
    }
  }
  [[nodiscard]] at::Tensor images(std::int64_t n) const {
    const auto [h, w] = geometry_.output_size();
    return at::empty({n, 3, h, w}, at::kByte);
  }

  Source source_;
  Geometry geometry_;
  ImageBatchOptions options_;

 private:
  struct Shared {
    std::atomic<std::int64_t> epoch{0};
    std::atomic<std::int64_t> skipped{0};
    mutable std::mutex mutex;
    std::vector<std::string> names;
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace detail::images

/// Classification batches from encoded images: get_batch(indices) -> RecordBatch {data uint8
/// [N, 3, h, w], target int64 [N], index int64 [N]} (N smaller when skip_bad left samples out).
template <EncodedImages Source, SampleGeometry Geometry>
class ImageBatches : public torch::data::datasets::BatchDataset<ImageBatches<Source, Geometry>, RecordBatch, std::vector<size_t>>,
                     public detail::images::Batcher<Source, Geometry> {
  using Base = detail::images::Batcher<Source, Geometry>;

 public:
  /// Batches of `source`'s images made by `geometry`. Throws nitro::Error when geometry.validate() does.
  ImageBatches(Source source, Geometry geometry, ImageBatchOptions options = {})
      : Base(std::move(source), std::move(geometry), options) {}

  /// Decodes samples `indices` on the calling thread. Throws nitro::Error on an index past size(), or,
  /// without skip_bad, on a file that cannot be decoded.
  RecordBatch get_batch(std::vector<size_t> indices) override {
    const auto n = static_cast<std::int64_t>(indices.size());
    auto data = this->images(n);
    auto target = at::empty({n}, at::kLong);
    auto index = at::empty({n}, at::kLong);
    auto* t = target.data_ptr<std::int64_t>();
    auto* ix = index.data_ptr<std::int64_t>();
    std::int64_t kept = 0;
    for (const auto i : indices) {
      this->check_index(i, "ImageBatches");
      if (!this->fill(i, data[kept], nullptr)) continue;
      t[kept] = this->source_.label(i);
      ix[kept] = static_cast<std::int64_t>(i);
      ++kept;
    }
    if (kept < n) return {data.slice(0, 0, kept), target.slice(0, 0, kept), index.slice(0, 0, kept)};
    return {std::move(data), std::move(target), std::move(index)};
  }
  /// The source's number of samples.
  [[nodiscard]] std::optional<size_t> size() const override { return detail::images::source_size(this->source_); }
};

/// Detection batches: get_batch(indices) -> DetectionBatch, each sample's boxes moved with its pixels.
template <EncodedDetections Source, SampleGeometry Geometry>
class DetectionBatches
    : public torch::data::datasets::BatchDataset<DetectionBatches<Source, Geometry>, DetectionBatch, std::vector<size_t>>,
      public detail::images::Batcher<Source, Geometry> {
  using Base = detail::images::Batcher<Source, Geometry>;

 public:
  /// Batches of `source`'s images and boxes made by `geometry`. Throws nitro::Error when
  /// geometry.validate() does.
  DetectionBatches(Source source, Geometry geometry, ImageBatchOptions options = {})
      : Base(std::move(source), std::move(geometry), options) {}

  /// Decodes samples `indices` on the calling thread. Throws nitro::Error on an index past size(), or,
  /// without skip_bad, on a file that cannot be decoded.
  DetectionBatch get_batch(std::vector<size_t> indices) override {
    const auto n = static_cast<std::int64_t>(indices.size());
    DetectionBatch b{this->images(n), {}, at::empty({n}, at::kLong)};
    b.boxes.reserve(indices.size());
    auto* ix = b.index.data_ptr<std::int64_t>();
    std::int64_t kept = 0;
    for (const auto i : indices) {
      this->check_index(i, "DetectionBatches");
      at::Tensor boxes = this->source_.boxes(i);
      if (!this->fill(i, b.data[kept], &boxes)) continue;
      b.boxes.push_back(std::move(boxes));
      ix[kept] = static_cast<std::int64_t>(i);
      ++kept;
    }
    if (kept < n) b.data = b.data.slice(0, 0, kept), b.index = b.index.slice(0, 0, kept);
    return b;
  }
  /// The source's number of samples.
  [[nodiscard]] std::optional<size_t> size() const override { return detail::images::source_size(this->source_); }
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/image_folder-inl.hpp>
#endif
