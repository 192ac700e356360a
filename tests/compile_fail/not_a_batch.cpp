// expect: this type is not a batch Nitro can move between devices.*nitro_map_tensors
#include <nitro/core/device.hpp>

struct Plain {
  at::Tensor x;
};

int main() { (void)nitro::to_device(Plain{}, nitro::Cpu::device()); }
