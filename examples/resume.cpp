// Stop and resume a run: a CNN on SyntheticImages under a TrainingLoop with snapshot::Policy, which
// writes a snapshot every --every optimizer steps and when the process gets SIGTERM or SIGINT (the
// step finishes, the snapshot is written, the loop returns StepResult::stop, and the program exits 0).
// Started again with the same --dir, it resumes from the newest good snapshot: the same batch of the
// same epoch, the same generators, the same optimizer and loop state. It ends by printing an XXH64 of
// the parameters' bytes: a run stopped and resumed any number of times prints the same value as one
// that never stopped.
//
//   build/examples/resume --dir /tmp/run-a --epochs 2                      # uninterrupted
//   build/examples/resume --dir /tmp/run-b --epochs 2 --stop-after 150     # "preempted" at batch 150
//   build/examples/resume --dir /tmp/run-b --epochs 2                      # resumes, same hash as run-a
//
// --stop-after N sends this process SIGTERM after N micro-batches, as a cluster's scheduler would.
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace {

struct Net : torch::nn::Module {
  Net()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        drop(register_module("drop", torch::nn::Dropout(0.2))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, 10))) {}
  at::Tensor forward(at::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc->forward(drop->forward(x.flatten(1)));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout drop;
  torch::nn::Linear fc;
};

std::uint64_t parameter_hash(torch::nn::Module& model) {
  nitro::io::Xxh64 h;
  for (const auto& p : model.parameters()) {
    const auto c = p.detach().contiguous();
    h.update(c.data_ptr(), c.nbytes());
  }
  return h.digest();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/tmp/nitro-resume";
  int epochs = 2;
  std::int64_t every = 50, stop_after = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "resume: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--dir") dir = value();
    else if (arg == "--epochs") epochs = std::stoi(value());
    else if (arg == "--every") every = std::stoll(value());
    else if (arg == "--stop-after") stop_after = std::stoll(value());
    else NITRO_CHECK(false, "resume: unknown option ", arg, " (--dir D --epochs E --every N --stop-after N)");
  }
  at::set_num_threads(2);  // the same threads in every run: bitwise-equal results need it
  torch::manual_seed(0);

  const auto images = nitro::data::SyntheticImages({.size = 4096, .noise = 8.0}).map(torch::data::transforms::Stack<>());
  auto model = std::make_shared<Net>();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::data::ResumableSampler sampler(4096, {.seed = 1});
  using Loop = nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::clip::Norm, nitro::snapshot::Policy>;
  Loop loop{model, optimizer,
            {.clip = {.max_norm = 5.0}, .hooks = {{.directory = dir, .every_steps = every, .keep_last = 2, .sampler = &sampler}}}};

  if (const auto last = nitro::snapshot::latest(dir)) {
    const auto m = nitro::snapshot::load(*last, loop, {.sampler = &sampler});
    std::printf("resumed from %s (written %s): epoch %lld, sample %lld, optimizer step %lld + %lld micro-batches\n",
                last->filename().c_str(), m.time.c_str(), static_cast<long long>(sampler.state().epoch),
                static_cast<long long>(sampler.state().index), static_cast<long long>(loop.optimizer_steps()),
                static_cast<long long>(loop.pending_micro_batches()));
  } else {
    std::printf("new run in %s\n", dir.c_str());
  }

  std::int64_t micro = 0;
  const auto loss_fn = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.data), b.target); };
  while (sampler.state().epoch < epochs) {
    at::Tensor last_loss;
    {
      nitro::Prefetcher<nitro::Cpu, decltype(nitro::from_dataset(images, sampler, 64))> batches{
          nitro::from_dataset(images, sampler, 64), {.depth = 4, .workers = 2}};
      for (auto& batch : batches) {
        const auto r = loop.step(batch, loss_fn);
        last_loss = r.loss;
        if (++micro == stop_after) ::kill(::getpid(), SIGTERM);  // what a scheduler's preemption does
        if (r.stop) {
          std::printf("%s: snapshot %s written after optimizer step %lld; exiting\n", std::string(r.stop_reason).c_str(),
                      loop.hook<nitro::snapshot::Policy>().last_snapshot()->filename().c_str(),
                      static_cast<long long>(loop.optimizer_steps()));
          return 0;
        }
      }
    }
    std::printf("epoch %lld done: loss %.4f, optimizer step %lld\n", static_cast<long long>(sampler.state().epoch),
                last_loss.defined() ? last_loss.item<double>() : 0.0, static_cast<long long>(loop.optimizer_steps()));
    sampler.set_epoch(sampler.state().epoch + 1);
  }
  loop.flush();
  std::printf("done: %lld optimizer steps, parameters XXH64 %016llx\n", static_cast<long long>(loop.optimizer_steps()),
              static_cast<unsigned long long>(parameter_hash(*model)));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "resume: %s\n", e.what());
  return 1;
}
