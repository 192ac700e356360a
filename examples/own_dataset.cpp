// Your own data set: a class deriving from torch::data::datasets::Dataset that reads a CSV listing
// of image files and their labels, decodes one file per get(i), and trains a classifier through
// Nitro: a cache in front of it, worker threads making the batches ahead of the step, level::Basic.
// The port of pytorch/examples' cpp/custom-dataset (a CSV of image paths and labels, read with
// OpenCV there; PGM files, read by hand, here).
//
// The data set as it would arrive from elsewhere:
//   <dir>/train.csv, <dir>/test.csv     "file,label" then one line per image: images/00017.pgm,3
//   <dir>/images/<n>.pgm                28x28 grayscale, binary PGM (P5)
// Without them (the first run, or other --samples), it writes them from nitro::data::SyntheticImages
// (an MNIST-like task of 10 classes); a later run reuses them.
//
// The path of a batch:
//   PgmFolder::get(i)   opens and decodes a file (the expensive part; it counts its reads)
//   -> nitro::cached<nitro::evict::NoEvict>: the decoded bytes (uint8) stay in memory; an epoch
//      after the first reads from there, up to the cache's budget (--cache-fraction of the data set)
//   -> .map(to float and normalise) .map(Stack): after the cache, so the cache holds 1 byte a pixel
//   -> nitro::from_dataset(dataset, RandomSampler, batch): each worker its own copy of the data set
//   -> nitro::prefetch<nitro::Cpu>(..., {.workers = W}): batches made ahead; one prefetcher, every epoch
//   -> nitro::level::Basic: the training step
//
//   build/examples/own_dataset                                    # 3 epochs of 2048 images
//   build/examples/own_dataset --cache-fraction 0.5               # half fits: 50% hits after epoch 1
//   build/examples/own_dataset --dir /tmp/mine --samples 8192 --epochs 5 --batch 64 --workers 4 --threads 4
//
// Each epoch prints its loss, the training and test accuracy, the files read and the cache's hit
// ratio; the last line, the cache's totals.
#include <nitro/cache/cached_dataset.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/source.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace {

// A flag's value as a number: all of it, or a nitro::Error naming the flag.
template <class T>
T number(std::string_view flag, const std::string& text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  NITRO_CHECK(ec == std::errc{} && end == text.data() + text.size() && !text.empty(), "own_dataset: ", flag,
              " takes a number", std::is_unsigned_v<T> ? " >= 0" : "", ", got '", text, "'");
  return v;
}

namespace fs = std::filesystem;

// ---- The user's data set ------------------------------------------------------------------------

// A CSV listing of grayscale PGM images and their labels, as many data sets arrive. get(i) reads
// and decodes image i. Copies are cheap (the listing and the read counter are shared): torch::data
// and Nitro give each worker thread a copy.
class PgmFolder : public torch::data::datasets::Dataset<PgmFolder> {
 public:
  struct Entry {
    fs::path file;
    std::int64_t label;
  };

  explicit PgmFolder(const fs::path& csv) : root_(csv.parent_path()) {
    std::ifstream in(csv);
    NITRO_CHECK(in.good(), "PgmFolder: cannot open ", csv.string());
    auto entries = std::make_shared<std::vector<Entry>>();
    std::string line;
    std::getline(in, line);  // the header: file,label
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto comma = line.rfind(',');
      NITRO_CHECK(comma != std::string::npos, "PgmFolder: ", csv.string(), ": line \"", line, "\" is not file,label");
      entries->push_back({line.substr(0, comma), std::stoll(line.substr(comma + 1))});
    }
    NITRO_CHECK(!entries->empty(), "PgmFolder: ", csv.string(), " lists no image");
    entries_ = std::move(entries);
  }

  // Image i as a [1, H, W] uint8 tensor, and its label.
  torch::data::Example<> get(size_t i) override {
    const Entry& e = (*entries_)[i];
    ++*reads_;
    return {read_pgm(root_ / e.file), torch::tensor(e.label, torch::kInt64)};
  }

  std::optional<size_t> size() const override { return entries_->size(); }

  // Files decoded so far, by this data set and every copy of it.
  std::int64_t files_read() const { return reads_->load(); }

 private:
  static at::Tensor read_pgm(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::string magic;
    std::int64_t width = 0, height = 0, max_value = 0;
    in >> magic >> width >> height >> max_value;
    in.get();  // the one whitespace character before the pixels
    NITRO_CHECK(in.good() && magic == "P5" && width > 0 && height > 0 && max_value == 255, "PgmFolder: ", file.string(),
                " is not an 8-bit binary PGM image");
    auto pixels = torch::empty({1, height, width}, torch::kUInt8);
    in.read(reinterpret_cast<char*>(pixels.data_ptr<std::uint8_t>()), static_cast<std::streamsize>(pixels.numel()));
    NITRO_CHECK(in.good(), "PgmFolder: ", file.string(), " ends before its ", width, "x", height, " pixels");
    return pixels;
  }

  fs::path root_;
  std::shared_ptr<const std::vector<Entry>> entries_;
  std::shared_ptr<std::atomic<std::int64_t>> reads_ = std::make_shared<std::atomic<std::int64_t>>(0);
};

// ---- Writing the demo data set (a real one is already on disk) ---------------------------------

constexpr std::int64_t kSide = 28;

// `count` images from sample `offset` of the synthetic task, listed in <dir>/<name>.csv. The listing
// is written last, under a temporary name then renamed: a run stopped half-way leaves no listing,
// and the next run writes the files again.
void write_split(const fs::path& dir, std::string_view name, std::int64_t offset, std::int64_t count) {
  nitro::data::SyntheticImages images({.size = count, .offset = offset, .channels = 1, .height = kSide, .width = kSide,
                                        .noise = 3.0, .seed = 11, .range = nitro::data::SyntheticImages::Range{0, 1}});
  fs::create_directories(dir / "images");
  std::ostringstream listing;
  listing << "file,label\n";
  for (std::int64_t i = 0; i < count; ++i) {
    const auto e = images.get(static_cast<size_t>(i));
    const auto pixels = (e.data * 255).round().clamp(0, 255).to(torch::kUInt8).contiguous();
    char file[32];
    std::snprintf(file, sizeof file, "images/%05lld.pgm", static_cast<long long>(offset + i));
    std::ofstream out(dir / file, std::ios::binary);
    out << "P5\n" << kSide << ' ' << kSide << "\n255\n";
    out.write(reinterpret_cast<const char*>(pixels.data_ptr<std::uint8_t>()), pixels.numel());
    NITRO_CHECK(out.good(), "own_dataset: cannot write ", (dir / file).string());
    listing << file << ',' << e.target.item<std::int64_t>() << '\n';
  }
  const fs::path csv = dir / (std::string(name) + ".csv"), partial = dir / (std::string(name) + ".csv.partial");
  std::ofstream(partial) << listing.str();
  fs::rename(partial, csv);
}

// Lines of a listing, without its header; 0 when there is none.
std::int64_t listed(const fs::path& csv) {
  std::ifstream in(csv);
  std::int64_t lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.empty() ? 0 : 1;
  return lines > 0 ? lines - 1 : 0;
}

// The listings for `train` and `test` images in `dir`: the ones there, or new ones.
void ensure_data_set(const fs::path& dir, std::int64_t train, std::int64_t test) {
  if (listed(dir / "train.csv") == train && listed(dir / "test.csv") == test) {
    std::printf("own_dataset: reusing the %lld + %lld images listed in %s/{train,test}.csv\n",
                static_cast<long long>(train), static_cast<long long>(test), dir.c_str());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  fs::remove(dir / "train.csv");
  fs::remove(dir / "test.csv");
  write_split(dir, "test", train, test);  // the listing of train last: its presence means both are complete
  write_split(dir, "train", 0, train);
  std::printf("own_dataset: wrote %lld + %lld PGM images and their listings to %s in %.2f s\n",
              static_cast<long long>(train), static_cast<long long>(test), dir.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// ---- Training ----------------------------------------------------------------------------------

// pytorch/examples' MNIST network, without dropout.
torch::nn::Sequential make_model() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 5)), nn::ReLU(), nn::MaxPool2d(2),   // 12x12
                        nn::Conv2d(nn::Conv2dOptions(16, 32, 5)), nn::ReLU(), nn::MaxPool2d(2),  // 4x4
                        nn::Flatten(), nn::Linear(32 * 4 * 4, 64), nn::ReLU(), nn::Linear(64, 10));
}

// uint8 pixels to what the model reads: floats of mean about 0 and spread about 1.
at::Tensor normalise(at::Tensor pixels) { return (pixels.to(torch::kFloat) / 255.0 - 0.5) / 0.25; }

}  // namespace

int main(int argc, char** argv) try {
  fs::path dir = fs::temp_directory_path() / "nitro-own-dataset";
  int epochs = 3;
  std::int64_t samples = 2048, batch = 32;
  std::size_t workers = 2;
  double cache_fraction = 1.0;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "own_dataset: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--dir") dir = value();
    else if (arg == "--epochs") epochs = number<int>(arg, value());
    else if (arg == "--samples") samples = number<std::int64_t>(arg, value());
    else if (arg == "--batch") batch = number<std::int64_t>(arg, value());
    else if (arg == "--workers") workers = number<std::size_t>(arg, value());
    else if (arg == "--cache-fraction") cache_fraction = number<double>(arg, value());
    else if (arg == "--threads") threads = number<int>(arg, value());
    else NITRO_CHECK(false, "own_dataset: unknown option ", arg,
                     " (--dir D --epochs E --samples N --batch B --workers W --cache-fraction F --threads T)");
  }
  NITRO_CHECK(epochs >= 1 && batch >= 1 && samples >= batch && workers >= 1,
              "own_dataset: need --epochs >= 1, --samples >= --batch >= 1 and --workers >= 1");
  NITRO_CHECK(cache_fraction > 0 && cache_fraction <= 1, "own_dataset: --cache-fraction must be in (0, 1]");
  NITRO_CHECK(threads >= 1, "own_dataset: --threads must be >= 1");
  // LibTorch's threads for each operation: one by default, as the model is small and the prefetcher's
  // workers want cores too (more threads than free cores make OpenMP spin, many times slower).
  at::set_num_threads(threads);
  torch::manual_seed(0);

  const std::int64_t test_samples = std::max<std::int64_t>(samples / 4, 64);
  ensure_data_set(dir, samples, test_samples);
  PgmFolder train(dir / "train.csv");
  PgmFolder test(dir / "test.csv");

  // The cache's budget: a fraction of the decoded data set's bytes (every image has the same size).
  const auto sample_bytes = static_cast<double>(nitro::TensorBytes{}(test.get(0)));
  auto cached = nitro::cached<nitro::evict::NoEvict>(
      train, {.capacity_bytes = static_cast<std::size_t>(cache_fraction * static_cast<double>(samples) * sample_bytes)});
  std::printf("own_dataset: %lld training images of %lld bytes decoded, a NoEvict cache of %.0f%% of them (%.2f MB), "
              "%zu workers, batch %lld\n",
              static_cast<long long>(samples), static_cast<long long>(sample_bytes), 100 * cache_fraction,
              cache_fraction * static_cast<double>(samples) * sample_bytes / 1e6, workers, static_cast<long long>(batch));

  // The test set, read once through the same class.
  std::vector<at::Tensor> test_images, test_labels;
  for (size_t i = 0; i < *test.size(); ++i) {
    auto e = test.get(i);
    test_images.push_back(normalise(e.data));
    test_labels.push_back(e.target);
  }
  const auto test_x = torch::stack(test_images), test_y = torch::stack(test_labels);

  auto model = make_model();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  nitro::level::Basic loop{model, optimizer};

  // After the cache: uint8 -> normalised floats, then the samples stacked into a batch.
  auto dataset = cached.map(torch::data::transforms::TensorLambda<>(normalise)).map(torch::data::transforms::Stack<>());
  auto batches = nitro::prefetch<nitro::Cpu>(
      nitro::from_dataset(std::move(dataset), torch::data::samplers::RandomSampler(static_cast<size_t>(samples)),
                          static_cast<size_t>(batch)),
      {.depth = 4, .workers = workers});

  const auto wall = std::chrono::steady_clock::now();
  nitro::CacheStats later;  // the cache's counts over the epochs after the first
  std::int64_t read_before = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    // Between epochs the workers are idle (an epoch's end stops them until set_epoch); epoch 0's
    // reads began when the prefetcher was made, with the cache's counts at zero.
    if (epoch > 0) cached.cache().reset_stats();
    batches.set_epoch(epoch);  // a new order, the same worker threads
    at::Tensor loss_sum = torch::zeros({}), correct = torch::zeros({}, torch::kInt64);
    std::int64_t steps = 0, seen = 0;
    model->train();
    for (auto& b : batches) {
      const auto r = loop.step(b, [&](auto& forward, const auto& x) {
        const auto logits = forward(x.data);
        correct += logits.argmax(1).eq(x.target).sum();
        return torch::cross_entropy_loss(logits, x.target);
      });
      loss_sum += r.loss.detach();
      ++steps;
      seen += b.data.size(0);
    }
    const double test_accuracy = [&] {
      torch::NoGradGuard no_grad;
      model->eval();
      return model->forward(test_x).argmax(1).eq(test_y).to(torch::kFloat).mean().item<double>();
    }();
    std::printf("epoch %d/%d  %5.2f s  loss %.4f  train acc %.3f  test acc %.3f  files read %5lld  cache hits %5.1f%%\n",
                epoch + 1, epochs, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                loss_sum.item<double>() / static_cast<double>(steps),
                static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(seen), test_accuracy,
                static_cast<long long>(train.files_read() - read_before), 100 * cached.cache().stats().hit_ratio());
    read_before = train.files_read();
    if (epoch > 0) later += cached.cache().stats();
  }
  const auto held = cached.cache().stats();
  std::printf("done in %.2f s: the cache holds %zu images (%.2f MB); after epoch 1 it served %llu reads and missed %llu "
              "(%.1f%% hits); %lld training files decoded in all\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(), held.entries,
              static_cast<double>(held.bytes) / 1e6, static_cast<unsigned long long>(later.hits),
              static_cast<unsigned long long>(later.misses), 100 * later.hit_ratio(),
              static_cast<long long>(train.files_read()));
  return 0;
} catch (const std::exception& e) {
  const std::string_view what = e.what();  // Nitro's and this program's messages name the program already
  std::fprintf(stderr, "%s%s\n", what.starts_with("own_dataset: ") ? "" : "own_dataset: ", e.what());
  return 1;
}
