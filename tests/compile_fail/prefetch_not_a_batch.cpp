// expect: customization point nitro_map_tensors
// A prefetcher over a source whose batch type Nitro cannot move to a device: the message names the
// customization point to provide.
#include <nitro/data/prefetcher.hpp>

#include <optional>

struct Plain {
  at::Tensor x;
};

int main() {
  auto source = []() -> std::optional<Plain> { return std::nullopt; };
  nitro::Prefetcher<nitro::Cpu, decltype(source)> p{source};
  (void)p;
}
