// nitro_pack: makes a record file (data::RecordWriter, include/nitro/data/record_file.hpp).
//
//   nitro_pack --synthetic N --out FILE [--size S] [--noise X] [--seed K] [--chunk C]
//       N SyntheticImages samples of 3xSxS as uint8 (x * 40 + 128, clamped) with int64 labels
//   nitro_pack --tensors DIR --out FILE [--chunk C]
//       every DIR/*.pt written by torch::save (C++) of one image tensor, in name order; the label is the
//       number after the last '_' in the name (img_000123_7.pt -> 7); every image must have the first
//       one's shape; its dtype is kept
#include <nitro/data/record_file.hpp>
#include <nitro/data/synthetic.hpp>

#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

int main(int argc, char** argv) try {
  std::string out, dir;
  int64_t synthetic = -1, size = 224, chunk = 256;
  double noise = 8.0;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--out") out = v;
    else if (a == "--synthetic") synthetic = std::atoll(v.c_str());
    else if (a == "--tensors") dir = v;
    else if (a == "--size") size = std::atoll(v.c_str());
    else if (a == "--noise") noise = std::atof(v.c_str());
    else if (a == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--chunk") chunk = std::atoll(v.c_str());
    else throw nitro::Error("nitro_pack: unknown option " + a);
  }
  NITRO_CHECK(!out.empty() && ((synthetic >= 0) != !dir.empty()),
              "usage: nitro_pack --synthetic N --out FILE [--size S] [--noise X] [--seed K] [--chunk C]\n"
              "       nitro_pack --tensors DIR --out FILE [--chunk C]");
  if (synthetic >= 0) {
    nitro::data::SyntheticImages set({.size = synthetic, .height = size, .width = size, .noise = noise, .seed = seed});
    nitro::data::RecordWriter w(out, {{"image", at::kByte, {3, size, size}}, {"label", at::kLong, {}}},
                                {.chunk_records = chunk});
    for (int64_t i = 0; i < synthetic; ++i) {
      auto e = set.get(static_cast<size_t>(i));
      w.write({(e.data * 40 + 128).clamp(0, 255).to(at::kByte), e.target});
    }
    w.close();
    std::printf("nitro_pack: %lld synthetic images of 3x%lldx%lld -> %s\n", static_cast<long long>(synthetic),
                static_cast<long long>(size), static_cast<long long>(size), out.c_str());
    return 0;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".pt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  NITRO_CHECK(!files.empty(), "nitro_pack: no *.pt file in ", dir);
  std::optional<nitro::data::RecordWriter> w;
  for (const auto& f : files) {
    at::Tensor image;
    torch::load(image, f.string());
    const auto stem = f.stem().string();
    const auto at = stem.rfind('_');
    NITRO_CHECK(at != std::string::npos && at + 1 < stem.size(), "nitro_pack: ", f.string(),
                ": no label after a '_' in the name (img_000123_7.pt -> 7)");
    char* end = nullptr;
    const auto label = std::strtoll(stem.c_str() + at + 1, &end, 10);
    NITRO_CHECK(end != nullptr && *end == '\0', "nitro_pack: ", f.string(),
                ": the label after the last '_' is not a whole number (img_000123_7.pt -> 7)");
    if (!w) w.emplace(out, std::vector<nitro::data::RecordField>{{"image", image.scalar_type(), image.sizes().vec()},
                                                                 {"label", at::kLong, {}}},
                      nitro::data::RecordWriter::Options{.chunk_records = chunk});
    w->write({image, torch::tensor(static_cast<int64_t>(label))});
  }
  w->close();
  std::printf("nitro_pack: %zu tensors from %s -> %s\n", files.size(), dir.c_str(), out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
