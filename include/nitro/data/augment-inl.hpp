#pragma once
// The definitions of nitro/data/augment.hpp's non-template functions: included by augment.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/augment.hpp>

namespace nitro::data::augment::detail {

NITRO_INLINE uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

NITRO_INLINE Rng::Rng(uint64_t seed, int64_t epoch, int64_t index, int stage) : s_(splitmix(splitmix(splitmix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index)) ^
         static_cast<uint64_t>(stage)) {}

NITRO_INLINE int64_t round_half_even(double x) {
  if (std::abs(x - std::trunc(x)) == 0.5) return static_cast<int64_t>(2.0 * std::round(x / 2.0));
  return static_cast<int64_t>(std::round(x));
}

NITRO_INLINE std::vector<Rng> rngs(const Keys& keys, int64_t n, int stage) {
  NITRO_CHECK(keys.index.defined() && keys.index.dim() == 1 && keys.index.size(0) == n,
              "data::augment: Keys::index must hold one data-set index per sample (int64 [", n, "])");
  const auto idx = keys.index.to(at::kCPU, at::kLong).contiguous();
  const auto* p = idx.data_ptr<int64_t>();
  std::vector<Rng> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.emplace_back(keys.seed, keys.epoch, p[i], stage);
  return out;
}

NITRO_INLINE void check_images(const at::Tensor& x, const char* stage, bool floating) {
  NITRO_CHECK(x.defined() && x.dim() == 4, "data::augment::", stage, ": expected a batch of images [N, C, H, W], got ",
              x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor"));
  if (floating)
    NITRO_CHECK(x.is_floating_point(), "data::augment::", stage, ": expected floating images (put ToFloat first), got ",
                c10::toString(x.scalar_type()));
}

NITRO_INLINE at::Tensor per_sample(const std::vector<double>& v, const at::Tensor& like) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble))
      .to(like.device(), like.scalar_type())
      .view({static_cast<int64_t>(v.size()), 1, 1, 1});
}

NITRO_INLINE void check_boxes(const Boxes& boxes, int64_t n, const char* stage) {
  NITRO_CHECK(static_cast<int64_t>(boxes.size()) == n, "data::augment::", stage,
              ": expected one box tensor per sample of the batch (", n, "), got ", boxes.size(),
              "; give a sample without boxes an empty [0, 5] tensor");
  for (size_t i = 0; i < boxes.size(); ++i) {
    const auto& b = boxes[i];
    NITRO_CHECK(b.defined() && b.dim() == 2 && b.size(1) == 5 && b.is_floating_point(), "data::augment::", stage,
                ": the boxes of sample ", i, " must be a floating tensor [n, 5] of YOLO rows (class, cx, cy, w, h), "
                "normalised to the image's size; got ",
                b.defined() ? c10::str(b.sizes(), " ", c10::toString(b.scalar_type()))
                            : std::string("an undefined tensor"));
  }
}

NITRO_INLINE at::Tensor hash31(at::Tensor x) {
  for (int r = 0; r < 3; ++r) {
    x = at::bitwise_xor(x, at::bitwise_right_shift(x, 15));
    x = at::bitwise_and(x * 0x2C1B3C6D, 0x7FFFFFFF);
    x = at::bitwise_xor(x, at::bitwise_right_shift(x, 12));
    x = at::bitwise_and(x * 0x297A2D39, 0x7FFFFFFF);
  }
  return x;
}

}  // namespace nitro::data::augment::detail

namespace nitro::data::augment {

NITRO_INLINE at::Tensor Normalize::from_uint8(const at::Tensor& x) const {
  const auto C = x.size(1);
  std::vector<float> scale(static_cast<size_t>(C)), bias(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    scale[static_cast<size_t>(c)] = static_cast<float>(1.0 / (255.0 * std[static_cast<size_t>(c)]));
    bias[static_cast<size_t>(c)] = static_cast<float>(-mean[static_cast<size_t>(c)] / std[static_cast<size_t>(c)]);
  }
  if (!x.device().is_cpu() || !x.is_contiguous()) {  // elsewhere: two kernels
    const auto o = at::TensorOptions().dtype(at::kFloat);
    const auto a = at::tensor(scale, o).to(x.device()).view({1, -1, 1, 1});
    const auto b = at::tensor(bias, o).to(x.device()).view({1, -1, 1, 1});
    return at::addcmul(b, x.to(at::kFloat), a);
  }
  auto out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  const auto* in = x.data_ptr<uint8_t>();
  auto* o = out.data_ptr<float>();
  const int64_t plane = x.size(2) * x.size(3), planes = x.size(0) * C;
  // Unaliased pointers: a uint8 pointer may alias anything, and without them the loop is not vectorised.
  const auto run = [plane](const uint8_t* __restrict src, float* __restrict dst, float a, float b) {
    for (int64_t i = 0; i < plane; ++i) dst[i] = static_cast<float>(src[i]) * a + b;
  };
  for (int64_t k = 0; k < planes; ++k)
    run(in + k * plane, o + k * plane, scale[static_cast<size_t>(k % C)], bias[static_cast<size_t>(k % C)]);
  return out;
}

NITRO_INLINE std::vector<uint8_t> HFlip::flips(const Keys& keys, int64_t n, int stage) const {
  auto r = detail::rngs(keys, n, stage);
  std::vector<uint8_t> out;
  out.reserve(r.size());
  for (auto& g : r) out.push_back(g.uniform() < p ? 1 : 0);
  return out;
}

NITRO_INLINE at::Tensor HFlip::flip(const at::Tensor& x, const std::vector<uint8_t>& flips) {
  if (x.device().is_cpu()) {  // one pass: each sample copied, mirrored or not (no whole flipped batch, no where)
    auto out = at::empty(x.sizes(), x.options());
    for (int64_t i = 0; i < x.size(0); ++i) {
      auto o = out[i];
      if (flips[static_cast<size_t>(i)]) at::flip_out(o, x[i], {2});
      else o.copy_(x[i]);
    }
    return out;
  }
  const auto mask = at::tensor(std::vector<int64_t>(flips.begin(), flips.end()), at::TensorOptions().dtype(at::kLong))
                        .to(x.device(), at::kBool)
                        .view({x.size(0), 1, 1, 1});
  return at::where(mask, x.flip({3}), x);
}

NITRO_INLINE Boxes HFlip::flip_boxes(const Boxes& boxes, const std::vector<uint8_t>& flips) {
  Boxes out(boxes);
  for (size_t i = 0; i < out.size(); ++i) {
    if (!flips[i] || out[i].size(0) == 0) continue;
    out[i] = boxes[i].clone();
    out[i].select(1, 1).mul_(-1).add_(1);
  }
  return out;
}

NITRO_INLINE std::vector<int64_t> Rotate90::turns(const Keys& keys, int64_t n, int stage) const {
  auto r = detail::rngs(keys, n, stage);
  std::vector<int64_t> ks;
  ks.reserve(r.size());
  for (auto& g : r) ks.push_back(g.below(4));
  return ks;
}

NITRO_INLINE at::Tensor Rotate90::turn(const at::Tensor& x, const std::vector<int64_t>& ks) {
  auto out = x.clone();
  for (int64_t k = 1; k < 4; ++k) {
    std::vector<int64_t> sel;
    for (size_t i = 0; i < ks.size(); ++i)
      if (ks[i] == k) sel.push_back(static_cast<int64_t>(i));
    if (sel.empty()) continue;
    const auto idx = at::tensor(sel, at::TensorOptions().dtype(at::kLong)).to(x.device());
    out.index_copy_(0, idx, x.index_select(0, idx).rot90(k, {2, 3}));
  }
  return out;
}

NITRO_INLINE Boxes Rotate90::turn_boxes(const Boxes& boxes, const std::vector<int64_t>& ks) {
  Boxes out(boxes);
  for (size_t i = 0; i < out.size(); ++i) {
    if (ks[i] == 0 || out[i].size(0) == 0) continue;
    const auto c = boxes[i].unbind(1);  // class, cx, cy, w, h
    if (ks[i] == 1) out[i] = at::stack({c[0], c[2], 1 - c[1], c[4], c[3]}, 1);
    else if (ks[i] == 2) out[i] = at::stack({c[0], 1 - c[1], 1 - c[2], c[3], c[4]}, 1);
    else out[i] = at::stack({c[0], 1 - c[2], c[1], c[4], c[3]}, 1);
  }
  return out;
}

NITRO_INLINE void Rotate90::check(const at::Tensor& x) {
  detail::check_images(x, "Rotate90", false);
  NITRO_CHECK(x.size(2) == x.size(3), "data::augment::Rotate90: images must be square to stay one batch, got ",
              x.size(2), "x", x.size(3));
}

NITRO_INLINE std::array<int64_t, 4> RandomResizedCrop::crop(detail::Rng& g, int64_t H, int64_t W) const {
  const double area = static_cast<double>(H * W);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * g.uniform(scale_min, scale_max);
    const double aspect = std::exp(g.uniform(std::log(ratio_min), std::log(ratio_max)));
    const auto w = detail::round_half_even(std::sqrt(target * aspect));
    const auto h = detail::round_half_even(std::sqrt(target / aspect));
    if (w > 0 && w <= W && h > 0 && h <= H) return {g.below(H - h + 1), g.below(W - w + 1), h, w};
  }
  // Fallback: the whole image, cut to the nearest allowed ratio, centred.
  const double in_ratio = static_cast<double>(W) / static_cast<double>(H);
  int64_t w = W, h = H;
  if (in_ratio < ratio_min) h = detail::round_half_even(static_cast<double>(W) / ratio_min);
  else if (in_ratio > ratio_max) w = detail::round_half_even(static_cast<double>(H) * ratio_max);
  return {(H - h) / 2, (W - w) / 2, h, w};
}

NITRO_INLINE std::vector<std::array<int64_t, 4>> RandomResizedCrop::crops(const Keys& keys, int64_t n, int64_t H, int64_t W, int stage) const {
  auto r = detail::rngs(keys, n, stage);
  std::vector<std::array<int64_t, 4>> out;
  out.reserve(r.size());
  for (auto& g : r) out.push_back(crop(g, H, W));
  return out;
}

NITRO_INLINE at::Tensor RandomResizedCrop::resample(const at::Tensor& x, const std::vector<std::array<int64_t, 4>>& crops) const {
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  std::vector<double> top, left, h, w;
  for (const auto& b : crops) {
    top.push_back(static_cast<double>(b[0]));
    left.push_back(static_cast<double>(b[1]));
    h.push_back(static_cast<double>(b[2]));
    w.push_back(static_cast<double>(b[3]));
  }
  const auto T = at::tensor(top, o).view({N, 1}), L = at::tensor(left, o).view({N, 1});
  const auto Hc = at::tensor(h, o).view({N, 1}), Wc = at::tensor(w, o).view({N, 1});
  const auto jx = at::arange(width, o).view({1, width}) + 0.5;
  const auto jy = at::arange(height, o).view({1, height}) + 0.5;
  auto sx = at::minimum(at::maximum(L + jx * Wc / static_cast<double>(width) - 0.5, L), L + Wc - 1);
  auto sy = at::minimum(at::maximum(T + jy * Hc / static_cast<double>(height) - 0.5, T), T + Hc - 1);
  const auto gx = ((2 * sx + 1) / static_cast<double>(W) - 1).view({N, 1, width}).expand({N, height, width});
  const auto gy = ((2 * sy + 1) / static_cast<double>(H) - 1).view({N, height, 1}).expand({N, height, width});
  const auto grid = at::stack({gx, gy}, 3).to(x.device(), x.scalar_type());
  return at::grid_sampler(x, grid, /*bilinear*/ 0, /*zeros*/ 0, /*align_corners=*/false);
}

NITRO_INLINE Boxes RandomResizedCrop::crop_boxes(const Boxes& boxes, const std::vector<std::array<int64_t, 4>>& crops, int64_t H, int64_t W) const {
  NITRO_CHECK(min_visibility >= 0 && min_visibility <= 1,
              "data::augment::RandomResizedCrop: min_visibility is a fraction of a box's area, in [0, 1], got ",
              min_visibility);
  Boxes out;
  out.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const auto& b = boxes[i];
    if (b.size(0) == 0) {
      out.push_back(b);
      continue;
    }
    const auto [top, left, h, w] = crops[i];
    const auto d = b.to(at::kDouble);
    const auto cx = d.select(1, 1), cy = d.select(1, 2), bw = d.select(1, 3), bh = d.select(1, 4);
    // The box's edges in pixels, then in fractions of the crop (unclipped, then clipped).
    const auto x0 = ((cx - bw / 2) * static_cast<double>(W) - static_cast<double>(left)) / static_cast<double>(w);
    const auto x1 = ((cx + bw / 2) * static_cast<double>(W) - static_cast<double>(left)) / static_cast<double>(w);
    const auto y0 = ((cy - bh / 2) * static_cast<double>(H) - static_cast<double>(top)) / static_cast<double>(h);
    const auto y1 = ((cy + bh / 2) * static_cast<double>(H) - static_cast<double>(top)) / static_cast<double>(h);
    const auto cx0 = x0.clamp(0, 1), cx1 = x1.clamp(0, 1), cy0 = y0.clamp(0, 1), cy1 = y1.clamp(0, 1);
    const auto nw = cx1 - cx0, nh = cy1 - cy0;
    // "Some area" is more than a thousandth of a pixel each way: a box that ends on the crop's edge
    // comes out of float rounding with a sliver of 1e-6, which is no box.
    const auto keep = (nw * static_cast<double>(w) > 1e-3) & (nh * static_cast<double>(h) > 1e-3) &
                      (nw * nh >= min_visibility * (x1 - x0) * (y1 - y0));
    const auto rows = at::stack({d.select(1, 0), (cx0 + cx1) / 2, (cy0 + cy1) / 2, nw, nh}, 1);
    out.push_back(rows.index_select(0, keep.nonzero().squeeze(1)).to(b.scalar_type()));
  }
  return out;
}

NITRO_INLINE void RandomResizedCrop::check(const at::Tensor& x) const {
  detail::check_images(x, "RandomResizedCrop", true);
  NITRO_CHECK(height >= 1 && width >= 1 && 0 < scale_min && scale_min <= scale_max && scale_max <= 1.0 &&
                  0 < ratio_min && ratio_min <= ratio_max,
              "data::augment::RandomResizedCrop: needs height, width >= 1, 0 < scale_min <= scale_max <= 1, "
              "0 < ratio_min <= ratio_max");
}

NITRO_INLINE at::Tensor ColorJitter::shift_hue(const at::Tensor& x, const at::Tensor& shift) {
  NITRO_CHECK(x.size(1) == 3, "data::augment::ColorJitter: hue needs RGB images (3 channels), got ", x.size(1));
  const auto r = x.select(1, 0), g = x.select(1, 1), b = x.select(1, 2);
  const auto maxc = at::maximum(at::maximum(r, g), b), minc = at::minimum(at::minimum(r, g), b);
  const auto eqc = maxc == minc;
  const auto cr = maxc - minc;
  const auto ones = at::ones_like(maxc);
  const auto sat = cr / at::where(eqc, ones, maxc);
  const auto div = at::where(eqc, ones, cr);
  const auto rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
  const auto hr = (maxc == r).to(x.scalar_type()) * (bc - gc);
  const auto hg = ((maxc == g) & (maxc != r)).to(x.scalar_type()) * (2.0 + rc - bc);
  const auto hb = ((maxc != g) & (maxc != r)).to(x.scalar_type()) * (4.0 + gc - rc);
  auto hh = at::fmod((hr + hg + hb) / 6.0 + 1.0, 1.0);
  hh = at::remainder(hh + shift.squeeze(1), 1.0);  // Python's %, as torchvision: any shift wraps
  // Back to RGB (torchvision's _hsv2rgb).
  const auto v = maxc;
  const auto i6 = at::floor(hh * 6.0);
  const auto f = hh * 6.0 - i6;
  const auto i = at::remainder(i6.to(at::kLong), 6);
  const auto p = (v * (1.0 - sat)).clamp(0, 1);
  const auto q = (v * (1.0 - sat * f)).clamp(0, 1);
  const auto t = (v * (1.0 - sat * (1.0 - f))).clamp(0, 1);
  const auto pick = [&](std::initializer_list<at::Tensor> by_sector) {
    std::vector<at::Tensor> v6(by_sector);
    auto out = at::zeros_like(v);
    for (int64_t k = 0; k < 6; ++k) out = at::where(i == k, v6[static_cast<size_t>(k)], out);
    return out;
  };
  return at::stack({pick({v, q, p, p, t, v}), pick({t, v, v, q, p, p}), pick({p, p, t, v, v, q})}, 1);
}

NITRO_INLINE at::Tensor ColorJitter::gray(const at::Tensor& x) {
  NITRO_CHECK(x.size(1) == 3, "data::augment::ColorJitter: needs RGB images (3 channels), got ", x.size(1));
  return (0.2989 * x.select(1, 0) + 0.587 * x.select(1, 1) + 0.114 * x.select(1, 2)).unsqueeze(1);
}

}  // namespace nitro::data::augment
