// Uses a little of everything through the umbrella header; prints "nitro consumer ok" on success.
#include <nitro/nitro.hpp>

#include <cstdio>

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
  std::printf("nitro consumer ok: nitro %s, LibTorch %s, NITRO_WITH_CUDA=%d\n", nitro::version_string, TORCH_VERSION,
              NITRO_WITH_CUDA);
  return 0;
}
