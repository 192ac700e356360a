// yolo_forward DIR SCALE CLASSES N H W: loads DIR/weights.{txt,bin} into examples/yolo's Detector,
// reads DIR/input.bin (float32 [N, 3, H, W]), writes the training forward's three maps to
// DIR/train_<i>.bin and the evaluation prediction to DIR/predict.bin (float32), for
// tests/yolo/forward.py to compare with Ultralytics' model.
#include "../../examples/yolo/model.hpp"
#include "../../examples/yolo/weights.hpp"

#include <cstdio>
#include <fstream>
#include <string>

namespace {

void write(const std::filesystem::path& path, const at::Tensor& t) {
  const auto c = t.contiguous();
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 7) {
    std::fprintf(stderr, "usage: yolo_forward DIR SCALE CLASSES N H W\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  yolo::Detector net(yolo::Config{.scale = argv[2][0], .classes = std::stoll(argv[3])});
  yolo::load(*net, dir);
  const auto n = std::stoll(argv[4]), h = std::stoll(argv[5]), w = std::stoll(argv[6]);
  auto x = at::empty({n, 3, h, w});
  std::ifstream(dir / "input.bin", std::ios::binary).read(static_cast<char*>(x.data_ptr()), static_cast<std::streamsize>(x.nbytes()));
  const at::NoGradGuard no_grad;
  net->eval();  // evaluation first: a training forward would move the running statistics
  write(dir / "predict.bin", net->predict(x));
  net->train();
  const auto maps = net->forward(x);
  for (std::size_t i = 0; i < maps.size(); ++i) write(dir / ("train_" + std::to_string(i) + ".bin"), maps[i]);
  std::printf("yolo_forward: %zu maps written\n", maps.size());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "yolo_forward: %s\n", e.what());
  return 1;
}
