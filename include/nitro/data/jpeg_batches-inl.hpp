#pragma once
// The definitions of nitro/data/jpeg_batches.hpp's non-template functions: included by jpeg_batches.hpp when
// Nitro is header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/jpeg_batches.hpp>

#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/nvjpeg.hpp>

#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/upsample_bilinear2d.h>

#include <cctype>
#include <cmath>
#include <exception>
#include <string>

namespace nitro::data::detail::jpeg {

NITRO_INLINE std::string sample_name(const EncodedFiles& e, std::size_t k) {
  const auto i = k < e.index.size() ? e.index[k] : static_cast<std::int64_t>(k);
  std::string s = "sample " + std::to_string(i);
  if (e.name) {
    try {
      s += " (" + e.name(i) + ")";
    } catch (const std::exception&) {  // no name: the index alone
    }
  }
  return s;
}

}  // namespace nitro::data::detail::jpeg

namespace nitro::data {

NITRO_INLINE DecodeAugment::DecodeAugment(Options options) : o_(std::move(options)) {
  const char* who = "data::DecodeAugment: ";
  NITRO_CHECK(o_.height >= 1 && o_.width >= 1, who, "height and width must be >= 1 (the output's size in pixels); got ",
              o_.height, " x ", o_.width);
  NITRO_CHECK(std::isfinite(o_.scale_min) && std::isfinite(o_.scale_max) && 0 < o_.scale_min &&
                  o_.scale_min <= o_.scale_max && o_.scale_max <= 1.0,
              who, "the crop's area range needs 0 < scale_min <= scale_max <= 1 (fractions of the image's area); got [",
              o_.scale_min, ", ", o_.scale_max, "]");
  NITRO_CHECK(std::isfinite(o_.ratio_min) && std::isfinite(o_.ratio_max) && 0 < o_.ratio_min &&
                  o_.ratio_min <= o_.ratio_max,
              who, "the crop's aspect-ratio range needs 0 < ratio_min <= ratio_max (width / height); got [",
              o_.ratio_min, ", ", o_.ratio_max, "]");
  NITRO_CHECK(o_.flip >= 0 && o_.flip <= 1, who, "flip is a probability, in [0, 1]; got ", o_.flip);
  NITRO_CHECK(o_.mean.size() == 3 && o_.std.size() == 3, who,
              "mean and std need one value per channel (3, RGB); got ", o_.mean.size(), " and ", o_.std.size());
  for (std::size_t c = 0; c < 3; ++c) {
    NITRO_CHECK(std::isfinite(o_.mean[c]), who, "mean[", c, "] is not finite");
    NITRO_CHECK(std::isfinite(o_.std[c]) && o_.std[c] > 0, who, "std[", c, "] must be finite and > 0; got ", o_.std[c]);
  }
  NITRO_CHECK(o_.dtype == at::kFloat || o_.dtype == at::kBFloat16 || o_.dtype == at::kHalf, who,
              "dtype must be float32, bfloat16 or float16 (at::kFloat, at::kBFloat16, at::kHalf); got ", o_.dtype);
}

NITRO_INLINE std::array<std::int64_t, 4> DecodeAugment::crop(std::uint64_t seed, std::int64_t epoch, std::int64_t index,
                                                            std::int64_t h, std::int64_t w) const {
  augment::detail::Rng g(seed, epoch, index, crop_stage);
  const augment::RandomResizedCrop rrc{.height = o_.height, .width = o_.width, .scale_min = o_.scale_min,
                                       .scale_max = o_.scale_max, .ratio_min = o_.ratio_min, .ratio_max = o_.ratio_max};
  return rrc.crop(g, h, w);
}

NITRO_INLINE bool DecodeAugment::flipped(std::uint64_t seed, std::int64_t epoch, std::int64_t index) const {
  augment::detail::Rng g(seed, epoch, index, flip_stage);
  return g.uniform() < o_.flip;  // as augment::HFlip::flips
}

NITRO_INLINE void DecodeAugment::crop_resize_into(const at::Tensor& image, const EncodedFiles& files, std::size_t k,
                                                  at::Tensor slot) const {
  const auto [top, left, h, w] = crop(files.seed, files.epoch, files.index[k], image.size(1), image.size(2));
  resize_into(image.slice(1, top, top + h).slice(2, left, left + w), files, k, std::move(slot));  // a view
}

NITRO_INLINE void DecodeAugment::resize_into(const at::Tensor& crop_u8, const EncodedFiles& files, std::size_t k,
                                             at::Tensor slot) const {
  // Only the crop is made float (in [0, 1], as augment::ToFloat: x / 255 in float).
  const auto part = at::div(crop_u8.unsqueeze(0), 255.0);
  if (flipped(files.seed, files.epoch, files.index[k])) {
    at::flip_out(slot, at::upsample_bilinear2d(part, {o_.height, o_.width}, false), {3});
  } else {
    at::upsample_bilinear2d_out(slot, part, {o_.height, o_.width}, false);
  }
}

NITRO_INLINE at::Tensor DecodeAugment::finish(at::Tensor x) const {
  // Scalars, not tensors of the constants: nothing is copied from the host (no synchronisation).
  for (std::int64_t c = 0; c < 3; ++c)
    x.select(1, c).sub_(o_.mean[static_cast<std::size_t>(c)]).div_(o_.std[static_cast<std::size_t>(c)]);
  const auto format = o_.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (o_.dtype == x.scalar_type() && !o_.channels_last) return x;
  return x.to(x.options().dtype(o_.dtype), /*non_blocking=*/false, /*copy=*/false, format);
}

NITRO_INLINE at::Tensor DecodeAugment::on_cpu(const EncodedFiles& files) const {
  const auto n = static_cast<std::int64_t>(files.files.size());
  auto out = at::empty({n, 3, o_.height, o_.width}, at::TensorOptions().dtype(at::kFloat));
  for (std::size_t k = 0; k < files.files.size(); ++k) {
    // The crop drawn from the header's size, then only its region decoded (image::DecodeOptions::
    // partial): the pixels of the same window of a whole decode.
    at::Tensor part;
    try {
      const auto name = detail::jpeg::sample_name(files, k);
      const auto info = image::probe(files.files[k], name);
      const auto [top, left, h, w] = crop(files.seed, files.epoch, files.index[k], info.height, info.width);
      part = image::decode(files.files[k], {.crop = image::Window{top, left, h, w}}, name);
    } catch (const Error& e) {
      throw Error(std::string("data::DecodeAugment: ") + e.what());
    }
    resize_into(part, files, k, out.narrow(0, static_cast<std::int64_t>(k), 1));
  }
  return finish(std::move(out));
}

NITRO_INLINE at::Tensor DecodeAugment::on_gpu([[maybe_unused]] const EncodedFiles& files, [[maybe_unused]] c10::Device device) const {
#if NITRO_WITH_CUDA
  std::vector<at::Tensor> decoded;
  try {
    decoded = image::decode_on(device, files.files);  // nvJPEG, on the current stream (the copy stream)
  } catch (const Error& e) {
    // NvJpeg names a file "jpegs[k]", its place in the batch: name the sample instead.
    std::string m = e.what();
    const auto at = m.find("jpegs[");
    if (at != std::string::npos) {
      std::size_t end = at + 6, k = 0;
      bool digits = false;
      while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end])) != 0) {
        k = k * 10 + static_cast<std::size_t>(m[end++] - '0');
        digits = true;
      }
      if (digits && end < m.size() && m[end] == ']' && k < files.files.size())
        m.replace(at, end + 1 - at, detail::jpeg::sample_name(files, k));
    }
    throw Error("data::DecodeAugment: " + m);
  }
  auto out = at::empty({static_cast<std::int64_t>(decoded.size()), 3, o_.height, o_.width},
                       at::TensorOptions().dtype(at::kFloat).device(device));
  for (std::size_t k = 0; k < decoded.size(); ++k) {
    crop_resize_into(decoded[k], files, k, out.narrow(0, static_cast<std::int64_t>(k), 1));
    decoded[k].reset();  // back to the allocator (stream-ordered: reused only by later work on this stream)
  }
  return finish(std::move(out));
#else
  throw Error("data::DecodeAugment: this build has no CUDA (NITRO_WITH_CUDA is 0); decode on the CPU");
#endif
}

NITRO_INLINE at::Tensor DecodeAugment::images(const EncodedFiles& files, c10::Device device) const {
  NITRO_CHECK(files.index.size() == files.files.size(), "data::DecodeAugment: the batch has ", files.files.size(),
              " files and ", files.index.size(), " indices; give one data-set index (the key) per file");
  NITRO_CHECK(device.is_cpu() || device.is_cuda(), "data::DecodeAugment: give a CPU or CUDA device; got ", device.str());
  if (device.is_cpu()) return on_cpu(files);
  if (image::NvJpeg::available()) return on_gpu(files, device);
  // A GPU without nvJPEG: the batch made on the CPU, staged in pinned memory, copied without blocking.
  return on_cpu(files).pin_memory().to(device, /*non_blocking=*/true);
}

NITRO_INLINE JpegBatch DecodeAugment::operator()(JpegBatch batch, c10::Device device) const {
  NITRO_CHECK(batch.encoded != nullptr, "data::DecodeAugment: the batch holds no encoded files (decoded already, or "
              "not made by data::JpegBatches); give each batch to DecodeAugment once");
  batch.data = images(*batch.encoded, device);
  batch.encoded.reset();  // nvJPEG and libjpeg-turbo read the bytes during the call only
  if (batch.target.defined() && batch.target.device() != device) batch.target = batch.target.to(device);
  if (batch.index.defined() && batch.index.device() != device) batch.index = batch.index.to(device);
  return batch;
}

NITRO_INLINE JpegBatch DecodeAugment::operator()(JpegBatch batch) const {
  const auto device = batch.target.defined() ? batch.target.device() : c10::Device(c10::kCPU);
  return (*this)(std::move(batch), device);
}

}  // namespace nitro::data
