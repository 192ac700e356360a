// Uses a little of everything through the umbrella header; prints "nitro consumer ok" on success.
#include <nitro/nitro.hpp>

#include <cstdio>
#if NITRO_CONSUMER_IMAGE
#include <ATen/ops/full.h>
#include <nitro/data/image.hpp>
#endif

int main() {
  static_assert(NITRO_VERSION_MAJOR >= 0 && nitro::DeviceTag<nitro::Cuda>);
  nitro::data::SyntheticImages images{{.size = 4, .classes = 3, .height = 8, .width = 8}};
  auto example = nitro::to_device<nitro::Cpu>(images.get(1));
  const bool shapes_ok = example.data.sizes() == at::IntArrayRef{3, 8, 8} && example.target.dim() == 0;
  {
    nitro::hw::ScopedSettings scope{{.intra_op_threads = 1}};
  }
  try {
    nitro::hw::ScopedSettings bad{{.intra_op_threads = 0}};
    return 1;
  } catch (const nitro::Error&) {
  }
  if (!shapes_ok) return 1;
#if NITRO_CONSUMER_IMAGE
  // nitro::image: a JPEG written and read back.
  const auto gray = at::full({1, 16, 24}, 77, at::kByte);
  const auto back = nitro::image::decode(nitro::image::encode_jpeg(gray, {.quality = 100}));
  if (back.sizes() != at::IntArrayRef{3, 16, 24} || (back.to(at::kInt) - 77).abs().max().item<int>() > 1) return 1;
  std::printf("nitro consumer: nitro::image ok\n");
#endif
  std::printf("nitro consumer ok: nitro %s, LibTorch %s, NITRO_WITH_CUDA=%d, %s\n", nitro::version_string,
              TORCH_VERSION, NITRO_WITH_CUDA, NITRO_COMPILED ? "compiled library" : "header-only");
  return 0;
}
