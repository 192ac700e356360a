// expect: amp::Fp16<Scaler>: Scaler must be a loss scaler such as nitro::DynamicLossScale
#include <nitro/train/amp.hpp>

int main() { return nitro::amp::Fp16<int>::enabled ? 0 : 1; }
