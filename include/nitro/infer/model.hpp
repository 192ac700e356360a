#pragma once
// One interface over the ways a trained model is served.
//
//   nitro::infer::Model           what the runner and the batcher call: tensors in, tensors out
//   nitro::infer::module_model()  a torch::nn module (eager; `prepare` it first: infer/runner.hpp)
//   nitro::infer::load_aoti()     an AOTInductor package (infer/compiled.hpp): the primary compiled path
//   nitro::infer::load_torchscript()  a TorchScript file (infer/compiled.hpp): the legacy loader
//
//   auto model = nitro::infer::module_model(prepared_cnn);           // any holder with forward(Tensor)
//   std::vector<at::Tensor> out = model->run({images});
//
// A Model is called from one thread at a time unless its kind says otherwise (the DynamicBatcher calls
// it from its one worker). The first input's first dimension is the batch for every kind.
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro::infer {

/// A model to serve, whatever made it (a module, an AOTInductor package, a TorchScript file): what a
/// Runner runs. Make one with module_model, load_aoti or load_torchscript, or derive from it.
class Model {
 public:
  virtual ~Model() = default;
  /// Runs one batch. Inputs and outputs are on `device()`.
  virtual std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) = 0;
  /// Where the model's weights live, where its inputs go.
  [[nodiscard]] virtual c10::Device device() const = 0;
  /// "module", "aoti" or "torchscript", for reports.
  [[nodiscard]] virtual std::string kind() const = 0;
  /// The floating dtype its inputs must have, where the model knows it (a module: its parameters'):
  /// the Runner converts floating inputs to it. Empty: inputs are passed as they are.
  [[nodiscard]] virtual std::optional<c10::ScalarType> dtype() const { return std::nullopt; }
};

namespace detail {

template <class Holder>
class ModuleModel final : public Model {
 public:
  ModuleModel(Holder module, c10::Device device, std::optional<c10::ScalarType> dtype)
      : module_(std::move(module)), device_(device), dtype_(dtype) {}
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override {
    NITRO_CHECK(inputs.size() == 1, "infer::module_model: a torch::nn module takes one input tensor, got ",
                inputs.size());
    return {module_->forward(inputs.front())};
  }
  [[nodiscard]] c10::Device device() const override { return device_; }
  [[nodiscard]] std::string kind() const override { return "module"; }
  [[nodiscard]] std::optional<c10::ScalarType> dtype() const override { return dtype_; }

 private:
  Holder module_;
  c10::Device device_;
  std::optional<c10::ScalarType> dtype_;
};

}  // namespace detail

/// A torch::nn module holder whose forward takes one tensor and returns one, as a Model. The device and
/// the input dtype are those of its first parameter (the CPU and none for a module without
/// parameters); take the Model after `prepare`, which may move and convert them.
template <class Holder>
  requires requires(Holder h, at::Tensor t) {
    { h->forward(t) } -> std::convertible_to<at::Tensor>;
    h->parameters();
  }
std::shared_ptr<Model> module_model(Holder module) {
  NITRO_CHECK(!module.is_empty(), "infer::module_model: the module holder is empty (default-constructed)");
  const auto params = module->parameters();
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  std::optional<c10::ScalarType> dtype;
  if (!params.empty() && params.front().is_floating_point()) dtype = params.front().scalar_type();
  return std::make_shared<detail::ModuleModel<Holder>>(std::move(module), device, dtype);
}

}  // namespace nitro::infer
