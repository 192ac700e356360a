#include <nitro/optim/fused.hpp>
#include <nitro/optim/groups.hpp>

#include "testing.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace nitro_test_optim_groups {  // one namespace per file: an area is compiled as one translation unit

namespace {

// backbone (conv, batch norm), an embedding, a head (linear, layer norm), the head again under
// another name (tied weights), one frozen parameter.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    backbone = register_module("backbone", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                                                                  torch::nn::BatchNorm2d(4)));
    embed = register_module("embed", torch::nn::Embedding(10, 4));
    head = register_module("head", torch::nn::Linear(4, 10));
    head_norm = register_module("head_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
    header = register_module("header", torch::nn::Linear(4, 4));
    tied = register_module("tied", head);  // the same module (and tensors) under a second name
    frozen = register_parameter("frozen", torch::zeros({2}), /*requires_grad=*/false);
  }
  torch::nn::Sequential backbone{nullptr};
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr}, header{nullptr}, tied{nullptr};
  torch::nn::LayerNorm head_norm{nullptr};
  at::Tensor frozen;
};
TORCH_MODULE(Net);

using O = torch::optim::AdamWOptions;
using nitro::optim::Kind;

std::map<const void*, std::string> names_of(torch::nn::Module& m) {
  std::map<const void*, std::string> n;
  for (const auto& p : m.named_parameters()) n.emplace(p.value().unsafeGetTensorImpl(), p.key());  // first name wins
  return n;
}

}  // namespace

TEST_CASE("groups(): rules add up, every trainable parameter lands in exactly one group with the right options") {
  Net net;
  const auto names = names_of(*net);
  const auto groups = nitro::optim::groups<O>(
      *net, O(1e-3).weight_decay(0.05),
      {{"head", {.names = {"head"}}, [](O& o) { o.lr(1e-2); }},
       {"no_decay", {.kinds = Kind::bias | Kind::norm}, [](O& o) { o.weight_decay(0); }},
       {"embeddings", {.kinds = Kind::embedding}, [](O& o) { o.lr(5e-4); }}});
  std::set<const void*> seen;
  std::map<std::string, std::pair<double, double>> by_name;  // name -> (lr, weight decay)
  for (const auto& g : groups) {
    const auto& o = static_cast<const O&>(g.options());
    for (const auto& p : g.params()) {
      CHECK(seen.insert(p.unsafeGetTensorImpl()).second);  // once
      by_name[names.at(p.unsafeGetTensorImpl())] = {o.lr(), o.weight_decay()};
    }
  }
  // 2 (conv) + 2 (batch norm) + 1 (embedding) + 2 (head) + 2 (layer norm) + 2 (header): 11; tied's
  // are head's, the frozen one is left out.
  CHECK(seen.size() == 11);
  CHECK(by_name.count("frozen") == 0);
  using P = std::pair<double, double>;
  CHECK(by_name.at("backbone.0.weight") == P{1e-3, 0.05});  // the default group
  CHECK(by_name.at("backbone.0.bias") == P{1e-3, 0.0});
  CHECK(by_name.at("backbone.1.weight") == P{1e-3, 0.0});  // a BatchNorm's weight: norm
  CHECK(by_name.at("embed.weight") == P{5e-4, 0.05});
  CHECK(by_name.at("head.weight") == P{1e-2, 0.05});
  CHECK(by_name.at("head.bias") == P{1e-2, 0.0});  // both rules
  CHECK(by_name.at("head_norm.weight") == P{1e-3, 0.0});  // "head" does not match "head_norm"
  CHECK(by_name.at("header.weight") == P{1e-3, 0.05});  // nor "header"
  // Groups in the order their first parameter appears: default, no_decay, embeddings, head, head+no_decay.
  REQUIRE(groups.size() == 5);
  CHECK(static_cast<const O&>(groups[0].options()).weight_decay() == 0.05);
  CHECK(static_cast<const O&>(groups[0].options()).lr() == 1e-3);

  // The groups build an optimizer, which steps every parameter.
  nitro::optim::FusedAdamW optimizer(groups, O(1e-3));
  CHECK(optimizer.param_groups().size() == 5);
}

TEST_CASE("groups(): globs, prefixes and kinds together, and a rule that matches nothing is named") {
  Net net;
  const auto names = names_of(*net);
  const auto groups = nitro::optim::groups<O>(*net, O(1e-3),
                                              {{"biases_of_backbone", {.names = {"backbone.*"}, .kinds = Kind::bias},
                                               [](O& o) { o.lr(1.0); }},
                                               {"h_prefix", {.names = {"head."}}, [](O& o) { o.lr(2.0); }}});
  std::map<std::string, double> lr;
  for (const auto& g : groups)
    for (const auto& p : g.params()) lr[names.at(p.unsafeGetTensorImpl())] = static_cast<const O&>(g.options()).lr();
  CHECK(lr.at("backbone.0.bias") == 1.0);
  CHECK(lr.at("backbone.1.bias") == 1.0);
  CHECK(lr.at("backbone.0.weight") == 1e-3);
  CHECK(lr.at("head.weight") == 2.0);
  CHECK(lr.at("head_norm.weight") == 1e-3);  // "head." is a plain prefix: not head_norm

  CHECK(nitro::optim::detail::glob("*.bias", "a.b.bias"));
  CHECK_FALSE(nitro::optim::detail::glob("*.bias", "a.bias.x"));
  CHECK(nitro::optim::detail::glob("blocks.?.attn.*", "blocks.3.attn.q.weight"));
  CHECK_FALSE(nitro::optim::detail::glob("blocks.?.attn.*", "blocks.12.attn.q.weight"));

  CHECK_THROWS_WITH_AS(nitro::optim::groups<O>(*net, O(1e-3), {{"typo", {.names = {"haed"}}, [](O& o) { o.lr(1); }}}),
                       doctest::Contains("rule \"typo\" matches no parameter"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::optim::groups<O>(*net, O(1e-3), {{"frozen_only", {.names = {"frozen"}}, [](O& o) { o.lr(1); }}}),
                       doctest::Contains("rule \"frozen_only\" matches no parameter"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::optim::groups<O>(*net, O(1e-3), {{"all", {}, [](O& o) { o.lr(1); }}}),
                       doctest::Contains("matches by neither names nor kinds"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::optim::groups<O>(*net, O(1e-3), {{"x", {.names = {"head"}}, nullptr}}),
                       doctest::Contains("has no edit"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::optim::groups<O>(*net, O(1e-3), {{"a", {.names = {"head"}}, [](O&) {}},
                                                               {"a", {.names = {"embed"}}, [](O&) {}}}),
                       doctest::Contains("two rules are named \"a\""), nitro::Error);
  // No rule: one group, the defaults, every trainable parameter.
  const auto one = nitro::optim::groups<O>(*net, O(1e-3), {});
  REQUIRE(one.size() == 1);
  CHECK(one[0].params().size() == 11);
}

namespace {
struct SurfaceNormalHeadImpl : torch::nn::Module {  // "Norm" inside the name, not a norm
  SurfaceNormalHeadImpl() { weight = register_parameter("weight", torch::ones({3})); }
  at::Tensor weight;
};
TORCH_MODULE(SurfaceNormalHead);
struct MyLayerNormImpl : torch::nn::Module {
  MyLayerNormImpl() { weight = register_parameter("weight", torch::ones({3})); }
  at::Tensor weight;
};
TORCH_MODULE(MyLayerNorm);
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    normal = register_module("normal", SurfaceNormalHead());
    norm = register_module("norm", MyLayerNorm());
    head = register_module("head", torch::nn::Linear(3, 3));
    tied = register_module("tied", head);
  }
  SurfaceNormalHead normal{nullptr};
  MyLayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr}, tied{nullptr};
};
TORCH_MODULE(TwoHeads);
}  // namespace

TEST_CASE("groups(): a norm is a class whose name ends so, and a shared module matches by any of its names") {
  TwoHeads net;
  const auto names = names_of(*net);
  const auto groups = nitro::optim::groups<O>(*net, O(1e-3),
                                              {{"norms", {.kinds = Kind::norm}, [](O& o) { o.weight_decay(0); }},
                                               {"tied", {.names = {"tied"}}, [](O& o) { o.lr(0.5); }}});
  std::map<std::string, std::pair<double, double>> by_name;
  for (const auto& g : groups)
    for (const auto& p : g.params())
      by_name[names.at(p.unsafeGetTensorImpl())] = {static_cast<const O&>(g.options()).lr(),
                                                     static_cast<const O&>(g.options()).weight_decay()};
  using P = std::pair<double, double>;
  CHECK(by_name.at("normal.weight") == P{1e-3, 0.01});  // SurfaceNormalHead: not a norm (AdamW's default decay)
  CHECK(by_name.at("norm.weight") == P{1e-3, 0.0});      // MyLayerNorm: a norm
  CHECK(by_name.at("head.weight") == P{0.5, 0.01});      // "tied" names head's tensors too
  CHECK(by_name.at("head.bias") == P{0.5, 0.01});
  CHECK(by_name.size() == 4);
}

}  // namespace nitro_test_optim_groups
