// libFuzzer target over the snapshot reader (snapshot/snapshot.hpp): any bytes, as a file, through
// Reader (footer, manifest, format version) and every part's decoder (counts, names, dtypes, shapes,
// byte counts). A damaged input must end in nitro::Error; anything else (a crash, a sanitizer report,
// another exception, an allocation beyond the input's size) is a finding.
//
// Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, which skips the checksum comparisons so that
// mutated inputs reach the decoders (a real reader stops at the checksum). tests/fuzz/run.sh builds
// and runs it; the files at the top of tests/fuzz/corpus/ (its subfolders are the other targets'
// seeds) are small valid snapshots to start from: *.nitro of format version 1 (XXH64;
// tests/snapshot/snapshot.cpp loads them as files an earlier Nitro wrote) and *-v2.nitro of version
// 2 (XXH3).
//
// With --make-corpus DIR (a plain build, no fuzzer) it writes that corpus.
#include <nitro/snapshot/snapshot.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/optim/adam.h>

#include "input_file.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!nitro_fuzz::write_input(std::vector<unsigned char>(data, data + size))) return 0;
  try {
    const nitro::snapshot::Reader reader(nitro_fuzz::memory_file_path());
    for (const auto& part : reader.manifest().parts) (void)reader.read(part.name);
  } catch (const nitro::Error&) {
    // a refused file: what damaged input must give
  }
  return 0;
}

#ifdef NITRO_FUZZ_MAKE_CORPUS
int main(int argc, char** argv) {
  const auto corpus = nitro_fuzz::corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path dir = *corpus;
  torch::manual_seed(0);
  torch::nn::Linear tiny(3, 2);
  torch::optim::SGD sgd(tiny->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::Adam adam(tiny->parameters(), torch::optim::AdamOptions(0.01));
  for (auto& p : tiny->parameters()) p.mutable_grad() = torch::ones_like(p);
  sgd.step();
  adam.step();
  nitro::StateDict extras;
  extras.tensors["t"] = torch::arange(6, torch::kInt16).reshape({2, 3});
  extras.integers["i"] = 42;
  extras.numbers["x"] = 0.5;
  extras.strings["s"] = "text";
  for (const std::uint32_t version : {1u, 2u}) {
    const nitro::snapshot::SaveOptions options{.fsync = false, .format_version = version};
    const std::string suffix = version == 1 ? ".nitro" : "-v2.nitro";
    nitro::snapshot::save(dir / ("extras" + suffix), {.extras = &extras, .rng = false}, options);
    nitro::snapshot::save(dir / ("sgd" + suffix), {.model = tiny.ptr().get(), .optimizer = &sgd, .rng = false},
                          options);
    nitro::snapshot::save(dir / ("adam" + suffix), {.model = tiny.ptr().get(), .optimizer = &adam, .rng = false},
                          options);
  }
  return 0;
}
#endif
