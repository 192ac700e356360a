#pragma once
// The definitions of nitro/train/channels_last.hpp's non-template functions: included by channels_last.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/channels_last.hpp>

namespace nitro {

NITRO_INLINE std::int64_t to_channels_last(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  std::int64_t changed = 0;
  const auto convert = [&](at::Tensor& t) {
    if (!t.defined() || t.dim() != 4 || t.is_contiguous(c10::MemoryFormat::ChannelsLast)) return;
    t.set_data(t.contiguous(c10::MemoryFormat::ChannelsLast));
    ++changed;
  };
  for (auto& p : module.parameters(/*recurse=*/true)) {
    convert(p);
    if (p.grad().defined() && p.grad().dim() == 4) p.mutable_grad() = p.grad().contiguous(c10::MemoryFormat::ChannelsLast);
  }
  for (auto& b : module.buffers(/*recurse=*/true)) convert(b);
  return changed;
}

NITRO_INLINE bool is_channels_last(torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true))
    if (p.dim() == 4 && !p.is_contiguous(c10::MemoryFormat::ChannelsLast)) return false;
  for (const auto& b : module.buffers(/*recurse=*/true))
    if (b.dim() == 4 && !b.is_contiguous(c10::MemoryFormat::ChannelsLast)) return false;
  return true;
}

}  // namespace nitro
