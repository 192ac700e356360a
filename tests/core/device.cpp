#include <nitro/core/device.hpp>

#include "testing.hpp"

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace nitro_test_core_device {  // one namespace per file: an area is compiled as one translation unit

namespace {

struct UserBatch {
  at::Tensor image;
  at::Tensor mask;
  int id = 0;
  template <class F>
  friend UserBatch nitro_map_tensors(const UserBatch& b, F&& f) {
    return {f(b.image), f(b.mask), b.id};
  }
};

auto doubled = [](const at::Tensor& t) { return t * 2; };

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && a.equal(b); }

}  // namespace

TEST_CASE("device tags name their LibTorch device") {
  CHECK(nitro::Cpu::type == c10::DeviceType::CPU);
  CHECK(nitro::Cuda::type == c10::DeviceType::CUDA);
  CHECK(nitro::Cpu::available());
  CHECK(nitro::Cuda::available() == torch::cuda::is_available());
  CHECK(nitro::Cuda::device(1) == c10::Device(c10::DeviceType::CUDA, 1));
  CHECK(nitro::Cpu::device().is_cpu());
}

TEST_CASE("the Auto tag: its device is a value, by default CUDA when available, else the CPU") {
  static_assert(nitro::DeviceTag<nitro::Auto>);
  // No kind of its own: generic code comparing a tag's type with the CPU's or CUDA's mistakes it for neither.
  CHECK(nitro::Auto::type != c10::DeviceType::CPU);
  CHECK(nitro::Auto::type != c10::DeviceType::CUDA);
  CHECK(nitro::Auto::name == "auto");
  CHECK(nitro::Auto::available());
  CHECK_NOTHROW(nitro::require_available<nitro::Auto>("anything"));
  const bool gpu = NITRO_WITH_CUDA && torch::cuda::is_available();
  CHECK(nitro::Auto::device() == (gpu ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU)));
  CHECK(nitro::Auto::device(1) == (gpu ? c10::Device(c10::kCUDA, 1) : c10::Device(c10::kCPU)));
  // to_device<Auto> moves to that device; on the CPU a tensor already there is not copied.
  const auto x = torch::arange(6, torch::kFloat);
  const auto moved = nitro::to_device<nitro::Auto>(std::make_tuple(x));
  CHECK(std::get<0>(moved).device().type() == nitro::Auto::device().type());
  if (!gpu) CHECK(std::get<0>(moved).is_same(x));
}

TEST_CASE("require_available(device, what) checks a device chosen at run time") {
  CHECK_NOTHROW(nitro::require_available(c10::Device(c10::kCPU), "nitro::Prefetcher<Auto>"));
  CHECK_THROWS_WITH_AS(nitro::require_available(c10::Device(c10::kMeta), "nitro::Prefetcher<Auto>"),
                       doctest::Contains("nitro::Prefetcher<Auto>: device is meta; give the CPU or a CUDA device"),
                       nitro::Error);
  if (NITRO_WITH_CUDA && torch::cuda::is_available()) {
    CHECK_NOTHROW(nitro::require_available(c10::Device(c10::kCUDA, 0), "x"));
    return;
  }
  CHECK_THROWS_WITH_AS(nitro::require_available(c10::Device(c10::kCUDA, 0), "nitro::Prefetcher<Auto>"),
                       doctest::Contains(NITRO_WITH_CUDA ? "device is cuda:0, but no CUDA device is available"
                                                         : "device is cuda:0, but Nitro was built without CUDA"),
                       nitro::Error);
}

TEST_CASE("map_tensors applies f to every tensor of every supported batch shape") {
  const auto a = torch::arange(4, torch::kFloat);
  const auto b = torch::ones({2, 2});

  CHECK(same(nitro::map_tensors(a, doubled), a * 2));

  auto t = nitro::map_tensors(std::make_tuple(a, b), doubled);
  CHECK(same(std::get<0>(t), a * 2));
  CHECK(same(std::get<1>(t), b * 2));

  auto p = nitro::map_tensors(std::make_pair(a, std::vector<at::Tensor>{a, b}), doubled);
  CHECK(same(p.first, a * 2));
  REQUIRE(p.second.size() == 2);
  CHECK(same(p.second[1], b * 2));

  auto o = nitro::map_tensors(std::optional<at::Tensor>{a}, doubled);
  REQUIRE(o.has_value());
  CHECK(same(*o, a * 2));
  CHECK_FALSE(nitro::map_tensors(std::optional<at::Tensor>{}, doubled).has_value());

  auto e = nitro::map_tensors(torch::data::Example<>{a, b}, doubled);
  CHECK(same(e.data, a * 2));
  CHECK(same(e.target, b * 2));
  auto n = nitro::map_tensors(torch::data::TensorExample{a}, doubled);
  CHECK(same(n.data, a * 2));

  auto u = nitro::map_tensors(UserBatch{a, b, 7}, doubled);
  CHECK(same(u.image, a * 2));
  CHECK(same(u.mask, b * 2));
  CHECK(u.id == 7);
}

TEST_CASE("for_each_tensor visits each tensor once") {
  const auto x = torch::zeros({1});
  int visits = 0;
  std::int64_t elements = 0;
  const auto batch = std::make_tuple(torch::zeros({3}), std::vector<at::Tensor>{x, x, x}, torch::data::Example<>{x, x},
                                     UserBatch{torch::zeros({2, 5}), x, 1});
  nitro::for_each_tensor(batch, [&](const at::Tensor& t) {
    ++visits;
    elements += t.numel();
  });
  CHECK(visits == 1 + 3 + 2 + 2);
  CHECK(elements == 3 + 3 + 2 + 10 + 1);
}

TEST_CASE("for_each_tensor visits the batch's own tensors in map_tensors' order, copying nothing") {
  const auto batch = std::make_pair(std::vector<at::Tensor>{torch::zeros({1}), torch::ones({2})},
                                    std::optional<torch::data::Example<>>(torch::data::Example<>{torch::zeros({3}),
                                                                                                  torch::zeros({4})}));
  std::vector<const at::Tensor*> seen;
  std::vector<long> uses;
  nitro::for_each_tensor(batch, [&](const at::Tensor& t) {
    seen.push_back(&t);
    uses.push_back(t.use_count());
  });
  // The very objects inside the batch (no vector, pair or Example was rebuilt), and no extra reference.
  CHECK(seen == std::vector<const at::Tensor*>{&batch.first[0], &batch.first[1], &batch.second->data,
                                               &batch.second->target});
  CHECK(uses == std::vector<long>{1, 1, 1, 1});
  std::vector<std::int64_t> order;
  (void)nitro::map_tensors(batch, [&](const at::Tensor& t) {
    order.push_back(t.numel());
    return t;
  });
  CHECK(order == std::vector<std::int64_t>{1, 2, 3, 4});
}

TEST_CASE("to_device on the CPU: no copy unless asked, layout on request") {
  const auto x = torch::randn({2, 3, 4, 5});
  const auto y = nitro::to_device(x, nitro::Cpu::device());
  CHECK(y.data_ptr() == x.data_ptr());  // already there: the same storage

  const auto z = nitro::to_device(x, nitro::Cpu::device(), {.copy = true});
  CHECK(z.data_ptr() != x.data_ptr());
  CHECK(same(z, x));

  const auto [image, label] =
      nitro::to_device<nitro::Cpu>(std::make_pair(x, torch::arange(3)), {.channels_last = true});
  CHECK(image.is_contiguous(c10::MemoryFormat::ChannelsLast));
  CHECK_FALSE(x.is_contiguous(c10::MemoryFormat::ChannelsLast));
  CHECK(same(image, x));
  CHECK(label.is_contiguous());  // not 4-D: left alone

  const auto undefined = nitro::to_device(std::optional<at::Tensor>{at::Tensor{}}, nitro::Cpu::device());
  CHECK_FALSE(undefined->defined());
}

TEST_CASE("without a GPU, pinning and CUDA requirements say so") {
  if (nitro::Cuda::available()) {
    MESSAGE("a GPU is present: the no-GPU messages are not reachable here");
    return;
  }
  try {
    (void)nitro::pin_memory(torch::ones({2}));
    FAIL("pin_memory did not throw");
  } catch (const nitro::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("nitro::pin_memory needs a cuda device") != std::string::npos);
    CHECK(what.find("nitro::Cpu") != std::string::npos);
  }
  CHECK_THROWS_AS(nitro::require_available<nitro::Cuda>("Prefetcher<Cuda>"), nitro::Error);
  CHECK_NOTHROW(nitro::require_available<nitro::Cpu>("anything"));
}

TEST_CASE("gpu: to_device<Cuda> moves a whole batch intact, pinned and asynchronously" * nitro::test::needs_gpu()) {
  const auto image = torch::randn({8, 3, 16, 16});
  const auto label = torch::randint(10, {8});
  const auto pinned = nitro::pin_memory(torch::data::Example<>{image, label});
  CHECK(pinned.data.is_pinned());
  const auto gpu = nitro::to_device<nitro::Cuda>(pinned, {.non_blocking = true});
  CHECK(gpu.data.is_cuda());
  CHECK(gpu.target.is_cuda());
  CHECK(same(gpu.data.cpu(), image));
  CHECK(same(gpu.target.cpu(), label));
}

TEST_CASE("concrete_device resolves `cuda` to one index and keeps every concrete device") {
  const c10::Device cuda(c10::DeviceType::CUDA), cuda1(c10::DeviceType::CUDA, 1), cuda2(c10::DeviceType::CUDA, 2);
  CHECK(nitro::concrete_device(cuda, 1) == cuda1);          // the model's GPU while cuda:1 is current
  CHECK(nitro::concrete_device(cuda2, 0) == cuda2);         // an index given is kept, whatever is current
  CHECK(nitro::concrete_device(c10::Device(c10::kCPU), 3) == c10::Device(c10::kCPU));
  CHECK(nitro::concrete_device(c10::Device(c10::kCPU)) == c10::Device(c10::kCPU));  // no CUDA call for the CPU
  CHECK(nitro::concrete_device(cuda1) == cuda1);
}

TEST_CASE("cuda_indices lists the GPUs of a model and the current one, once each") {
  using D = c10::Device;
  const std::vector<D> devices{D(c10::DeviceType::CUDA, 1), D(c10::kCPU), D(c10::DeviceType::CUDA, 1),
                               D(c10::DeviceType::CUDA, 3)};
  CHECK(nitro::detail::cuda_indices(devices, 0) == std::vector<c10::DeviceIndex>{0, 1, 3});
  CHECK(nitro::detail::cuda_indices(devices, 1) == std::vector<c10::DeviceIndex>{1, 3});
  CHECK(nitro::detail::cuda_indices(devices, -1) == std::vector<c10::DeviceIndex>{1, 3});  // no GPU current
  CHECK(nitro::detail::cuda_indices({D(c10::kCPU)}, -1).empty());
}

}  // namespace nitro_test_core_device
