// io/file.hpp: the streaming XXH64 against the one-shot one, AtomicFile's guarantees, and
// remove_tree (with the std::filesystem::remove_all crash it replaces, in a child process).
#include "testing.hpp"

#include "child.hpp"

#include <nitro/io/file.hpp>

#include <signal.h>
#include <sys/resource.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

namespace nitro_test_io_file {  // one namespace per file: an area is compiled as one translation unit

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
  // An empty piece (a span over no memory at all) in the middle of a stripe changes nothing; under
  // the sanitizers, it copies from no null pointer.
  nitro::io::Xxh64 gapped(17);
  gapped.update({data.data(), 5});
  gapped.update(std::span<const std::byte>{});
  gapped.update({data.data() + 5, 95});
  CHECK(gapped.digest() == nitro::io::xxh64({data.data(), 100}, 17));
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

// ---- remove_tree ----------------------------------------------------------------------------------

namespace {
bool present(const fs::path& p) {  // the entry itself, a dangling symlink too
  struct ::stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}
void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// <root>/t:       a, d/b, d/e/c, empty/, ldir -> <root>/out, lfile -> <root>/out/keep   (9 entries with t)
// <root>/out:     keep, inner/x                                                        (outside the tree)
void make_tree(const fs::path& root) {
  fs::create_directories(root / "t" / "d" / "e");
  fs::create_directories(root / "t" / "empty");
  fs::create_directories(root / "out" / "inner");
  write_text(root / "t" / "a", "a");
  write_text(root / "t" / "d" / "b", "b");
  write_text(root / "t" / "d" / "e" / "c", "c");
  write_text(root / "out" / "keep", "keep");
  write_text(root / "out" / "inner" / "x", "x");
  REQUIRE(::symlink((root / "out").c_str(), (root / "t" / "ldir").c_str()) == 0);
  REQUIRE(::symlink((root / "out" / "keep").c_str(), (root / "t" / "lfile").c_str()) == 0);
}
void check_outside_intact(const fs::path& root) {
  CHECK(read_text(root / "out" / "keep") == "keep");
  CHECK(read_text(root / "out" / "inner" / "x") == "x");
}
}  // namespace

TEST_CASE("remove_tree removes nested directories, files and symlinks, and no symlink's target") {
  TempDir dir("nitro-remove-tree", true);
  make_tree(dir.path);
  // In this program (linked like every Nitro program) std::filesystem::remove_all would crash here.
  CHECK(nitro::io::remove_tree(dir / "t") == 9);
  CHECK_FALSE(present(dir / "t"));
  check_outside_intact(dir.path);

  make_tree(dir.path);
  std::error_code ec = std::make_error_code(std::errc::io_error);  // cleared on success
  CHECK(nitro::io::remove_tree(dir / "t", ec) == 9);
  CHECK_FALSE(ec);
  CHECK_FALSE(present(dir / "t"));
  check_outside_intact(dir.path);
}

TEST_CASE("remove_tree of a single file, an empty directory, a symlink and a missing path") {
  TempDir dir("nitro-remove-tree", true);
  make_tree(dir.path);
  CHECK(nitro::io::remove_tree(dir / "t" / "a") == 1);
  CHECK_FALSE(present(dir / "t" / "a"));
  CHECK(nitro::io::remove_tree(dir / "t" / "empty") == 1);
  CHECK_FALSE(present(dir / "t" / "empty"));
  CHECK(nitro::io::remove_tree(dir / "t" / "lfile") == 1);  // the link, not the file it names
  CHECK_FALSE(present(dir / "t" / "lfile"));
  // A symlink to a directory, written with a trailing '/' too (which would make the system follow it).
  CHECK(nitro::io::remove_tree(dir / "t" / "ldir") == 1);
  CHECK_FALSE(present(dir / "t" / "ldir"));
  REQUIRE(::symlink((dir / "out").c_str(), (dir / "t" / "ldir").c_str()) == 0);
  CHECK(nitro::io::remove_tree((dir / "t" / "ldir").string() + "/") == 1);
  CHECK_FALSE(present(dir / "t" / "ldir"));
  check_outside_intact(dir.path);
  // A dangling symlink is an entry like any other.
  REQUIRE(::symlink((dir / "nowhere").c_str(), (dir / "t" / "dangling").c_str()) == 0);
  CHECK(nitro::io::remove_tree(dir / "t" / "dangling") == 1);
  CHECK_FALSE(present(dir / "t" / "dangling"));

  CHECK(nitro::io::remove_tree(dir / "missing") == 0);
  std::error_code ec = std::make_error_code(std::errc::io_error);
  CHECK(nitro::io::remove_tree(dir / "missing", ec) == 0);
  CHECK_FALSE(ec);
  CHECK(nitro::io::remove_tree(fs::path()) == 0);
  CHECK(nitro::io::remove_tree(dir / "t") == 5);  // what is left: t, d, d/b, d/e, d/e/c
  CHECK_FALSE(present(dir / "t"));
}

TEST_CASE("remove_tree: a failure is a nitro::Error naming the path and the reason, or the error_code") {
  TempDir dir("nitro-remove-tree", true);
  write_text(dir / "file", "f");
  const fs::path under_a_file = dir / "file" / "x";  // ENOTDIR, for root too
  const std::string expected = "cannot inspect " + under_a_file.string() + ": Not a directory";
  CHECK_THROWS_WITH_AS(nitro::io::remove_tree(under_a_file), doctest::Contains(expected.c_str()), nitro::Error);
  std::error_code ec;
  CHECK(nitro::io::remove_tree(under_a_file, ec) == static_cast<std::uintmax_t>(-1));
  CHECK(ec == std::errc::not_a_directory);
  CHECK(read_text(dir / "file") == "f");
}

// Removes args[0] as an unprivileged user (root drops to nobody first: permissions do not bind root)
// and expects a nitro::Error on args[1], the directory it may not read. 0: as expected; 4: cannot
// drop privileges; 5: no error; 6: another message (printed).
NITRO_TEST_CHILD(remove_tree_unprivileged) {
  if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 4;
  try {
    nitro::io::remove_tree(args.at(0));
  } catch (const nitro::Error& e) {
    const std::string expected = "cannot open the directory " + args.at(1) + ": Permission denied";
    if (std::string(e.what()).find(expected) != std::string::npos) return 0;
    std::fprintf(stderr, "remove_tree_unprivileged: %s\n", e.what());
    return 6;
  }
  return 5;
}

TEST_CASE("remove_tree: a directory it may not read stops it with a nitro::Error naming that directory") {
  TempDir dir("nitro-remove-tree", true);
  fs::create_directories(dir / "t" / "locked");
  fs::create_directories(dir / "t" / "open");
  write_text(dir / "t" / "locked" / "x", "x");
  write_text(dir / "t" / "open" / "y", "y");
  if (::geteuid() == 0) {  // the unprivileged child must reach the tree and own it
    fs::permissions(dir.path, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    for (const auto& p : {dir / "t", dir / "t" / "locked", dir / "t" / "locked" / "x", dir / "t" / "open",
                          dir / "t" / "open" / "y"})
      REQUIRE(::lchown(p.c_str(), 65534, 65534) == 0);
  }
  fs::permissions(dir / "t" / "locked", fs::perms::none);
  const int status = nitro::test::run_child("remove_tree_unprivileged", {(dir / "t").string(), (dir / "t" / "locked").string()});
  fs::permissions(dir / "t" / "locked", fs::perms::owner_all);
  if (status == 4) {
    MESSAGE("skipped: running as root without the right to become nobody (setuid)");
    return;
  }
  CHECK(status == 0);
  CHECK(read_text(dir / "t" / "locked" / "x") == "x");  // what it could not read is left
}

// std::filesystem::remove_all of the non-empty directory args[0]. A crash ends it by SIGSEGV, core
// dumps off; the sanitizers' own SIGSEGV handlers (exit codes 1 and 66) are put aside.
NITRO_TEST_CHILD(std_remove_all) {
  const ::rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  struct ::sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(SIGSEGV, &default_action, nullptr);
  return fs::remove_all(args.at(0)) == 3 ? 0 : 1;
}

namespace {
/// The file mapped at `address` in this process (/proc/self/maps), or "" when none is.
std::string mapped_file(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, file;
    fields >> range >> perms >> offset >> device >> inode >> file;
    const auto dash = range.find('-');
    const auto begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const auto end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (begin <= at && at < end) return file;
  }
  return "";
}
}  // namespace

// The weak reference libtorch.so's remove_all makes, made here too: null where libstdc++ lacks it.
[[gnu::weak]] void libstdcxx_recursive_directory_iterator_erase() __asm__(
    "_ZNSt10filesystem7__cxx1128recursive_directory_iterator7__eraseEPSt10error_code");

// Why io::remove_tree exists, checked where it runs: libtorch.so (2.11) exports its own
// std::filesystem::remove_all, which a program linked like Nitro's calls instead of libstdc++'s, and
// which calls recursive_directory_iterator::__erase, a function only GCC 13's libstdc++ and later have:
// with an older one, remove_all of a directory that is not empty is a call to address 0 (SIGSEGV).
// The prediction is made from this process's own bindings, so the test holds either way and says
// which: if libstdc++ comes before libtorch.so in the link (README: the link-order fix), remove_all
// binds to libstdc++ and works.
TEST_CASE("std::filesystem::remove_all of a non-empty directory crashes exactly when it binds to libtorch.so's copy") {
  TempDir dir("nitro-remove-all", true);
  fs::create_directories(dir / "t" / "d");
  write_text(dir / "t" / "d" / "f", "f");
  const auto remove_all = static_cast<std::uintmax_t (*)(const fs::path&)>(&fs::remove_all);
  const std::string bound_to = mapped_file(reinterpret_cast<const void*>(remove_all));
  const bool torch_copy = fs::path(bound_to).filename() == "libtorch.so";
  const bool erase_present = &libstdcxx_recursive_directory_iterator_erase != nullptr;
  const int status = nitro::test::run_child("std_remove_all", {(dir / "t").string()});
  const std::string found = "std::filesystem::remove_all is bound to " + bound_to + "; libstdc++ " +
                            (erase_present ? "has" : "lacks") + " recursive_directory_iterator::__erase; the child " +
                            (status == 0 ? "removed the tree" : "ended with status " + std::to_string(status));
  MESSAGE(found);
  if (torch_copy && !erase_present) {
    CHECK(status == 128 + SIGSEGV);
    CHECK(present(dir / "t" / "d" / "f"));
  } else {
    CHECK(status == 0);
    CHECK_FALSE(present(dir / "t"));
  }
}

}  // namespace nitro_test_io_file
