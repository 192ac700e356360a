#pragma once
// The definitions of nitro/optim/groups.hpp's non-template functions: included by groups.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/optim/groups.hpp>

namespace nitro::optim::detail {

NITRO_INLINE bool glob(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

NITRO_INLINE bool name_matches(std::string_view pattern, std::string_view name) {
  if (pattern.find_first_of("*?") != std::string_view::npos) return glob(pattern, name);
  if (!pattern.empty() && pattern.back() == '.') return name.starts_with(pattern);
  return name == pattern || (name.starts_with(pattern) && name.size() > pattern.size() && name[pattern.size()] == '.');
}

NITRO_INLINE std::string_view short_type(const std::string& type) {
  std::string_view t = type;
  if (const auto colon = t.rfind("::"); colon != std::string_view::npos) t.remove_prefix(colon + 2);
  if (t.ends_with("Impl")) t.remove_suffix(4);
  return t;
}

NITRO_INLINE Kind kind_of(const std::string& leaf, const torch::nn::Module& owner) {
  Kind k = Kind::none;
  if (leaf == "bias") k = k | Kind::bias;
  if (leaf != "weight") return k;
  const std::string_view type = short_type(owner.name());
  if (type.ends_with("Norm") || type.ends_with("Norm1d") || type.ends_with("Norm2d") || type.ends_with("Norm3d"))
    k = k | Kind::norm;
  if (type.ends_with("Embedding") || type.ends_with("EmbeddingBag")) k = k | Kind::embedding;
  return k;
}

NITRO_INLINE void collect(const torch::nn::Module& module, const std::string& prefix, std::vector<Found>& out, std::unordered_map<const void*, std::size_t>& seen) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    const at::Tensor& t = p.value();
    if (!t.requires_grad()) continue;
    const auto [it, fresh] = seen.emplace(t.unsafeGetTensorImpl(), out.size());
    if (fresh) out.push_back({{prefix + p.key()}, t, kind_of(p.key(), module)});
    else out[it->second].names.push_back(prefix + p.key());
  }
  for (const auto& child : module.named_children()) collect(*child.value(), prefix + child.key() + ".", out, seen);
}

}  // namespace nitro::optim::detail
