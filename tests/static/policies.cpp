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

// The loop finds each family's policy wherever it is given, the family's Off when none.
static_assert(std::is_same_v<TrainingLoop<>::clip_policy, clip::Off>);
static_assert(std::is_same_v<TrainingLoop<amp::Off, accumulate::Off, checkpoint::Off, clip::Value>::clip_policy, clip::Value>);
using AnyOrder = TrainingLoop<clip::Norm, checkpoint::Sqrt, amp::Bf16>;
static_assert(std::is_same_v<AnyOrder::amp_policy, amp::Bf16> && std::is_same_v<AnyOrder::clip_policy, clip::Norm> &&
              std::is_same_v<AnyOrder::checkpoint_policy, checkpoint::Sqrt> &&
              std::is_same_v<AnyOrder::accumulation_policy, accumulate::Off> &&
              std::is_same_v<AnyOrder::monitor_policy, monitor::Off>);
static_assert(std::is_same_v<TrainingLoop<accumulate::Fixed<4>>::accumulation_policy, accumulate::Fixed<4>>);
static_assert(std::is_same_v<level::with<level::Advanced, clip::Value>::clip_policy, clip::Value>);

// A user-written policy that satisfies its family's concept plugs into the loop unchanged.
struct HalveGradients {
  using family = family::Clip;
  static constexpr std::string_view name = "halve";
  static constexpr bool enabled = true;
  struct Options {};
  static void validate(const Options&) {}
  static at::Tensor apply(nitro::detail::GradGroups& grads, const Options&) {
    grads.for_each([](nitro::detail::GradGroups::Group& g) { at::_foreach_mul_(g.grads, 0.5); });
    return {};
  }
};
static_assert(ClipPolicy<HalveGradients>);
static_assert(std::is_same_v<TrainingLoop<HalveGradients, amp::Bf16>::clip_policy, HalveGradients>);

// A user-written hook policy plugs in without editing Nitro: a type of the Hook family with the
// members it needs (train/hooks.hpp). Defining the loop's step() and state() instantiates the calls.
struct CountOptimizerSteps {
  using family = family::Hook;
  static constexpr std::string_view name = "count_optimizer_steps";
  static constexpr bool enabled = true;
  struct Options {
    std::int64_t start = 0;
  };
  explicit CountOptimizerSteps(const Options& o) : seen(o.start) {}
  template <class Loop>
  void after_optimizer_step(Loop&, StepResult& r) {
    seen += r.stepped ? 1 : 0;
  }
  StateDict state_dict() const {
    StateDict s;
    s.integers["seen"] = seen;
    return s;
  }
  void load_state_dict(const StateDict& s) { seen = s.integer("seen", name); }
  std::int64_t seen;
};
static_assert(HookPolicy<CountOptimizerSteps>);
static_assert(!HookPolicy<clip::Norm> && !ClipPolicy<CountOptimizerSteps>);
using Hooked = TrainingLoop<CountOptimizerSteps, amp::Bf16, clip::Norm>;
static_assert(std::is_same_v<Hooked::hook_policies, std::tuple<CountOptimizerSteps>>);
static_assert(std::is_same_v<Hooked::clip_policy, clip::Norm>);
static_assert(std::is_same_v<decltype(std::declval<Hooked&>().hook<CountOptimizerSteps>()), CountOptimizerSteps&>);
static_assert(std::is_same_v<decltype(Hooked::Options{}.hooks), std::tuple<CountOptimizerSteps::Options>>);
[[maybe_unused]] void instantiate(Hooked& loop, const at::Tensor& x) {
  loop.step(x, [](const at::Tensor& b) { return b.sum(); });
  loop.load_state(loop.state());
}

// A hook whose state_dict returns a reference still saves its state.
struct StateByReference {
  using family = family::Hook;
  static constexpr std::string_view name = "by_reference";
  static constexpr bool enabled = true;
  struct Options {};
  const StateDict& state_dict() const { return state; }
  void load_state_dict(const StateDict& s) { state = s; }
  StateDict state;
};
static_assert(nitro::detail::HasState<StateByReference> && !nitro::detail::BadState<StateByReference>);
// One with a state_dict of another type is caught (the loop refuses it with a sentence).
struct StateOfAnotherType {
  int state_dict() const { return 0; }
  void load_state_dict(const StateDict&) {}
};
static_assert(!nitro::detail::HasState<StateOfAnotherType> && nitro::detail::BadState<StateOfAnotherType>);
}  // namespace
