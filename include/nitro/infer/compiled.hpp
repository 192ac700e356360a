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
#include <nitro/core/config.hpp>
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

NITRO_INLINE void check_model_file(const std::string& path, const char* what);

class AotiModel final : public Model {
 public:
  NITRO_INLINE AotiModel(const std::string& path, const std::string& name, size_t runners);
  // AOTInductor's generated code checks its inputs only when AOTI_RUNTIME_CHECK_INPUTS=1 is set; without
  // that, a wrong dtype or shape runs and returns garbage. The first run fixes each input's dtype and
  // sample shape (all but the batch dimension); a later run that differs is refused.
  NITRO_INLINE std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override;
  [[noreturn]] NITRO_INLINE static void fail_load(const std::string& path, const std::string& name, const char* why);
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
  NITRO_INLINE TorchScriptModel(torch::jit::Module module, c10::Device device);
  NITRO_INLINE std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) override;
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
NITRO_INLINE std::shared_ptr<Model> load_aoti(const std::string& path, const std::string& model_name = "model",
                                        size_t runners = 1);

/// Options of load_torchscript.
struct TorchScriptOptions {
  /// torch::jit::freeze after loading: weights become constants, attributes are inlined.
  bool freeze = true;
  /// torch::jit::optimize_for_inference after freezing (needs `freeze`).
  bool optimize_for_inference = true;
};

/// A TorchScript file (`torch.jit.save`) as a Model on `device`, in eval mode, frozen and optimized
/// for inference unless `options` say otherwise. The legacy path: see the top of this file.
NITRO_INLINE std::shared_ptr<Model> load_torchscript(const std::string& path, c10::Device device = c10::kCPU,
                                               TorchScriptOptions options = {});

}  // namespace nitro::infer

#if !NITRO_COMPILED
#include <nitro/infer/compiled-inl.hpp>
#endif
