#pragma once
// Compiled models behind infer::Model: AOTInductor packages (the primary path) and TorchScript files
// (the legacy loader).
//
//   auto model = nitro::infer::load_aoti("cnn.pt2");                    // from Python, once:
//   //   ep = torch.export.export(model.eval(), (example,), dynamic_shapes=...)
//   //   torch._inductor.aoti_compile_and_package(ep, package_path="cnn.pt2")
//   auto out = model->run({images});
//
//   auto legacy = nitro::infer::load_torchscript("cnn.ts", c10::kCPU);   // torch.jit.trace/script + save
//
// AOTInductor compiles the exported graph ahead of time into a shared library inside the package
// (C++ from the machine's compiler on the CPU, Triton/CUDA kernels on a GPU) and runs it without
// Python and without the TorchScript interpreter; its device is fixed when it is compiled. A package
// compiled with a dynamic batch dimension serves any batch size in its range, which the
// DynamicBatcher needs.
//
// TorchScript is deprecated in PyTorch 2.11: scripting and saving warn, the C++ loader still ships.
// load_torchscript loads, then (by default) freezes the module (`torch::jit::freeze`: weights become
// constants, the graph is simplified) and runs `torch::jit::optimize_for_inference` (conv-BN folding,
// oneDNN layouts on the CPU), the C++ forms of Python's `torch.jit.freeze` and
// `torch.jit.optimize_for_inference`. Use it for models already exported that way; export new ones
// with AOTInductor.
//
// This header pulls in the JIT's and the AOTInductor runner's headers, heavier than the rest of
// infer/: include it only where a compiled model is loaded.
#include <nitro/core/error.hpp>
#include <nitro/infer/model.hpp>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <filesystem>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nitro::infer {

namespace detail {

inline void check_model_file(const std::string& path, const char* what) {
  std::error_code ec;
  NITRO_CHECK(std::filesystem::is_regular_file(path, ec), what, ": no such file: '", path,
              "' (give the path of the file exported from Python)");
}

class AotiModel final : public Model {
 public:
  AotiModel(const std::string& path, const std::string& name, size_t runners) {
    detail::check_model_file(path, "infer::load_aoti");
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, name, false, runners);
      const auto meta = loader_->get_metadata();
      const auto it = meta.find("AOTI_DEVICE_KEY");
      NITRO_CHECK(it != meta.end(), "infer::load_aoti: '", path, "' names no device in its metadata "
                  "(AOTI_DEVICE_KEY); export it again with this PyTorch's aoti_compile_and_package");
      device_ = c10::Device(it->second);
    } catch (const c10::Error& e) {
      fail_load(path, name, e.what_without_backtrace());
    } catch (const std::exception& e) {
      fail_load(path, name, e.what());
    }
  }
  // AOTInductor's generated code checks its inputs only when AOTI_RUNTIME_CHECK_INPUTS=1 is set; without
  // that, a wrong dtype or shape runs and returns garbage. The first run fixes each input's dtype and
  // sample shape (all but the batch dimension); a later run that differs is refused.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override {
    if (expected_.empty()) {
      for (const auto& t : inputs) expected_.push_back({t.scalar_type(), t.sizes().slice(t.dim() ? 1 : 0).vec()});
    } else {
      NITRO_CHECK(inputs.size() == expected_.size(), "infer::load_aoti: the model was first run with ",
                  expected_.size(), " inputs, now ", inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        const auto& t = inputs[i];
        NITRO_CHECK(t.scalar_type() == expected_[i].dtype && t.dim() >= 1 &&
                        t.sizes().slice(1).vec() == expected_[i].sample,
                    "infer::load_aoti: input ", i, " is ", c10::toString(t.scalar_type()), " ", t.sizes(),
                    "; the model was first run with ", c10::toString(expected_[i].dtype), " [batch, ",
                    c10::IntArrayRef(expected_[i].sample), "] (a compiled model does not check its inputs)");
      }
    }
    for (const auto& t : inputs)
      NITRO_CHECK(t.device() == device_, "infer::load_aoti: an input is on ", t.device(), ", the model on ", device_,
                  " (infer::Runner moves inputs for you)");
    return loader_->run(inputs);
  }
  [[noreturn]] static void fail_load(const std::string& path, const std::string& name, const char* why) {
    nitro::detail::fail("infer::load_aoti: '", path, "' could not be loaded as an AOTInductor package (model '",
                        name, "'): ", why,
                        " (export it with torch._inductor.aoti_compile_and_package, for this machine's device)");
  }
  [[nodiscard]] c10::Device device() const override { return device_; }
  [[nodiscard]] std::string kind() const override { return "aoti"; }

 private:
  struct Expected {
    c10::ScalarType dtype;
    std::vector<int64_t> sample;
  };
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  c10::Device device_{c10::kCPU};
  std::vector<Expected> expected_;
};

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, c10::Device device) : module_(std::move(module)), device_(device) {}
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override {
    std::vector<c10::IValue> args(inputs.begin(), inputs.end());
    c10::IValue out = module_.forward(std::move(args));
    std::vector<at::Tensor> result;
    if (out.isTensor()) {
      result.push_back(out.toTensor());
    } else if (out.isTuple()) {
      for (const auto& v : out.toTupleRef().elements()) result.push_back(v.toTensor());
    } else if (out.isTensorList()) {
      for (const auto& t : out.toTensorVector()) result.push_back(t);
    } else {
      nitro::detail::fail("infer::load_torchscript: the module's forward returned a ", out.tagKind(),
                          "; a served model returns a tensor, a tuple of tensors or a list of tensors");
    }
    return result;
  }
  [[nodiscard]] c10::Device device() const override { return device_; }
  [[nodiscard]] std::string kind() const override { return "torchscript"; }

 private:
  torch::jit::Module module_;
  c10::Device device_;
};

}  // namespace detail

/// An AOTInductor package (`.pt2`) as a Model. `runners`: how many copies of the compiled model the
/// package's container keeps, for callers on several threads (1 for the batcher's one worker).
/// Throws nitro::Error for a missing file or a package that does not load (another device, another
/// PyTorch version).
inline std::shared_ptr<Model> load_aoti(const std::string& path, const std::string& model_name = "model",
                                        size_t runners = 1) {
  NITRO_CHECK(runners >= 1, "infer::load_aoti: runners must be >= 1, got ", runners);
  return std::make_shared<detail::AotiModel>(path, model_name, runners);
}

/// Options of load_torchscript.
struct TorchScriptOptions {
  /// torch::jit::freeze after loading: weights become constants, attributes are inlined.
  bool freeze = true;
  /// torch::jit::optimize_for_inference after freezing (needs `freeze`).
  bool optimize_for_inference = true;
};

/// A TorchScript file (`torch.jit.save`) as a Model on `device`, in eval mode, frozen and optimized
/// for inference unless `options` say otherwise. The legacy path: see the top of this file.
inline std::shared_ptr<Model> load_torchscript(const std::string& path, c10::Device device = c10::kCPU,
                                               TorchScriptOptions options = {}) {
  detail::check_model_file(path, "infer::load_torchscript");
  NITRO_CHECK(!options.optimize_for_inference || options.freeze,
              "infer::load_torchscript: optimize_for_inference works on a frozen module; set freeze too");
  try {
    torch::jit::Module module = torch::jit::load(path, device);
    module.eval();
    if (options.freeze) module = torch::jit::freeze(module);
    if (options.optimize_for_inference) module = torch::jit::optimize_for_inference(module);
    return std::make_shared<detail::TorchScriptModel>(std::move(module), device);
  } catch (const c10::Error& e) {
    nitro::detail::fail("infer::load_torchscript: '", path, "' could not be loaded as TorchScript: ",
                        e.what_without_backtrace(), " (save it with torch.jit.save of a traced or scripted module)");
  } catch (const std::exception& e) {
    nitro::detail::fail("infer::load_torchscript: '", path, "' could not be loaded as TorchScript: ", e.what(),
                        " (save it with torch.jit.save of a traced or scripted module)");
  }
}

}  // namespace nitro::infer
