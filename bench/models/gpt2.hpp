#pragma once
// A GPT-2 decoder in nanoGPT's layout (github.com/karpathy/nanoGPT, model.py): learned token and position
// embeddings, pre-norm blocks (LayerNorm, causal self-attention through scaled_dot_product_attention
// with is_causal, LayerNorm, a 4x MLP with exact GELU), a final LayerNorm and a head tied to the token
// embedding. The same parameter names, in the same order, as nanoGPT's GPT (the tied head is
// transformer.wte.weight, listed once); nanoGPT's initialisation rules (normal(0, 0.02), the residual
// projections normal(0, 0.02 / sqrt(2 layers)), zero biases) drawn from the current seed. No dropout
// (nanoGPT's default for training from scratch is 0). The Python twin is bench/peers/models.py.
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace nitro::bench {

/// nanoGPT's GPTConfig; the defaults are GPT-2 124M with nanoGPT's vocabulary padded to 50304.
struct Gpt2Config {
  std::int64_t block = 1024, vocab = 50304, layers = 12, heads = 12, width = 768;
};

struct Gpt2AttentionImpl : torch::nn::Module {
  explicit Gpt2AttentionImpl(const Gpt2Config& c)
      : heads(c.heads),
        c_attn(register_module("c_attn", torch::nn::Linear(c.width, 3 * c.width))),
        c_proj(register_module("c_proj", torch::nn::Linear(c.width, c.width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    const auto qkv = c_attn(x).split(d, 2);
    const auto head = [&](const at::Tensor& y) { return y.view({b, t, heads, d / heads}).transpose(1, 2); };
    const auto y = at::scaled_dot_product_attention(head(qkv[0]), head(qkv[1]), head(qkv[2]), {}, 0.0,
                                                    /*is_causal=*/true);
    return c_proj(y.transpose(1, 2).contiguous().view({b, t, d}));
  }

  std::int64_t heads;
  torch::nn::Linear c_attn, c_proj;
};
TORCH_MODULE(Gpt2Attention);

struct Gpt2MlpImpl : torch::nn::Module {
  explicit Gpt2MlpImpl(const Gpt2Config& c)
      : c_fc(register_module("c_fc", torch::nn::Linear(c.width, 4 * c.width))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * c.width, c.width))) {}

  at::Tensor forward(const at::Tensor& x) { return c_proj(at::gelu(c_fc(x))); }

  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(Gpt2Mlp);

struct Gpt2BlockImpl : torch::nn::Module {
  explicit Gpt2BlockImpl(const Gpt2Config& c)
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        attn(register_module("attn", Gpt2Attention(c))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        mlp(register_module("mlp", Gpt2Mlp(c))) {}

  at::Tensor forward(at::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }

  torch::nn::LayerNorm ln_1;
  Gpt2Attention attn;
  torch::nn::LayerNorm ln_2;
  Gpt2Mlp mlp;
};
TORCH_MODULE(Gpt2Block);

/// nanoGPT's `transformer` ModuleDict: wte, wpe, h, ln_f.
struct Gpt2TrunkImpl : torch::nn::Module {
  explicit Gpt2TrunkImpl(const Gpt2Config& c)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab, c.width))),
        wpe(register_module("wpe", torch::nn::Embedding(c.block, c.width))),
        h(register_module("h", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))) {
    for (std::int64_t i = 0; i < c.layers; ++i) h->push_back(Gpt2Block(c));
  }

  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f;
};
TORCH_MODULE(Gpt2Trunk);

struct Gpt2Impl : torch::nn::Module {
  explicit Gpt2Impl(const Gpt2Config& c = {}) : config(c), transformer(register_module("transformer", Gpt2Trunk(c))) {
    // nanoGPT's _init_weights, then its scaled initialisation of the residual projections.
    const at::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      const auto& name = p.key();
      auto& w = p.value();
      if (name.find("ln_") != std::string::npos) {
        if (name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0) w.fill_(1.0);
        else w.zero_();
      } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        w.zero_();
      } else if (name.size() >= 13 && name.compare(name.size() - 13, 13, "c_proj.weight") == 0) {
        w.normal_(0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers)));
      } else {
        w.normal_(0.0, 0.02);
      }
    }
  }

  /// tokens [B, T] (int64, T <= block) -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& tokens) {
    const auto t = tokens.size(1);
    auto x = transformer->wte(tokens) + transformer->wpe(at::arange(t, tokens.options()));
    for (const auto& block : *transformer->h) x = block->as<Gpt2Block>()->forward(x);
    return at::linear(transformer->ln_f(x), transformer->wte->weight);  // lm_head, tied to wte
  }

  Gpt2Config config;
  Gpt2Trunk transformer;
};
TORCH_MODULE(Gpt2);

}  // namespace nitro::bench
