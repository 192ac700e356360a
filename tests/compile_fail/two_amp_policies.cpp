// expect: TrainingLoop: give at most one AMP policy
#include <nitro/train/training_loop.hpp>

int main() { return sizeof(nitro::TrainingLoop<nitro::amp::Bf16, nitro::clip::Norm, nitro::amp::Off>) > 0; }
