#pragma once
// Parameter groups by rule: "a higher learning rate for the head, no weight decay on biases and
// norms", as torch::optim::OptimizerParamGroups for any optimizer (LibTorch's or Nitro's fused ones).
//
//   using nitro::optim::Kind;
//   auto defaults = torch::optim::AdamWOptions(1e-3).weight_decay(0.05);
//   nitro::optim::FusedAdamW optimizer(
//       nitro::optim::groups(*model, defaults, {
//           {"head", {.names = {"head"}}, [](auto& o) { o.lr(1e-2); }},
//           {"no_decay", {.kinds = Kind::bias | Kind::norm}, [](auto& o) { o.weight_decay(0); }},
//       }),
//       defaults);
//
// Rules add up: each rule edits the options of the parameters it matches, in the order given, so a
// bias of the head gets lr 1e-2 *and* weight decay 0. Parameters matched by the same set of rules
// form one group (groups in the order their first parameter appears in the model); a parameter
// matched by no rule goes to the default group (options = defaults). Every trainable parameter is
// in exactly one group, once (a parameter shared by two modules too); parameters that do not
// require gradients are left out. A rule that matches no parameter is a nitro::Error naming it
// (a typo in a name would otherwise train with the wrong options, silently).
//
// Matching (a rule matches a parameter when both parts that are given match):
//   names   patterns over the parameter's full name (model->named_parameters(), e.g. "head.0.weight"):
//           one without '*' or '?' matches that name and every name under it ("head" matches
//           "head.0.weight" but not "header.weight"; "head." is a plain prefix); with them, a glob over
//           the whole name in which '*' also crosses dots ("*.bias", "blocks.*.attn.*").
//           A parameter shared by two modules matches by any of its names.
//   kinds   Kind::bias (a parameter named "bias"), Kind::norm (the weight of a normalisation module:
//           one whose class name, without namespace and "Impl", ends with Norm, Norm1d, Norm2d or
//           Norm3d: BatchNorm2d, LayerNorm, GroupNorm, InstanceNorm1d, RMSNorm, a user's LayerNorm),
//           Kind::embedding (the weight of an Embedding or EmbeddingBag, or a user's own *Embedding);
//           combine with |.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::optim {

/// Kinds of parameters a rule can match; combine with |.
enum class Kind : unsigned { none = 0, bias = 1, norm = 2, embedding = 4 };
/// Both kinds: a rule matching `Kind::bias | Kind::norm` matches either.
constexpr Kind operator|(Kind a, Kind b) noexcept {
  return static_cast<Kind>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
/// Whether `a` and `b` have a kind in common.
constexpr bool any(Kind a, Kind b) noexcept { return (static_cast<unsigned>(a) & static_cast<unsigned>(b)) != 0; }

/// Which parameters a rule applies to: names and kinds; each part given must match.
struct Match {
  std::vector<std::string> names;  ///< Name patterns, any of which may match (see the top); empty: any name.
  Kind kinds = Kind::none;         ///< Kinds, any of which may match; Kind::none: any kind.
};

/// A rule: its name (for errors), what it matches, and its edit of the options.
template <class Options>
struct Rule {
  std::string name;                    ///< Unique and not empty; errors name the rule by it.
  Match match;                         ///< The parameters it applies to: names, kinds or both.
  std::function<void(Options&)> edit;  ///< Changes the options of the groups it matches, e.g. `o.lr(1e-2)`.
};

namespace detail {

/// '*' (any run, dots too) and '?' (one character) over the whole name.
NITRO_INLINE bool glob(std::string_view pattern, std::string_view name);

NITRO_INLINE bool name_matches(std::string_view pattern, std::string_view name);

// The class name without namespaces and LibTorch's "Impl": torch::nn::BatchNorm2dImpl -> BatchNorm2d.
NITRO_INLINE std::string_view short_type(const std::string& type);

NITRO_INLINE Kind kind_of(const std::string& leaf, const torch::nn::Module& owner);

struct Found {
  std::vector<std::string> names;  // the first, then any other name the model gives it (a shared module)
  at::Tensor param;
  Kind kind;
};

// Every trainable parameter once, in the model's order, with its kind (the module owning it) and
// every name it has.
NITRO_INLINE void collect(const torch::nn::Module& module, const std::string& prefix, std::vector<Found>& out,
                    std::unordered_map<const void*, std::size_t>& seen);

}  // namespace detail

/// The parameter groups of `model` by `rules` (see the top of this header), each with its own
/// options: `defaults` edited by the rules that match its parameters, in order.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> groups(const torch::nn::Module& model, const Options& defaults,
                                                      const std::vector<Rule<Options>>& rules) {
  static_assert(std::is_base_of_v<torch::optim::OptimizerOptions, Options>,
                "nitro::optim::groups: Options must be an optimizer's options type, e.g. torch::optim::AdamWOptions");
  NITRO_CHECK(rules.size() <= 64, "nitro::optim::groups: at most 64 rules, got ", rules.size());
  for (std::size_t r = 0; r < rules.size(); ++r) {
    const auto& rule = rules[r];
    NITRO_CHECK(!rule.name.empty(), "nitro::optim::groups: rule ", r, " has no name; name each rule (errors use it)");
    NITRO_CHECK(!rule.match.names.empty() || rule.match.kinds != Kind::none, "nitro::optim::groups: rule \"", rule.name,
                "\" matches by neither names nor kinds; give .names, .kinds or both");
    NITRO_CHECK(static_cast<bool>(rule.edit), "nitro::optim::groups: rule \"", rule.name,
                "\" has no edit; give a function that changes the options, e.g. [](auto& o) { o.lr(1e-2); }");
    for (const auto& n : rule.match.names)
      NITRO_CHECK(!n.empty(), "nitro::optim::groups: rule \"", rule.name, "\" has an empty name pattern");
    for (std::size_t q = 0; q < r; ++q)
      NITRO_CHECK(rules[q].name != rule.name, "nitro::optim::groups: two rules are named \"", rule.name, "\"");
  }
  std::vector<detail::Found> params;
  std::unordered_map<const void*, std::size_t> seen;
  detail::collect(model, "", params, seen);
  NITRO_CHECK(!params.empty(), "nitro::optim::groups: the model has no parameter that requires a gradient");

  std::vector<std::uint64_t> keys;  // the set of rules of each group, in order of first appearance
  std::vector<std::vector<at::Tensor>> members;
  std::vector<bool> used(rules.size(), false);
  for (const auto& p : params) {
    std::uint64_t key = 0;
    for (std::size_t r = 0; r < rules.size(); ++r) {
      const auto& m = rules[r].match;
      bool by_name = m.names.empty();
      for (const auto& pattern : m.names)
        for (const auto& name : p.names) by_name = by_name || detail::name_matches(pattern, name);
      const bool by_kind = m.kinds == Kind::none || any(m.kinds, p.kind);
      if (by_name && by_kind) key |= std::uint64_t{1} << r, used[r] = true;
    }
    std::size_t g = 0;
    while (g < keys.size() && keys[g] != key) ++g;
    if (g == keys.size()) keys.push_back(key), members.emplace_back();
    members[g].push_back(p.param);
  }
  for (std::size_t r = 0; r < rules.size(); ++r)
    NITRO_CHECK(used[r], "nitro::optim::groups: rule \"", rules[r].name,
                "\" matches no parameter of the model; check its names (full names such as \"", params.front().names.front(),
                "\") and kinds");

  std::vector<torch::optim::OptimizerParamGroup> out;
  out.reserve(keys.size());
  for (std::size_t g = 0; g < keys.size(); ++g) {
    auto options = std::make_unique<Options>(defaults);
    for (std::size_t r = 0; r < rules.size(); ++r)
      if (keys[g] & (std::uint64_t{1} << r)) rules[r].edit(*options);
    out.emplace_back(std::move(members[g]), std::move(options));
  }
  return out;
}

}  // namespace nitro::optim

#if !NITRO_COMPILED
#include <nitro/optim/groups-inl.hpp>
#endif
