#pragma once
// Encoded images to ready training batches on the GPU: the CPU workers only read each sample's bytes
// (from a packed file or an ImageFolder), and the prefetcher's transform decodes them with nvJPEG on
// its copy stream, then crops, resizes, flips and normalises them there, so the training step
// receives a float batch on the GPU.
//
//   namespace data = nitro::data;
//   data::PackedImages images("train.npak");                       // or data::ImageFolder("train/")
//   data::ResumableSampler sampler(images.size(), {.seed = 7});
//   auto source = nitro::from_dataset(data::JpegBatches(images, {.seed = 7}), sampler, 256);
//   nitro::Prefetcher<nitro::Cuda, decltype(source)> batches{
//       std::move(source),
//       {.depth = 3, .workers = 4, .transform = data::DecodeAugment({.height = 224, .width = 224})}};
//   for (auto& b : batches) loop.step(b, loss_fn);  // b.data float [256, 3, 224, 224] on the GPU
//
// JpegBatches (a torch::data batch data set, read by from_dataset's workers): get_batch(indices) ->
// JpegBatch {data undefined, target int64 [N], index int64 [N], encoded: the samples' bytes on the
// host, their indices, the seed and the epoch}. A packed file's bytes are views of its mapping (no
// copy); an ImageFolder's files are read. Nothing is decoded there.
//
// DecodeAugment, the device stage (PrefetchOptions::transform, or called directly), makes `data`:
//   1. decode: on a CUDA device with nvJPEG (image::NvJpeg::available()), every file of the batch in
//      one nvjpegDecodeBatched on the current stream (inside Prefetcher<Cuda>'s transform: its copy
//      stream) into uint8 CUDA tensors of LibTorch's caching allocator; files nvJPEG refuses (CMYK,
//      PNG, truncated, ...) go to image::decode inside NvJpeg::decode, as data/nvjpeg.hpp says. On the
//      CPU, or where nvJPEG is not available, each file with image::decode (libjpeg-turbo).
//   2. crop and resize each image: the crop box drawn from the sample's key exactly as
//      augment::RandomResizedCrop draws it (stage 0 of Compose<RandomResizedCrop, HFlip, Normalize>:
//      the generator of (seed, epoch, index, 0)), the crop cut out (a view), made float in [0, 1] and
//      resized to height x width with at::upsample_bilinear2d (align_corners = false, no antialias:
//      what augment::RandomResizedCrop computes with its grid_sample, equal to a float rounding).
//   3. flip: left-right with probability `flip`, drawn as augment::HFlip draws it (stage 1).
//   4. normalise: (x - mean) / std per channel, on the whole batch; then the dtype asked for (float32,
//      bfloat16 or float16) and, if asked, the channels-last layout.
// So a sample gets the same crop box and flip on the CPU and on a GPU, in any batch, with any number
// of workers, and after a resume. The pixels differ between the two decoders (nvJPEG's IDCT and
// chroma upsampling are not libjpeg-turbo's: a mean difference under 2/255 before normalising) and by
// a float rounding between CPU and GPU kernels.
//
// Where the host waits for the GPU: nowhere in the stage's own work (the keys and crop boxes are
// computed on the host from the batch's host copy of its indices; no tensor is copied from pageable
// memory; output memory comes from the caching allocator). nvJPEG may synchronise inside
// nvjpegDecodeBatched (its CPU and hybrid backends finish their host phase there), and a file nvJPEG
// refuses is copied from pageable memory to the GPU (NvJpeg::decode's fallback, a synchronous copy on
// the copy stream). Without nvJPEG on a CUDA device the whole batch is made on the CPU, staged in
// pinned memory and copied without blocking. All of it runs on the prefetcher's worker threads, never
// on the training thread.
//
// Exact resume: JpegBatches' draws are keyed by (seed, epoch, index), the epoch the sampler's
// (from_dataset forwards it); save the ResumableSampler's state() and load it into a fresh sampler,
// and a fresh pipeline delivers the same later batches, bit for bit on the same device.
// Errors (a corrupt or truncated file) are nitro::Errors naming the sample: its index and its name
// (the file's path, or the name a packed file holds), delivered at that batch by the prefetcher.
// Link nitro::image (TurboJPEG and libpng; data/image.hpp).
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/data/image_folder.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/data/datasets/base.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro::data {

/// The encoded images of one batch, on the host, with what keys their random draws.
struct EncodedFiles {
  /// Sample k's encoded bytes (JPEG, or PNG), viewing `owned` or the source's memory (a packed file's
  /// mapping), which this object keeps alive.
  std::vector<std::span<const std::uint8_t>> files;
  /// The bytes of files read for this batch (an ImageFolder's), which `files` views.
  std::vector<std::vector<std::uint8_t>> owned;
  /// Sample k's data-set index: its key, with `seed` and `epoch`.
  std::vector<std::int64_t> index;
  std::uint64_t seed = 0;  ///< The seed of the draws (JpegBatchesOptions::seed).
  std::int64_t epoch = 0;  ///< The epoch of the draws (the sampler's).
  /// The name of the sample with data-set index i, for error messages (its path, or the name a packed
  /// file holds). Holds the source, so that views of its memory stay valid.
  std::function<std::string(std::int64_t)> name;
  /// What keeps the memory `files` views alive, besides `name` (a source given by the caller).
  std::shared_ptr<const void> keep;
};

/// A batch of JpegBatches: before DecodeAugment, its encoded files with labels and indices; after it,
/// the images too.
struct JpegBatch {
  /// The images, [N, 3, height, width] on the device, normalised, in DecodeAugmentOptions::dtype;
  /// undefined until DecodeAugment made them.
  at::Tensor data;
  /// The labels, int64 [N] (on the device, once a Prefetcher<Cuda> moved the batch).
  at::Tensor target;
  /// The samples' data-set indices, int64 [N] (on the device, once a Prefetcher<Cuda> moved the batch).
  at::Tensor index;
  /// The encoded files on the host; DecodeAugment drops them once decoded.
  std::shared_ptr<const EncodedFiles> encoded;
  /// A copy with `f` applied to data, target and index (the encoded files are shared, not copied, and
  /// never moved to a device): how Nitro moves the batch (nitro::map_tensors, core/device.hpp).
  template <class F>
  friend JpegBatch nitro_map_tensors(const JpegBatch& b, F&& f) {
    return {f(b.data), f(b.target), f(b.index), b.encoded};
  }
};

/// Options of JpegBatches.
struct JpegBatchesOptions {
  /// The seed of the per-sample draws (crop boxes and flips): the keys are (seed, epoch, index).
  std::uint64_t seed = 0;
};

namespace detail::jpeg {

inline std::size_t size_of(const auto& s) {
  if constexpr (requires { s.size().value(); }) return s.size().value();
  else return static_cast<std::size_t>(s.size());
}

/// "sample <i> (<name>)", or "sample <i>" when there is no name.
NITRO_INLINE std::string sample_name(const EncodedFiles& e, std::size_t k);

}  // namespace detail::jpeg

/// Batches of encoded images from any EncodedImages source (data::PackedImages, data::ImageFolder):
/// get_batch(indices) -> JpegBatch with the bytes, labels and keys, nothing decoded. Copies (one per
/// from_dataset worker) share the source and the epoch.
///   auto source = nitro::from_dataset(nitro::data::JpegBatches(images, {.seed = 7}), sampler, 256);
/// \tparam Source an EncodedImages (data/image_folder.hpp): size(), encoded(i) (bytes: a std::vector
///         read now, or a span viewing memory the source owns), label(i), name(i).
template <EncodedImages Source>
class JpegBatches : public torch::data::datasets::BatchDataset<JpegBatches<Source>, JpegBatch, std::vector<size_t>> {
 public:
  /// Batches of `source`'s samples, the draws keyed by options.seed. Throws nitro::Error when the
  /// source has no sample.
  explicit JpegBatches(Source source, JpegBatchesOptions options = {})
      : source_(std::make_shared<const Source>(std::move(source))),
        options_(options),
        epoch_(std::make_shared<std::atomic<std::int64_t>>(0)) {
    NITRO_CHECK(detail::jpeg::size_of(*source_) > 0,
                "data::JpegBatches: the source has no sample; give a packed file or a folder with images");
  }

  /// Samples `indices`: their bytes (a packed file's viewed, a folder's files read now), labels and
  /// keys, on the calling thread. Throws nitro::Error on an index past size(), or what the source
  /// throws (a file that cannot be read, naming it).
  JpegBatch get_batch(std::vector<size_t> indices) override {
    const auto n = static_cast<std::int64_t>(indices.size());
    auto files = std::make_shared<EncodedFiles>();
    files->seed = options_.seed;
    files->epoch = epoch_->load();
    files->files.reserve(indices.size());
    files->index.reserve(indices.size());
    auto target = at::empty({n}, at::kLong);
    auto index = at::empty({n}, at::kLong);
    auto* t = target.data_ptr<std::int64_t>();
    auto* ix = index.data_ptr<std::int64_t>();
    const auto size = detail::jpeg::size_of(*source_);
    using Bytes = std::remove_cvref_t<decltype(source_->encoded(std::size_t{0}))>;
    if constexpr (!std::is_same_v<Bytes, std::span<const std::uint8_t>>) files->owned.reserve(indices.size());
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const auto i = indices[k];
      NITRO_CHECK(i < size, "data::JpegBatches: index ", i, " of a data set of ", size);
      if constexpr (std::is_same_v<Bytes, std::span<const std::uint8_t>>) {
        files->files.push_back(source_->encoded(i));  // a view of memory the source owns (kept below)
      } else {
        files->owned.emplace_back(source_->encoded(i));
        const auto& b = files->owned.back();
        files->files.emplace_back(b.data(), b.size());
      }
      files->index.push_back(static_cast<std::int64_t>(i));
      t[k] = static_cast<std::int64_t>(source_->label(i));
      ix[k] = static_cast<std::int64_t>(i);
    }
    files->name = [source = source_](std::int64_t i) { return std::string(source->name(static_cast<std::size_t>(i))); };
    files->keep = source_;
    return {at::Tensor(), std::move(target), std::move(index), std::move(files)};
  }

  /// The source's number of samples.
  [[nodiscard]] std::optional<size_t> size() const override { return detail::jpeg::size_of(*source_); }
  /// The epoch the draws are keyed by (from_dataset sets the sampler's); copies share it.
  void set_epoch(std::int64_t epoch) { epoch_->store(epoch); }
  /// The epoch the draws are keyed by.
  [[nodiscard]] std::int64_t epoch() const { return epoch_->load(); }
  /// The source, shared by every copy of this data set.
  [[nodiscard]] const Source& source() const noexcept { return *source_; }
  /// The options given.
  [[nodiscard]] const JpegBatchesOptions& options() const noexcept { return options_; }

 private:
  std::shared_ptr<const Source> source_;
  JpegBatchesOptions options_;
  std::shared_ptr<std::atomic<std::int64_t>> epoch_;
};

/// Options of DecodeAugment: the output size, torchvision's RandomResizedCrop ranges, the flip, the
/// normalisation and the output's dtype and layout.
struct DecodeAugmentOptions {
  std::int64_t height = 224;  ///< Output height in pixels (>= 1).
  std::int64_t width = 224;   ///< Output width in pixels (>= 1).
  /// The least crop area, as a fraction of the image's area (> 0).
  double scale_min = 0.08, scale_max = 1.0;  ///< The most crop area, as a fraction of the image's area (<= 1).
  /// The least crop aspect ratio, width / height (> 0); the ratio is drawn log-uniform.
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< The most crop aspect ratio, width / height.
  /// The probability that a sample is mirrored left-right, in [0, 1] (0: never).
  double flip = 0.5;
  /// One mean per channel, of images in [0, 1]; ImageNet's RGB by default ({0, 0, 0} with std {1, 1, 1}:
  /// the pixels in [0, 1]).
  std::vector<double> mean{0.485, 0.456, 0.406};
  /// One standard deviation (> 0) per channel; ImageNet's by default.
  std::vector<double> std{0.229, 0.224, 0.225};
  /// The images' dtype: at::kFloat, at::kBFloat16 or at::kHalf (computed in float32, converted last).
  c10::ScalarType dtype = c10::ScalarType::Float;
  /// The images in channels-last layout (faster convolutions with cuDNN); else contiguous.
  bool channels_last = false;
};

/// The device stage of JpegBatches' batches: decode (nvJPEG on a GPU, libjpeg-turbo on the CPU), crop
/// and resize, flip, normalise (the top of this file says how). Copyable and stateless: several
/// prefetcher workers call one at once (each keeps its own nvJPEG decoder).
///   nitro::PrefetchOptions<nitro::data::JpegBatch> o{.depth = 3, .workers = 4};
///   o.transform = nitro::data::DecodeAugment({.height = 224, .width = 224, .dtype = at::kBFloat16});
class DecodeAugment {
 public:
  using Options = DecodeAugmentOptions;  ///< The knobs (DecodeAugmentOptions).
  /// The generator stage of the crop box (augment::Compose<RandomResizedCrop, HFlip, Normalize>'s).
  static constexpr int crop_stage = 0;
  /// The generator stage of the flip.
  static constexpr int flip_stage = 1;

  /// With the default Options (224 x 224, float32, ImageNet's normalisation).
  DecodeAugment() : DecodeAugment(Options{}) {}
  /// Checks `options`: a nitro::Error says which is out of range and what it must be.
  NITRO_INLINE explicit DecodeAugment(Options options);

  /// As a prefetcher's transform: the images made on the device of batch.target (where Prefetcher<Cuda>
  /// moved the labels; the CPU under Prefetcher<Cpu>), queued on that device's current stream (the
  /// prefetcher's copy stream); the encoded files dropped. Throws nitro::Error naming the sample of a
  /// file that cannot be decoded, or when the batch holds no encoded files.
  [[nodiscard]] NITRO_INLINE JpegBatch operator()(JpegBatch batch) const;
  /// The same on `device` (labels and indices moved there too, if they are elsewhere).
  [[nodiscard]] NITRO_INLINE JpegBatch operator()(JpegBatch batch, c10::Device device) const;

  /// The images of `files` on `device`: [N, 3, height, width] in Options::dtype, queued on the device's
  /// current stream. Throws nitro::Error naming the sample of a file that cannot be decoded.
  [[nodiscard]] NITRO_INLINE at::Tensor images(const EncodedFiles& files, c10::Device device) const;

  /// The crop box (top, left, height, width) of the sample keyed (seed, epoch, index) in an h x w
  /// image: augment::RandomResizedCrop's draw with the generator of stage crop_stage.
  [[nodiscard]] NITRO_INLINE std::array<std::int64_t, 4> crop(std::uint64_t seed, std::int64_t epoch, std::int64_t index,
                                                        std::int64_t h, std::int64_t w) const;
  /// Whether the sample keyed (seed, epoch, index) is mirrored: augment::HFlip's draw with
  /// probability Options::flip and the generator of stage flip_stage.
  [[nodiscard]] NITRO_INLINE bool flipped(std::uint64_t seed, std::int64_t epoch, std::int64_t index) const;

  /// The options (checked).
  [[nodiscard]] const Options& options() const noexcept { return o_; }

 private:
  /// Sample k's crop (uint8 [3, h, w]) resized and flipped into `slot` (float [1, 3, height, width]).
  NITRO_INLINE void resize_into(const at::Tensor& part, const EncodedFiles& files, std::size_t k, at::Tensor slot) const;
  /// Image k (uint8 [3, h, w], whole) cropped, resized and flipped into `slot`.
  NITRO_INLINE void crop_resize_into(const at::Tensor& image, const EncodedFiles& files, std::size_t k,
                                     at::Tensor slot) const;
  /// (x - mean) / std per channel in place, then the dtype and layout asked for.
  NITRO_INLINE at::Tensor finish(at::Tensor x) const;
  /// Every file decoded on the GPU (nvJPEG), then cropped there.
  NITRO_INLINE at::Tensor on_gpu(const EncodedFiles& files, c10::Device device) const;
  /// Every file decoded and cropped on the CPU (libjpeg-turbo), one at a time.
  NITRO_INLINE at::Tensor on_cpu(const EncodedFiles& files) const;

  Options o_;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/jpeg_batches-inl.hpp>
#endif
