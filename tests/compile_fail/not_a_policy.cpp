// expect: each argument must be a policy of the amp::, accumulate::, checkpoint::, clip:: or monitor:: family
#include <nitro/train/training_loop.hpp>

int main() { return sizeof(nitro::TrainingLoop<nitro::amp::Bf16, int>) > 0; }
