// A stand-in for libnvidia-ml.so.1 with the entry points memory/nvml.hpp uses and fixed answers, so
// that the dlopen path is tested where no driver is (tests/memory/nvml.cpp).
#include <cstring>

extern "C" {
struct FakeUtilization {
  unsigned gpu, memory;
};
int nvmlInit_v2() { return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus, void** device) {
  if (std::strcmp(bus, "00000000:3b:00.0") != 0) return 13;  // NVML_ERROR_NOT_FOUND... any non-zero
  *device = reinterpret_cast<void*>(0x1);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void*, FakeUtilization* u) {
  u->gpu = 87;
  u->memory = 41;
  return 0;
}
int nvmlDeviceGetPowerUsage(void*, unsigned* milliwatts) {
  *milliwatts = 251500;
  return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void*, unsigned* milliwatts) {
  *milliwatts = 700000;
  return 0;
}
int nvmlDeviceGetTemperature(void*, int sensor, unsigned* celsius) {
  if (sensor != 0) return 2;
  *celsius = 64;
  return 0;
}
}
