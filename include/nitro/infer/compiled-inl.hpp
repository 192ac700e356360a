#pragma once
// The definitions of nitro/infer/compiled.hpp's non-template functions: included by compiled.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/infer/compiled.hpp>

namespace nitro::infer::detail {

NITRO_INLINE void check_model_file(const std::string& path, const char* what) {
  std::error_code ec;
  NITRO_CHECK(std::filesystem::is_regular_file(path, ec), what, ": no such file: '", path,
              "' (give the path of the file exported from Python)");
}

NITRO_INLINE AotiModel::AotiModel(const std::string& path, const std::string& name, size_t runners) {
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

NITRO_INLINE std::vector<at::Tensor> AotiModel::run(const std::vector<at::Tensor>& inputs) {
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

NITRO_INLINE void AotiModel::fail_load(const std::string& path, const std::string& name, const char* why) {
  nitro::detail::fail("infer::load_aoti: '", path, "' could not be loaded as an AOTInductor package (model '",
                      name, "'): ", why,
                      " (export it with torch._inductor.aoti_compile_and_package, for this machine's device)");
}

NITRO_INLINE TorchScriptModel::TorchScriptModel(torch::jit::Module module, c10::Device device) : module_(std::move(module)), device_(device) {}

NITRO_INLINE std::vector<at::Tensor> TorchScriptModel::run(const std::vector<at::Tensor>& inputs) {
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

}  // namespace nitro::infer::detail

namespace nitro::infer {

NITRO_INLINE std::shared_ptr<Model> load_aoti(const std::string& path, const std::string& model_name, size_t runners) {
  NITRO_CHECK(runners >= 1, "infer::load_aoti: runners must be >= 1, got ", runners);
  return std::make_shared<detail::AotiModel>(path, model_name, runners);
}

NITRO_INLINE std::shared_ptr<Model> load_torchscript(const std::string& path, c10::Device device, TorchScriptOptions options) {
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
