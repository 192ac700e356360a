#pragma once
// Weights moved by name between a Python model and a C++ one: `weights.txt` lists each tensor
// (`name dtype numel dim0 dim1 ...`, in the order of the data), `weights.bin` holds their bytes,
// little-endian, one after the other. examples/yolo/convert.py writes them from a model built from
// Ultralytics' yolov8<scale>.yaml; load() reads them into a module's parameters and buffers by name.
#include <torch/nn/module.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo {

/// Copies every tensor of `dir`/weights.{txt,bin} into the parameter or buffer of `module` with its
/// name and shape; throws naming the first name missing on either side, or a shape or dtype that differs.
inline void load(torch::nn::Module& module, const std::filesystem::path& dir) {
  std::map<std::string, at::Tensor> mine;
  for (const auto& p : module.named_parameters()) mine[p.key()] = p.value();
  for (const auto& b : module.named_buffers()) mine[b.key()] = b.value();
  std::ifstream index(dir / "weights.txt"), data(dir / "weights.bin", std::ios::binary);
  if (!index || !data) throw std::runtime_error("yolo::load: cannot read " + (dir / "weights.txt").string() + " and .bin");
  std::string line;
  std::set<std::string> seen;
  const at::NoGradGuard no_grad;
  while (std::getline(index, line)) {
    std::istringstream in(line);
    std::string name, dtype;
    std::int64_t numel = 0;
    in >> name >> dtype >> numel;
    std::vector<std::int64_t> shape;
    for (std::int64_t d; in >> d;) shape.push_back(d);
    if (dtype != "float32" && dtype != "int64") throw std::runtime_error("yolo::load: " + name + " has dtype " + dtype);
    auto t = at::empty(shape, at::TensorOptions().dtype(dtype == "int64" ? at::kLong : at::kFloat));
    data.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!data) throw std::runtime_error("yolo::load: weights.bin ends inside " + name);
    const auto it = mine.find(name);
    if (it == mine.end()) throw std::runtime_error("yolo::load: the model has no tensor named " + name);
    if (!it->second.sizes().equals(t.sizes()))
      throw std::runtime_error("yolo::load: " + name + " is " + std::to_string(it->second.numel()) +
                               " elements here and " + std::to_string(numel) + " in the file (shapes differ)");
    it->second.copy_(t);
    seen.insert(name);
  }
  for (const auto& [name, t] : mine)
    if (seen.count(name) == 0) throw std::runtime_error("yolo::load: the file has no tensor named " + name);
}

}  // namespace yolo
