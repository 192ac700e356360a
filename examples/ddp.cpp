// Data-parallel training on more than one process: the CNN of examples/resume.cpp on SyntheticImages,
// each rank reading its shard (dist::DistributedSampler), the gradients averaged over the ranks during
// backward by DDP's own engine (dist::DataParallel: c10d's Reducer over a Gloo group).
//
//   torchrun --standalone --nproc-per-node 2 --no-python build-release/examples/ddp
//   build-release/examples/ddp                       # alone: a group of one, the same program
//
// torchrun comes with the LibTorch environment cmake/deps.sh installs (`make demo` prints where).
// Only rank 0 prints and writes snapshots (--dir); every rank resumes from rank 0's newest snapshot.
// The example trains on the CPU over Gloo: every rank is a CPU process, also on a machine with GPUs
// (a GPU program makes its group with ProcessGroup::Options{.nccl = true}, which selects
// cuda:<LOCAL_RANK>, and moves its model there).
//
// How a rank learns where it stands: ProcessGroup::from_environment() reads RANK and WORLD_SIZE
// (both or neither: neither is a group of one), LOCAL_RANK (RANK when unset; the GPU an NCCL group
// takes), and, for WORLD_SIZE > 1, MASTER_ADDR and MASTER_PORT: the store every rank meets at. Under
// torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the launcher serves that store; without it rank 0
// serves it. Gloo binds the loopback address when MASTER_ADDR is local, else the address of the
// host's name, or the interface GLOO_SOCKET_IFNAME names (set it when the host name resolves to
// the wrong network). The launch lines, N processes per machine:
//
//   # one machine (with N GPUs or none):
//   torchrun --standalone --nproc-per-node N --no-python build-release/examples/ddp --epochs 2
//
//   # two machines: the same line on each, R = 0 on one and 1 on the other, HOST:PORT a port free on
//   # HOST, one of the two (the c10d rendezvous serves there; it may also assign the node ranks itself)
//   torchrun --nnodes 2 --node-rank R --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id run1 --no-python build-release/examples/ddp --epochs 2
//
//   # without torchrun, plain variables (one line per process; here 2 on one machine):
//   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build-release/examples/ddp &
//   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 build-release/examples/ddp
//   # ... or the launcher that sets them and waits for every process, failing when one fails:
//   examples/ddp_launch.sh N build-release/examples/ddp --epochs 2
//   NNODES=2 NODE_RANK=R MASTER_ADDR=HOST MASTER_PORT=PORT examples/ddp_launch.sh N build-release/examples/ddp
//
//   # SLURM: one task per process (sbatch --nodes 2 --ntasks-per-node N), rank 0 on the first node
//   export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) MASTER_PORT=29500
//   srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID exec build-release/examples/ddp'
#include <nitro/dist/data_parallel.hpp>
#include <nitro/dist/sampler.hpp>
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace {

struct Net : torch::nn::Module {
  Net()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, 10))) {}
  at::Tensor forward(at::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc->forward(x.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};

}  // namespace

int main(int argc, char** argv) try {
  int epochs = 2;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    NITRO_CHECK(i + 1 < argc, "ddp: ", arg, " needs a value (--epochs E --dir D)");
    if (arg == "--epochs") epochs = std::stoi(argv[++i]);
    else if (arg == "--dir") dir = argv[++i];
    else NITRO_CHECK(false, "ddp: unknown option ", arg, " (--epochs E --dir D)");
  }
  auto world = nitro::dist::ProcessGroup::from_environment();  // RANK, WORLD_SIZE, ... from torchrun
  torch::manual_seed(world.rank());  // each rank its own initial weights: DataParallel broadcasts rank 0's

  constexpr std::int64_t samples = 4096, batch = 64;  // per rank: the global batch is 64 x world size
  const auto images = nitro::data::SyntheticImages({.size = samples, .noise = 8.0}).map(torch::data::transforms::Stack<>());
  auto model = std::make_shared<Net>();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::dist::DistributedSampler sampler(samples, world, {.seed = 1});

  using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::clip::Norm, nitro::dist::DataParallel, nitro::snapshot::Policy>;
  Loop loop{model, optimizer,
            {.clip = {.max_norm = 5.0},
             .hooks = {{.group = world},
                       {.directory = dir.empty() ? "/tmp/nitro-ddp" : dir, .every_steps = dir.empty() ? 0 : 100, .sampler = &sampler}}}};
  if (!dir.empty()) {
    if (const auto last = nitro::snapshot::latest(dir)) nitro::snapshot::load(*last, loop, {.sampler = &sampler});
  }
  if (world.is_main())
    std::printf("ddp: %d process(es), %lld samples per rank per epoch, batch %lld per rank\n", world.size(),
                static_cast<long long>(sampler.length()), static_cast<long long>(batch));
  std::fflush(stdout);  // before the progress bar's lines on stderr

  const auto loss_fn = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.data), b.target); };
  while (sampler.state().epoch < epochs) {
    at::Tensor sum = at::zeros({}, at::kDouble);
    std::int64_t steps = 0;
    {
      nitro::Prefetcher<nitro::Cpu, decltype(nitro::from_dataset(images, sampler, batch))> batches{
          nitro::from_dataset(images, sampler, batch), {.depth = 4, .workers = 1}};
      nitro::monitor::ProgressBar bar{{.total = static_cast<std::int64_t>(sampler.length()), .unit = "samples"}};  // rank 0 draws
      for (auto& b : batches) {
        const auto r = loop.step(b, loss_fn);
        sum += r.loss.to(at::kDouble);
        ++steps;
        bar.update(b.data.size(0), r.loss);
        if (r.stop) return 0;  // SIGTERM: rank 0 wrote a snapshot
      }
    }
    // The epoch's mean loss over every rank's batches.
    const double mean = world.all_reduce_mean(sum.item<double>() / static_cast<double>(steps));
    if (world.is_main())
      std::printf("epoch %lld: mean loss %.4f over %d ranks, %lld optimizer steps\n",
                  static_cast<long long>(sampler.state().epoch), mean, world.size(),
                  static_cast<long long>(loop.optimizer_steps()));
    sampler.set_epoch(sampler.state().epoch + 1);
  }
  world.barrier();
  if (world.is_main())
    std::printf("done: %lld all-reduce calls in %lld synchronised steps\n",
                static_cast<long long>(loop.hook<nitro::dist::DataParallel>().all_reduce_calls()),
                static_cast<long long>(loop.hook<nitro::dist::DataParallel>().sync_rounds()));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp: %s\n", e.what());
  return 1;
}
