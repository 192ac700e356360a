#pragma once
// What the file readers' fuzz targets share: the input written to a memory file that the reader
// opens by path (/proc/self/fd/N), the count of that file's mappings left in the process (a reader
// that refused a file must not leave it mapped), and how a finding ends the run.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace nitro_fuzz {

// Ends the run as libFuzzer counts a crash, saying what the target found.
[[noreturn]] inline void finding(const char* target, const char* what) {
  std::fprintf(stderr, "%s: %s\n", target, what);
  std::abort();
}

// The memory file the input is written to, the same for the whole run.
inline int memory_file() {
  static const int fd = ::memfd_create("nitro-fuzz-input", 0);
  return fd;
}

// Its path, as a reader opens a file.
inline std::string memory_file_path() { return "/proc/self/fd/" + std::to_string(memory_file()); }

// Replaces the memory file's bytes by `b`; false where it cannot (the input is then skipped).
inline bool write_input(const std::vector<unsigned char>& b) {
  const int fd = memory_file();
  if (fd < 0 || ::ftruncate(fd, 0) != 0) return false;
  for (std::size_t done = 0; done < b.size();) {
    const ::ssize_t w = ::pwrite(fd, b.data() + done, b.size() - done, static_cast<::off_t>(done));
    if (w <= 0) return false;
    done += static_cast<std::size_t>(w);
  }
  return true;
}

// How many mappings of the input file this process has (/proc/self/maps lines naming the memory
// file): none once the reader is gone, whether it opened the file or refused it.
inline int mappings_of_input() {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string maps;
  char buffer[65536];
  for (::ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) maps.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  int count = 0;
  for (std::size_t at = 0; (at = maps.find("/memfd:nitro-fuzz-input", at)) != std::string::npos; ++at) ++count;
  return count;
}

// One input of a file reader's target (records, packed images): byte 4000 of the header, which the
// readers only hash, chooses lazy, eager or no verification (mod 3), and bit 0 of byte 4001 whether
// `fix(bytes)` first puts the checksums where the reader looks (so the damage reaches the structure
// checks); the bytes are then written to the memory file and `read(bytes, verify)` reads them. A
// refused file must not stay mapped either (the mapping belongs to the reader object).
template <class Verify, class Fix, class Read>
int read_input(const std::uint8_t* data, std::size_t size, std::size_t header_bytes, const char* target, Fix fix,
               Read read) {
  std::vector<unsigned char> b(data, data + size);
  Verify verify = Verify::lazy;
  if (b.size() >= header_bytes) {
    verify = b[4000] % 3 == 0 ? Verify::lazy : b[4000] % 3 == 1 ? Verify::eager : Verify::none;
    if ((b[4001] & 1) == 0) fix(b);
  }
  if (!write_input(b)) return 0;
  read(b, verify);
  if (mappings_of_input() != 0) finding(target, "the file is still mapped after the reader is gone");
  return 0;
}

// The folder of `--make-corpus DIR`, created; nothing (after a usage line) for other arguments.
inline std::optional<std::filesystem::path> corpus_dir(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--make-corpus") {
    std::fprintf(stderr, "usage: %s --make-corpus DIR\n", argv[0]);
    return std::nullopt;
  }
  std::filesystem::create_directories(argv[2]);
  return std::filesystem::path(argv[2]);
}

}  // namespace nitro_fuzz
