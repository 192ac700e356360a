// Which types satisfy each concept of core/concepts.hpp, and which do not. Compiling is the test.
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>

#include <torch/data/example.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using nitro::Batch;
using Tensor = at::Tensor;

// ---- device tags
static_assert(nitro::DeviceTag<nitro::Cpu> && nitro::DeviceTag<nitro::Cuda>);
static_assert(!nitro::DeviceTag<int>);
struct NoName {
  static constexpr c10::DeviceType type = c10::DeviceType::CPU;
  static bool available() { return true; }
};
static_assert(nitro::HasDeviceType<NoName> && !nitro::HasDeviceName<NoName> && !nitro::DeviceTag<NoName>);
struct RuntimeType {
  static inline c10::DeviceType type = c10::DeviceType::CPU;  // not a constant
  static constexpr std::string_view name = "x";
  static bool available() { return true; }
};
static_assert(!nitro::HasDeviceType<RuntimeType>);

// ---- batches
struct Custom {
  Tensor x;
  template <class F>
  friend Custom nitro_map_tensors(const Custom& c, F&& f) {
    return {f(c.x)};
  }
};
struct Plain {
  Tensor x;
};
static_assert(Batch<Tensor> && Batch<const Tensor&>);
static_assert(Batch<std::tuple<Tensor, Tensor>> && Batch<std::pair<Tensor, std::vector<Tensor>>>);
static_assert(Batch<std::optional<Tensor>> && Batch<std::tuple<>>);
static_assert(Batch<torch::data::Example<>> && Batch<torch::data::TensorExample>);
static_assert(Batch<Custom> && nitro::CustomBatch<Custom> && Batch<std::vector<Custom>>);
static_assert(nitro::TensorBatch<Tensor> && nitro::CompositeBatch<std::tuple<Tensor>> && !nitro::CompositeBatch<Custom>);
static_assert(!Batch<Plain> && !Batch<int> && !Batch<std::tuple<Tensor, int>> && !Batch<std::vector<Plain>>);
static_assert(!Batch<torch::data::Example<Tensor, int>>);

// ---- batch sources
struct CountingSource {
  int left = 3;
  std::optional<std::pair<Tensor, Tensor>> operator()();
};
static_assert(nitro::BatchSource<CountingSource>);
static_assert(std::same_as<nitro::source_batch_t<CountingSource>, std::pair<Tensor, Tensor>>);
static_assert(nitro::BatchSource<std::optional<Tensor> (*)()>);
static_assert(!nitro::BatchSource<Tensor (*)()>);                  // must say when it ends
static_assert(!nitro::BatchSource<std::optional<int> (*)()>);      // must yield a batch
static_assert(nitro::YieldsOptional<std::optional<int> (*)()>);    // ... which is the piece that failed

// ---- policies
struct GoodAmp {
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "good";
  static constexpr bool enabled = true;
  static constexpr bool scales_loss = false;
  static constexpr c10::ScalarType dtype = c10::ScalarType::BFloat16;
  struct Options {
    double x = 1;
  };
};
struct AmpWithoutDtype {  // autocasts, but to what? The loop needs `dtype`.
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "no dtype";
  static constexpr bool enabled = true;
  static constexpr bool scales_loss = false;
  struct Options {};
};
struct ScalingWithoutScaler {  // scales the loss, but names no scaler
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "no scaler";
  static constexpr bool enabled = true;
  static constexpr bool scales_loss = true;
  static constexpr c10::ScalarType dtype = c10::ScalarType::Half;
  struct Options {};
};
struct OffWithoutDtype {  // off: no dtype needed
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "off";
  static constexpr bool enabled = false;
  static constexpr bool scales_loss = false;
  struct Options {};
};
struct AccumulationWithoutSteps {
  using family = nitro::family::Accumulation;
  static constexpr std::string_view name = "no steps";
  static constexpr bool enabled = true;
  struct Options {};
};
struct ClipWithoutApply {
  using family = nitro::family::Clip;
  static constexpr std::string_view name = "no apply";
  static constexpr bool enabled = true;
  struct Options {};
  static void validate(const Options&) {}
};
struct NoOptions {
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "no options";
  static constexpr bool enabled = false;
  static constexpr bool scales_loss = false;
};
struct RuntimeEnabled {
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "runtime";
  static inline bool enabled = true;  // must be a constant: the loop branches on it with if constexpr
  struct Options {};
};
struct GoodCheckpoint {
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "segments";
  static constexpr bool enabled = true;
  struct Options {
    int segments = 4;
  };
  static std::int64_t segments(std::int64_t, const Options& o) { return o.segments; }
};
struct CheckpointWithoutSegments {
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "no segments";
  static constexpr bool enabled = true;
  struct Options {};
};
static_assert(nitro::AmpPolicy<GoodAmp> && !nitro::CheckpointPolicy<GoodAmp>);
// Each concept checks what the loop uses, and names the piece missing.
static_assert(nitro::Policy<AmpWithoutDtype> && !nitro::NamesDtypeIfEnabled<AmpWithoutDtype> &&
              !nitro::AmpPolicy<AmpWithoutDtype>);
static_assert(!nitro::HasScalerIfScaling<ScalingWithoutScaler> && !nitro::AmpPolicy<ScalingWithoutScaler>);
static_assert(nitro::AmpPolicy<OffWithoutDtype>);
static_assert(!nitro::CountsMicroBatches<AccumulationWithoutSteps> && !nitro::AccumulationPolicy<AccumulationWithoutSteps>);
static_assert(!nitro::CutsSegmentsIfEnabled<CheckpointWithoutSegments> && !nitro::CheckpointPolicy<CheckpointWithoutSegments>);
static_assert(!nitro::ClipsIfEnabled<ClipWithoutApply> && !nitro::ClipPolicy<ClipWithoutApply>);
static_assert(!nitro::HasOptions<NoOptions> && !nitro::AmpPolicy<NoOptions>);
static_assert(!nitro::Switchable<RuntimeEnabled> && !nitro::CheckpointPolicy<RuntimeEnabled>);
static_assert(nitro::CheckpointPolicy<GoodCheckpoint> && !nitro::AccumulationPolicy<GoodCheckpoint>);
static_assert(!nitro::Policy<int>);

struct GoodEviction {
  using family = nitro::family::Eviction;
  static constexpr std::string_view name = "fifo";
  struct Options {};
  template <class Key>
  struct Evictor {
    Evictor(const Options&, std::size_t capacity_bytes);
    void on_insert(const Key&, std::uint32_t slot, std::size_t weight);
    void on_access(const Key&, std::uint32_t slot);
    void on_erase(std::uint32_t slot);
    std::optional<std::uint32_t> victim();
    void clear();
    std::size_t memory_bytes() const;
  };
};
struct NoVictim {
  using family = nitro::family::Eviction;
  static constexpr std::string_view name = "none";
  struct Options {};
  template <class Key>
  struct Evictor {
    Evictor(const Options&, std::size_t capacity_bytes);
    void on_insert(const Key&, std::uint32_t slot, std::size_t weight);
    void on_access(const Key&, std::uint32_t slot);
    void on_erase(std::uint32_t slot);
    void clear();
    std::size_t memory_bytes() const;
  };
};
struct NoBudget {  // its evictor cannot be made from the options and the byte budget
  using family = nitro::family::Eviction;
  static constexpr std::string_view name = "nobudget";
  struct Options {};
  template <class Key>
  struct Evictor {
    void on_insert(const Key&, std::uint32_t slot, std::size_t weight);
    void on_access(const Key&, std::uint32_t slot);
    void on_erase(std::uint32_t slot);
    std::optional<std::uint32_t> victim();
    void clear();
    std::size_t memory_bytes() const;
  };
};
static_assert(nitro::EvictionPolicy<GoodEviction>);
static_assert(!nitro::EvictorFor<NoVictim::Evictor<std::int64_t>, std::int64_t> && !nitro::EvictionPolicy<NoVictim>);
static_assert(nitro::EvictorFor<NoBudget::Evictor<std::int64_t>, std::int64_t> &&
              !nitro::MakesEvictor<NoBudget, std::int64_t> && !nitro::EvictionPolicy<NoBudget>);

}  // namespace
