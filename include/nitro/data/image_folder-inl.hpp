#pragma once
// The definitions of nitro/data/image_folder.hpp's non-template functions: included by image_folder.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/image_folder.hpp>

namespace nitro::data {

NITRO_INLINE const std::vector<std::string>& torchvision_extensions() {
  static const std::vector<std::string> e{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return e;
}

}  // namespace nitro::data

namespace nitro::data::detail::images {

NITRO_INLINE std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

NITRO_INLINE bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  const auto l = lower(name);
  for (const auto& e : extensions) {
    const auto le = lower(e);
    if (l.size() >= le.size() && l.compare(l.size() - le.size(), le.size(), le) == 0) return true;
  }
  return false;
}

NITRO_INLINE bool is_dir(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec);  // follows symbolic links, as os.walk(followlinks=True)
}

NITRO_INLINE void walk(const std::string& dir, const std::vector<std::string>& extensions, std::vector<std::string>& out) {
  std::vector<std::string> dirs{dir};
  for (std::size_t k = 0; k < dirs.size(); ++k) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dirs[k], ec), end; !ec && it != end; it.increment(ec)) {
      const auto name = it->path().filename().string();
      if (is_dir(it->path())) dirs.push_back(dirs[k] + "/" + name);
    }
  }
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    std::vector<std::string> files;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const auto name = it->path().filename().string();
      if (!is_dir(it->path()) && has_extension(name, extensions)) files.push_back(name);
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) out.push_back(d + "/" + f);
  }
}

NITRO_INLINE std::string trim_slash(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace nitro::data::detail::images

namespace nitro::data {

NITRO_INLINE ImageFolder::ImageFolder(const std::filesystem::path& root, ImageFolderOptions options) : d_(std::make_shared<Data>()) {
  d_->root = detail::images::trim_slash(root.string());
  d_->options = std::move(options);
  NITRO_CHECK(detail::images::is_dir(root), "data::ImageFolder: ", d_->root, " is not a folder; give root/<class>/<image> files");
  std::vector<std::string> classes;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (detail::images::is_dir(it->path())) classes.push_back(it->path().filename().string());
  NITRO_CHECK(!ec, "data::ImageFolder: cannot list ", d_->root, ": ", ec.message());
  std::sort(classes.begin(), classes.end());
  NITRO_CHECK(!classes.empty(), "data::ImageFolder: ", d_->root, " has no class folder; give root/<class>/<image> files");
  std::string empty;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    d_->class_to_idx.emplace(classes[c], static_cast<std::int64_t>(c));
    std::vector<std::string> files;
    detail::images::walk(d_->root + "/" + classes[c], d_->options.extensions, files);
    if (files.empty()) empty += (empty.empty() ? "" : ", ") + classes[c];
    for (auto& f : files) {
      d_->paths.push_back(std::move(f));
      d_->labels.push_back(static_cast<std::int64_t>(c));
    }
  }
  NITRO_CHECK(empty.empty() || d_->options.allow_empty, "data::ImageFolder: no image file (", d_->options.extensions.size(),
              " extensions, torchvision's by default) for the classes ", empty, " in ", d_->root,
              "; remove those folders or set ImageFolderOptions::allow_empty");
  d_->classes = std::move(classes);
}

NITRO_INLINE torch::data::Example<> ImageFolder::get(size_t i) {
  return {image::decode(encoded(i), d_->options.decode, path(i)), at::scalar_tensor(label(i), at::kLong)};
}

NITRO_INLINE YoloDataset::YoloDataset(const std::filesystem::path& root, YoloOptions options) : d_(std::make_shared<Data>()) {
  auto r = detail::images::trim_slash(root.string());
  NITRO_CHECK(detail::images::is_dir(root), "data::YoloDataset: ", r, " is not a folder; give the data set's folder "
              "(with images/ and labels/) or one of its images/ folders");
  // root is an images folder (coco/images, coco/images/train2017) unless it holds one: a parent folder
  // that happens to be named images (/data/images/coco) does not count.
  const bool images_inside = std::filesystem::path(r).filename() == "images" ||
                             (!detail::images::is_dir(r + "/images") &&
                              (r.find("/images/") != std::string::npos || r.starts_with("images/")));
  d_->root = images_inside ? r : r + "/images";
  NITRO_CHECK(detail::images::is_dir(d_->root), "data::YoloDataset: ", r, " has no images/ folder; the Ultralytics layout is ",
              r, "/images/<name>.jpg with ", r, "/labels/<name>.txt");
  detail::images::walk(d_->root, options.extensions, d_->paths);
  std::sort(d_->paths.begin(), d_->paths.end());  // Ultralytics sorts the full paths
  NITRO_CHECK(!d_->paths.empty(), "data::YoloDataset: no image (", options.extensions.size(), " extensions: .jpg, .jpeg, .png) under ",
              d_->root);
  d_->first.reserve(d_->paths.size() + 1);
  for (const auto& p : d_->paths) {
    d_->first.push_back(static_cast<std::int64_t>(d_->rows.size() / 5));
    read_labels(label_path(p), options);
  }
  d_->first.push_back(static_cast<std::int64_t>(d_->rows.size() / 5));
}

NITRO_INLINE std::string YoloDataset::label_path(const std::string& image_path) {
  std::string p = image_path;
  const auto at = p.rfind("/images/");
  if (at != std::string::npos) p.replace(at, 8, "/labels/");
  else if (p.starts_with("images/")) p.replace(0, 7, "labels/");
  const auto slash = p.rfind('/'), dot = p.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) p.erase(dot);
  return p + ".txt";
}

NITRO_INLINE at::Tensor YoloDataset::boxes(std::size_t i) const {
  NITRO_CHECK(i < size(), "data::YoloDataset: sample ", i, " of ", size());
  const auto a = d_->first[i], b = d_->first[i + 1];
  auto out = at::empty({b - a, 5}, at::kFloat);
  std::copy(d_->rows.begin() + a * 5, d_->rows.begin() + b * 5, out.data_ptr<float>());
  return out;
}

NITRO_INLINE void YoloDataset::read_labels(const std::string& file, const YoloOptions& o) {
  std::ifstream in(file);
  if (!in.is_open()) {
    std::error_code ec;
    NITRO_CHECK(!std::filesystem::exists(file, ec), "data::YoloDataset: ", file, " exists but cannot be read");
    ++d_->missing;
    return;
  }
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::array<double, 6> v{};
    int k = 0;
    const char* p = line.data();
    const char* end = p + line.size();
    while (true) {
      while (p < end && (*p == ' ' || *p == '\t')) ++p;
      if (p == end) break;
      NITRO_CHECK(k < 5, "data::YoloDataset: ", file, ":", n, ": more than 5 numbers; a line is `class cx cy w h` "
                  "(polygon segments are not supported)");
      const auto r = std::from_chars(p, end, v[static_cast<std::size_t>(k)]);
      NITRO_CHECK(r.ec == std::errc() && (r.ptr == end || *r.ptr == ' ' || *r.ptr == '\t'), "data::YoloDataset: ", file, ":",
                  n, ": '", line, "' is not numbers; a line is `class cx cy w h`");
      p = r.ptr;
      ++k;
    }
    if (k == 0) continue;  // a blank line
    NITRO_CHECK(k == 5, "data::YoloDataset: ", file, ":", n, ": ", k, " numbers; a line is `class cx cy w h` (5)");
    NITRO_CHECK(v[0] >= 0 && v[0] == std::floor(v[0]) && v[0] < 1e9, "data::YoloDataset: ", file, ":", n, ": the class ",
                v[0], " is not a whole number >= 0");
    for (int j = 1; j < 5; ++j) {
      // Finite as a float, as it is kept: 1e39 is finite as a double and inf as a float.
      NITRO_CHECK(std::isfinite(static_cast<float>(v[static_cast<std::size_t>(j)])), "data::YoloDataset: ", file, ":",
                  n, ": a coordinate is not finite (or too large for a float)");
      NITRO_CHECK(!o.check_normalised || (v[static_cast<std::size_t>(j)] >= 0 && v[static_cast<std::size_t>(j)] <= 1),
                  "data::YoloDataset: ", file, ":", n, ": ", v[static_cast<std::size_t>(j)],
                  " is outside [0, 1]; YOLO labels are fractions of the image (YoloOptions::check_normalised)");
    }
    for (int j = 0; j < 5; ++j) d_->rows.push_back(static_cast<float>(v[static_cast<std::size_t>(j)]));
  }
}

}  // namespace nitro::data

namespace nitro::data::sample::detail {

NITRO_INLINE void resize_into(const at::Tensor& hwc, const at::Tensor& out) {
  const auto nchw = hwc.permute({2, 0, 1}).unsqueeze(0);  // channels-last [1, 3, h0, w0]
  if (hwc.size(0) == out.size(1) && hwc.size(1) == out.size(2)) {
    out.copy_(nchw.squeeze(0));
    return;
  }
  out.copy_(at::_upsample_bilinear2d_aa(nchw, {out.size(1), out.size(2)}, false).squeeze(0));
}

NITRO_INLINE image::DecodeOptions decode_options(bool draft, bool fast, std::int64_t min_h, std::int64_t min_w) {
  image::DecodeOptions o;
  o.layout = image::Layout::hwc;
  if (draft) o.min_height = min_h, o.min_width = min_w;
  o.fast = fast;
  return o;
}

}  // namespace nitro::data::sample::detail

namespace nitro::data::sample {

NITRO_INLINE void Resize::validate() const {
  NITRO_CHECK(height >= 1 && width >= 1, "data::sample::Resize: height and width must be >= 1; got ", height, " x ", width);
}

NITRO_INLINE void ResizeCenterCrop::validate() const {
  NITRO_CHECK(resize >= 1 && height >= 1 && width >= 1 && height <= resize && width <= resize,
              "data::sample::ResizeCenterCrop: needs 1 <= height, width <= resize; got resize ", resize, ", ", height, " x ", width);
}

NITRO_INLINE void RandomResizedCrop::validate() const {
  NITRO_CHECK(height >= 1 && width >= 1 && 0 < scale_min && scale_min <= scale_max && scale_max <= 1.0 && 0 < ratio_min &&
                  ratio_min <= ratio_max,
              "data::sample::RandomResizedCrop: needs height, width >= 1, 0 < scale_min <= scale_max <= 1, "
              "0 < ratio_min <= ratio_max");
}

NITRO_INLINE std::array<std::int64_t, 4> RandomResizedCrop::crop(const Key& key, std::int64_t h, std::int64_t w) const {
  data::augment::detail::Rng g(key.seed, key.epoch, key.index, kStage);
  return as_augment().crop(g, h, w);
}

NITRO_INLINE data::augment::RandomResizedCrop RandomResizedCrop::as_augment() const {
  return {.height = height, .width = width, .scale_min = scale_min, .scale_max = scale_max, .ratio_min = ratio_min,
          .ratio_max = ratio_max};
}

NITRO_INLINE std::array<std::int64_t, 4> Letterbox::placement(std::int64_t h, std::int64_t w) const {
  double r = std::min(static_cast<double>(size) / static_cast<double>(h), static_cast<double>(size) / static_cast<double>(w));
  if (!scaleup) r = std::min(r, 1.0);
  // Python's round (a tie to even), as Ultralytics' int(round(h * r)): 321 x 1280 at 640 is 160 rows, not 161.
  const auto nh = std::max<std::int64_t>(1, data::augment::detail::round_half_even(static_cast<double>(h) * r)),
             nw = std::max<std::int64_t>(1, data::augment::detail::round_half_even(static_cast<double>(w) * r));
  const double dh = static_cast<double>(size - nh) / 2, dw = static_cast<double>(size - nw) / 2;
  return {nh, nw, std::llround(dh - 0.1), std::llround(dw - 0.1)};
}

}  // namespace nitro::data::sample
