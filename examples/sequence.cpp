// Sequences of varying length in batches: bucketing, padding masks, and what changing batch shapes
// mean for level::Auto's tuning and for CUDA graphs.
//
// The task: token sequences of 8 to 64 tokens (--min-length, --max-length; mostly short, a few long,
// as text comes), noise tokens with 2 to 4 markers (A, B or C) at random places; the class is the
// marker that comes first. The model: an embedding, a GRU, and a linear layer on the GRU's output at
// each sequence's last real token (the padding mask says where that is: padding is at the end, so the
// GRU's state there has not seen any).
//
// Bucketing: the lengths are cut into --buckets ranges (4 by default: 8-22, 23-36, 37-50, 51-64);
// every batch holds samples of one bucket only (BucketSampler: each epoch shuffles every bucket, cuts
// it into batches and shuffles the batches) and is padded to the bucket's upper bound, with a mask of
// the real tokens. So the batches have a few shapes, the same every epoch: [batch, bound] for each
// bucket, and [rest, bound] for each bucket's last, smaller batch (7 in the default run). Without
// bucketing (--buckets 0: random batches, each padded to its own longest sequence) the longest
// sequence of a batch varies from batch to batch: 29 shapes in the same run, and 63% of the tokens
// are padding instead of 27% (an epoch takes twice as long).
//
// level::Auto<level::Basic, level::Advanced> (train/autotune.hpp) tunes at its first step, on that
// step's batch: it tries each level, then the fused optimizer and the CPU thread count, times each,
// puts everything back, and trains with the fastest; the result table is printed. What happens when
// the shapes change afterwards:
//   - the choice stays: Auto tunes once, on the first batch's shape, and keeps its winner for every
//     later shape (a shape that runs differently, e.g. much longer sequences, is not measured; tune
//     on the shape that costs the most with loop.tune(make_batch, loss_fn) before the first step);
//   - the decision cache (a file under $NITRO_AUTOTUNE_CACHE, or ~/.cache/nitro/autotune, or
//     --autotune-cache DIR) is keyed by, among others, the shapes of the batch tuned on: a run whose
//     first batch has another shape tunes again and writes another file. Here the sampler's order is
//     seeded, so the first batch, and the key, is the same in every run: the second run reads the
//     choice ("cache" in the table) and starts at once. NITRO_AUTOTUNE=force tunes again.
//   - CUDA graphs (graph::Capture, in level::Max = level::Advanced + graph::Capture; a GPU and a
//     fused optimizer): a graph replays one shape only. Each new shape runs `warmup` (3) eager steps,
//     then is captured into a graph of its own with its own memory pool, up to Options::max_graphs
//     (2 by default: an epoch's batches and its smaller last one); the steps of any other shape run
//     eagerly, always. With bucketing there are few shapes: give max_graphs the number this program
//     prints, and once each shape has had its warm-up steps and its capture every step is a replay.
//     Without bucketing the shapes are many and each comes seldom: more steps are warm-ups or eager,
//     and the graphs' memory pools add up. The program plays graph::Capture's rule over the shapes its
//     steps had and prints how many steps would have run from a graph, either way.
//
// It prints the buckets, Auto's table, per epoch the loss, the test accuracy and the shapes seen so
// far, and at the end the number of shapes (and padding) bucketing gave against random batches.
//
//   build-release/examples/sequence [--epochs 4] [--samples 2048] [--batch 32] [--buckets 4]
//       [--min-length 8] [--max-length 64] [--autotune-cache DIR]
//   build-release/examples/sequence --buckets 0          # random batches: many shapes
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/source.hpp>
#include <nitro/train/autotune.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

struct Args {
  int epochs = 4;
  std::int64_t samples = 2048;
  std::int64_t batch = 32;
  std::int64_t buckets = 4;
  std::int64_t min_length = 8;
  std::int64_t max_length = 64;
  std::string autotune_cache;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--samples") a.samples = std::stoll(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--buckets") a.buckets = std::stoll(value());
    else if (arg == "--min-length") a.min_length = std::stoll(value());
    else if (arg == "--max-length") a.max_length = std::stoll(value());
    else if (arg == "--autotune-cache") a.autotune_cache = value();
    else nitro::detail::fail("unknown option ", arg, "; use --epochs, --samples, --batch, --buckets, --min-length, "
                             "--max-length, --autotune-cache");
  }
  NITRO_CHECK(a.epochs >= 1 && a.batch >= 1 && a.samples >= a.batch && a.buckets >= 0,
              "need --epochs >= 1, --samples >= --batch >= 1, --buckets >= 0");
  NITRO_CHECK(a.min_length >= 4 && a.max_length >= a.min_length && a.buckets <= a.max_length - a.min_length + 1,
              "need 4 <= --min-length <= --max-length, and at most one bucket per length");
  return a;
}

constexpr std::int64_t kPad = 0;      // the padding token (the embedding's padding_idx)
constexpr std::int64_t kMarkers = 3;  // tokens 1, 2, 3: markers A, B, C, the classes
constexpr std::int64_t kVocab = 16;   // tokens 4..15: noise

// ---- the data -----------------------------------------------------------------------------------------

/// Token sequences and their classes, shared by the copies each worker reads.
struct Sequences {
  std::vector<std::vector<std::int64_t>> tokens;
  std::vector<std::int64_t> labels;
};

Sequences make_sequences(std::int64_t n, const Args& a, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto integer = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  // Lengths as text has them: mostly short, a few long (an exponential tail, cut at max_length).
  std::exponential_distribution<double> tail(4.0 / static_cast<double>(a.max_length - a.min_length + 1));
  Sequences s;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto length = a.min_length + std::min(a.max_length - a.min_length, static_cast<std::int64_t>(tail(rng)));
    std::vector<std::int64_t> t(static_cast<std::size_t>(length));
    for (auto& x : t) x = integer(kMarkers + 1, kVocab - 1);
    std::vector<std::size_t> at(t.size());
    std::iota(at.begin(), at.end(), std::size_t{0});
    std::shuffle(at.begin(), at.end(), rng);
    const auto markers = static_cast<std::size_t>(integer(2, 4));
    for (std::size_t k = 0; k < markers; ++k) t[at[k]] = integer(1, kMarkers);
    const auto first = *std::find_if(t.begin(), t.end(), [](std::int64_t x) { return x <= kMarkers; });
    s.tokens.push_back(std::move(t));
    s.labels.push_back(first - 1);
  }
  return s;
}

/// The buckets' upper bounds: `buckets` ranges of about equal width over [min, max]; none: empty.
std::vector<std::int64_t> bucket_bounds(const Args& a) {
  std::vector<std::int64_t> bounds;
  const std::int64_t span = a.max_length - a.min_length + 1;
  for (std::int64_t k = 1; k <= a.buckets; ++k) bounds.push_back(a.min_length - 1 + (span * k + a.buckets - 1) / a.buckets);
  return bounds;
}

/// The length a sequence of `length` tokens is padded to: its bucket's bound (or itself, without buckets).
std::int64_t padded_length(std::int64_t length, const std::vector<std::int64_t>& bounds) {
  const auto b = std::lower_bound(bounds.begin(), bounds.end(), length);
  return b == bounds.end() ? length : *b;
}

/// One batch: tokens padded with kPad, the mask of the real ones, the classes.
struct SeqBatch {
  at::Tensor tokens;  // int64 [B, T]
  at::Tensor mask;    // bool [B, T]: true at real tokens (a prefix of each row)
  at::Tensor target;  // int64 [B]
  template <class F>
  friend SeqBatch nitro_map_tensors(const SeqBatch& b, F&& f) {
    return {f(b.tokens), f(b.mask), f(b.target)};
  }
};

/// The data set as batches: get_batch pads the samples it is given to the bucket of the longest.
class SequenceBatches : public torch::data::datasets::BatchDataset<SequenceBatches, SeqBatch, std::vector<size_t>> {
 public:
  SequenceBatches(std::shared_ptr<const Sequences> data, std::vector<std::int64_t> bounds)
      : data_(std::move(data)), bounds_(std::move(bounds)) {}

  SeqBatch get_batch(std::vector<size_t> indices) override {
    const auto n = static_cast<std::int64_t>(indices.size());
    std::int64_t longest = 0;
    for (const auto i : indices) longest = std::max(longest, static_cast<std::int64_t>(data_->tokens[i].size()));
    const std::int64_t t = padded_length(longest, bounds_);
    auto tokens = torch::full({n, t}, kPad, at::kLong);
    auto mask = torch::zeros({n, t}, at::kBool);
    auto target = torch::empty({n}, at::kLong);
    for (std::int64_t r = 0; r < n; ++r) {
      const auto& seq = data_->tokens[indices[static_cast<std::size_t>(r)]];
      const auto len = static_cast<std::int64_t>(seq.size());
      std::copy(seq.begin(), seq.end(), tokens[r].data_ptr<std::int64_t>());
      mask[r].slice(0, 0, len).fill_(true);
      target[r] = data_->labels[indices[static_cast<std::size_t>(r)]];
    }
    return {tokens, mask, target};
  }
  std::optional<size_t> size() const override { return data_->tokens.size(); }

 private:
  std::shared_ptr<const Sequences> data_;
  std::vector<std::int64_t> bounds_;
};

/// Batches of samples of one bucket each (a batch sampler for nitro::from_dataset): each epoch every
/// bucket is shuffled and cut into batches (its last one smaller), and the batches are shuffled, all
/// from (seed, epoch). Without buckets: the samples shuffled and cut, as a random sampler's batches.
class BucketSampler {
 public:
  using BatchRequestType = std::vector<size_t>;

  BucketSampler(std::vector<std::int64_t> bucket_of, std::size_t batch, std::uint64_t seed)
      : bucket_of_(std::move(bucket_of)), batch_(batch), seed_(seed) {}

  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }
  void reset(std::optional<size_t> /*size*/ = std::nullopt) {
    std::mt19937_64 rng(seed_ * 1000003 + static_cast<std::uint64_t>(epoch_));
    std::map<std::int64_t, std::vector<size_t>> buckets;
    for (size_t i = 0; i < bucket_of_.size(); ++i) buckets[bucket_of_[i]].push_back(i);
    batches_.clear();
    for (auto& [bucket, members] : buckets) {
      std::shuffle(members.begin(), members.end(), rng);
      for (size_t from = 0; from < members.size(); from += batch_)
        batches_.emplace_back(members.begin() + static_cast<std::ptrdiff_t>(from),
                              members.begin() + static_cast<std::ptrdiff_t>(std::min(members.size(), from + batch_)));
    }
    std::shuffle(batches_.begin(), batches_.end(), rng);
    next_ = 0;
  }
  std::optional<BatchRequestType> next(size_t /*batch_size: the batches are made in reset*/) {
    if (next_ >= batches_.size()) return std::nullopt;
    return batches_[next_++];
  }

 private:
  std::vector<std::int64_t> bucket_of_;
  std::size_t batch_;
  std::uint64_t seed_;
  std::int64_t epoch_ = 0;
  std::vector<BatchRequestType> batches_;
  std::size_t next_ = 0;
};

/// Each sample's bucket (its padded length); all in bucket 0 without buckets.
std::vector<std::int64_t> buckets_of(const Sequences& s, const std::vector<std::int64_t>& bounds) {
  std::vector<std::int64_t> out;
  for (const auto& t : s.tokens) out.push_back(bounds.empty() ? 0 : padded_length(static_cast<std::int64_t>(t.size()), bounds));
  return out;
}

/// The shapes and the padded share of the tokens of `epochs` epochs of a sampler's batches (no data
/// made): what the other way of batching would have given.
std::pair<std::size_t, double> shapes_and_padding(const Sequences& s, const std::vector<std::int64_t>& bounds, std::size_t batch,
                                                  int epochs) {
  BucketSampler sampler(buckets_of(s, bounds), batch, 1);
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;
  double real = 0, padded = 0;
  for (int e = 0; e < epochs; ++e) {
    sampler.set_epoch(e);
    sampler.reset();
    while (const auto b = sampler.next(batch)) {
      std::int64_t longest = 0;
      for (const auto i : *b) {
        longest = std::max(longest, static_cast<std::int64_t>(s.tokens[i].size()));
        real += static_cast<double>(s.tokens[i].size());
      }
      const auto t = padded_length(longest, bounds);
      shapes.insert({static_cast<std::int64_t>(b->size()), t});
      padded += static_cast<double>(t) * static_cast<double>(b->size());
    }
  }
  return {shapes.size(), 1.0 - real / padded};
}

/// graph::Capture's rule (graph/capture.hpp), played over the steps' shapes in order: each shape runs
/// `warmup` eager steps, then is captured (and replayed at once) while fewer than `max_graphs` graphs
/// exist, and replayed from then on; a shape that finds every slot taken runs eagerly. The steps that
/// ran from a graph (captures and replays).
std::size_t graph_steps(const std::vector<std::pair<std::int64_t, std::int64_t>>& steps, std::int64_t warmup,
                        std::size_t max_graphs) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> seen;  // -1: captured
  std::size_t graphs = 0, from_graph = 0;
  for (const auto& shape : steps) {
    auto& e = seen[shape];
    if (e < 0) ++from_graph;
    else if (graphs >= max_graphs) continue;
    else if (e < warmup) ++e;
    else e = -1, ++graphs, ++from_graph;
  }
  return from_graph;
}

// ---- the model ----------------------------------------------------------------------------------------

struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl()
      : embed(register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocab, 32).padding_idx(kPad)))),
        gru(register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(32, 64).batch_first(true)))),
        head(register_module("head", torch::nn::Linear(64, kMarkers))) {}

  /// Class scores [B, kMarkers] from the GRU's output at each row's last real token.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& mask) {
    const auto out = std::get<0>(gru->forward(embed->forward(tokens)));  // [B, T, 64]
    const auto last = (mask.sum(1) - 1).view({-1, 1, 1}).expand({out.size(0), 1, out.size(2)});
    return head->forward(out.gather(1, last).squeeze(1));
  }

  torch::nn::Embedding embed;
  torch::nn::GRU gru;
  torch::nn::Linear head;
};
TORCH_MODULE(Classifier);

double accuracy(Classifier& model, const Sequences& test, const std::vector<std::int64_t>& bounds, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  SequenceBatches set(std::make_shared<const Sequences>(test), bounds);
  BucketSampler sampler(buckets_of(test, bounds), 256, 0);
  sampler.reset();
  std::int64_t right = 0;
  while (const auto indices = sampler.next(256)) {
    const auto b = nitro::to_device(set.get_batch(*indices), device);
    right += model->forward(b.tokens, b.mask).argmax(1).eq(b.target).sum().item<std::int64_t>();
  }
  model->train();
  return static_cast<double>(right) / static_cast<double>(test.tokens.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const c10::Device device = nitro::Cuda::available() ? nitro::Cuda::device() : nitro::Cpu::device();
  const auto bounds = bucket_bounds(args);
  const auto train = std::make_shared<const Sequences>(make_sequences(args.samples, args, 1));
  const Sequences test = make_sequences(512, args, 2);

  std::printf("sequence: %lld sequences of %lld to %lld tokens, batch %lld, %d epochs, on %s\n",
              static_cast<long long>(args.samples), static_cast<long long>(args.min_length),
              static_cast<long long>(args.max_length), static_cast<long long>(args.batch), args.epochs, device.str().c_str());
  if (bounds.empty()) {
    std::printf("no buckets: random batches, each padded to its own longest sequence\n");
  } else {
    std::string line = "buckets (lengths -> padded to):";
    std::int64_t from = args.min_length;
    for (const auto b : bounds) {
      line += " " + std::to_string(from) + "-" + std::to_string(b) + " -> " + std::to_string(b) + ",";
      from = b + 1;
    }
    line.back() = '\n';
    std::fputs(line.c_str(), stdout);
  }

  torch::manual_seed(0);
  Classifier model;
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(3e-3));
  using Loop = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced>;
  Loop::Options options;
  if (!args.autotune_cache.empty()) options.tune.cache_dir = args.autotune_cache;
  options.tune.print_table = false;  // printed below, after the first step
  Loop loop{model, optimizer, options};

  const auto loss_fn = [&](const SeqBatch& b) { return torch::cross_entropy_loss(model->forward(b.tokens, b.mask), b.target); };
  auto source = nitro::from_dataset(SequenceBatches(train, bounds),
                                    BucketSampler(buckets_of(*train, bounds), static_cast<std::size_t>(args.batch), 1),
                                    static_cast<std::size_t>(args.batch));
  nitro::Prefetcher<nitro::Auto, decltype(source)> batches{std::move(source), {.depth = 4, .workers = 1, .device = device}};

  std::set<std::pair<std::int64_t, std::int64_t>> shapes;
  std::vector<std::pair<std::int64_t, std::int64_t>> step_shapes;  // in order
  std::string first_shape;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    batches.set_epoch(epoch);
    const auto start = std::chrono::steady_clock::now();
    const auto shapes_before = shapes.size();
    at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    std::int64_t steps = 0;
    for (auto& b : batches) {
      const bool first = !loop.chosen();
      loss_sum += loop.step(b, loss_fn).loss.detach();  // the first step tunes, on this batch's shape
      if (first) {
        first_shape = "[" + std::to_string(b.tokens.size(0)) + ", " + std::to_string(b.tokens.size(1)) + "]";
        std::printf("level::Auto at its first step, batch shape %s (%s):\n%s\n", first_shape.c_str(),
                    loop.result().source == "cache" ? "the decision cache's choice for this key" : "tuned on this batch",
                    loop.result().table().c_str());
        std::printf("%s; every later shape trains with this choice\n", loop.describe().c_str());
      }
      shapes.insert({b.tokens.size(0), b.tokens.size(1)});
      step_shapes.push_back({b.tokens.size(0), b.tokens.size(1)});
      ++steps;
    }
    std::printf("epoch %d  %5.2f s  loss %.4f  test accuracy %.4f  batch shapes seen %zu (%zu new)\n", epoch,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                loss_sum.item<double>() / static_cast<double>(steps), accuracy(model, test, bounds, device), shapes.size(),
                shapes.size() - shapes_before);
  }

  // The same epochs batched the other way (no data made, the samplers only): bucketing against random batches.
  Args other = args;
  other.buckets = args.buckets > 0 ? 0 : std::min<std::int64_t>(4, args.max_length - args.min_length + 1);
  const auto name = [](const Args& a) {
    return a.buckets > 0 ? std::to_string(a.buckets) + " buckets" : std::string("random batches padded to their longest");
  };
  for (const Args* a : std::array<const Args*, 2>{&args, &other}) {
    const auto [count, padding] = shapes_and_padding(*train, bucket_bounds(*a), static_cast<std::size_t>(a->batch), a->epochs);
    std::printf("%s %s: %zu batch shapes over %d epochs, %.0f%% of the tokens padding\n", a == &args ? "\nthis run," : "instead,",
                name(*a).c_str(), count, a->epochs, 100 * padding);
  }
  std::printf("what the %zu shapes mean:\n"
              "  level::Auto chose once, at its first step, on shape %s; the choice holds for every shape. Its decision cache\n"
              "  is keyed by that shape: a run starting with another one tunes again (the seeded order starts every run alike).\n"
              "  level::Max on a GPU (graph::Capture) runs one CUDA graph per shape, captured after 3 eager warm-up steps of\n"
              "  that shape: of these %zu steps, %zu would run from a graph with Options{.max_graphs = %zu} (one per shape),\n"
              "  %zu with the default max_graphs = 2 (the other shapes' steps eager).\n",
              shapes.size(), first_shape.c_str(), step_shapes.size(), graph_steps(step_shapes, 3, shapes.size()), shapes.size(),
              graph_steps(step_shapes, 3, 2));
  std::printf("done: %zu distinct batch shapes, test accuracy %.4f, %s\n", shapes.size(), accuracy(model, test, bounds, device),
              loop.describe().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sequence: %s\n", e.what());
  return 1;
}
