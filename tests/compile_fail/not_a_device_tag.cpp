// expect: DeviceTag
#include <nitro/core/device.hpp>

int main() { (void)nitro::to_device<int>(at::Tensor{}); }
