// expect: each extra policy must be a clip policy
#include <nitro/train/training_loop.hpp>

int main() { return sizeof(nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off, nitro::amp::Bf16>) > 0; }
