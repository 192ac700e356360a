// Every stock policy satisfies its family's concept and no other's. Compiling is the test.
#include <nitro/train/levels.hpp>

namespace {
using namespace nitro;

static_assert(AmpPolicy<amp::Off> && AmpPolicy<amp::Bf16> && AmpPolicy<amp::Fp16<>> &&
              AmpPolicy<amp::Fp16<StaticLossScale>>);
static_assert(!amp::Off::scales_loss && !amp::Bf16::scales_loss && amp::Fp16<>::scales_loss);
static_assert(AccumulationPolicy<accumulate::Off> && AccumulationPolicy<accumulate::Fixed<1>> &&
              AccumulationPolicy<accumulate::Fixed<8>> && AccumulationPolicy<accumulate::Dynamic>);
static_assert(!accumulate::Fixed<1>::enabled && accumulate::Fixed<2>::enabled);
static_assert(CheckpointPolicy<checkpoint::Off> && CheckpointPolicy<checkpoint::Segments<2>> &&
              CheckpointPolicy<checkpoint::Sqrt>);
static_assert(ClipPolicy<clip::Off> && ClipPolicy<clip::Norm> && ClipPolicy<clip::Value>);

// No policy passes for another family.
static_assert(!AccumulationPolicy<amp::Bf16> && !CheckpointPolicy<accumulate::Dynamic> && !AmpPolicy<clip::Norm>);
static_assert(!ClipPolicy<checkpoint::Sqrt> && !EvictionPolicy<amp::Off>);

// Loss scalers.
static_assert(LossScaler<DynamicLossScale> && LossScaler<StaticLossScale> && !LossScaler<int>);

// The loop finds its clip policy among the extras, clip::Off when none.
static_assert(std::is_same_v<TrainingLoop<>::clip_policy, clip::Off>);
static_assert(std::is_same_v<TrainingLoop<amp::Off, accumulate::Off, checkpoint::Off, clip::Value>::clip_policy, clip::Value>);
}  // namespace
