// libFuzzer target over YOLO label files as data::YoloDataset reads them (data/image_folder.hpp;
// the parser is YoloDataset's private read_labels, reached only through a data set on a folder): any
// bytes as the label file of one image of a tiny Ultralytics folder, read with check_normalised on
// and off. A malformed file must end in nitro::Error; anything else (a crash, a sanitizer report, a
// leak, another exception) is a finding, and so are boxes that break what the parser promises: rows
// of 5, a whole class >= 0, finite coordinates, in [0, 1] when checked.
//
// The folder, made once per process under $TMPDIR (or /dev/shm) and removed at exit (or by the next
// process, after a crash):
//   images/a.png   a 2 x 2 PNG, whose labels/a.txt is the input (rewritten for each input)
//   images/b.png   the same image, without a label file (an unlabelled image)
// The seeds in corpus/yolo_labels/ are label files (valid lines, blank lines, CRLF, bad numbers).
#include <nitro/data/image_folder.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

namespace fs = std::filesystem;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "yolo_labels: %s\n", what);
  std::abort();
}

// A 2 x 2 RGB PNG (Pillow's).
constexpr unsigned char kPng[] = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xfd, 0xd4, 0x9a, 0x73, 0x00, 0x00, 0x00,
    0x16, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x3c, 0xa1, 0x11, 0xc5, 0xc0, 0xc0, 0xc0, 0x70, 0x42, 0x23,
    0x8a, 0xe1, 0x3f, 0x03, 0x00, 0x18, 0xe0, 0x03, 0x95, 0x53, 0x76, 0x84, 0xee, 0x00, 0x00, 0x00, 0x00, 0x49,
    0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};

bool write_file(const std::string& path, const void* data, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  for (std::size_t done = 0; done < size;) {
    const ::ssize_t w = ::write(fd, static_cast<const char*>(data) + done, size - done);
    if (w <= 0) {
      ok = false;
      break;
    }
    done += static_cast<std::size_t>(w);
  }
  return ::close(fd) == 0 && ok;
}

std::string root_folder;
void remove_root() {
  std::error_code ec;
  if (!root_folder.empty()) fs::remove_all(root_folder, ec);
}

// Folders that processes no longer running left (a crash skips the exit's removal).
void remove_stale(const std::string& base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("nitro-fuzz-yolo-")) continue;
    const long pid = std::strtol(name.c_str() + 16, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<::pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

const std::string& root() {
  static const std::string r = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp != nullptr && *tmp != '\0' ? tmp : (fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    remove_stale(base);
    std::string templ = base + "/nitro-fuzz-yolo-" + std::to_string(::getpid()) + "-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) finding("cannot make a temporary folder");
    root_folder = templ;
    std::atexit(remove_root);
    fs::create_directories(templ + "/images");
    fs::create_directories(templ + "/labels");
    if (!write_file(templ + "/images/a.png", kPng, sizeof kPng) || !write_file(templ + "/images/b.png", kPng, sizeof kPng))
      finding("cannot write the folder's images");
    return templ;
  }();
  return r;
}

void read(bool normalised) {
  const nitro::data::YoloDataset set(root(), {.check_normalised = normalised});
  if (set.size() != 2 || set.unlabelled() != 1) finding("the folder's two images not found as made");
  const auto a = set.boxes(0), b = set.boxes(1);
  if (a.dim() != 2 || a.size(1) != 5 || a.scalar_type() != at::kFloat || a.size(0) != set.box_count())
    finding("boxes not a float [n, 5] tensor of box_count() rows");
  if (b.dim() != 2 || b.size(0) != 0 || b.size(1) != 5) finding("an unlabelled image with boxes");
  const auto* v = a.data_ptr<float>();
  for (std::int64_t r = 0; r < a.size(0); ++r) {
    const float* row = v + 5 * r;
    if (!(row[0] >= 0 && row[0] == std::floor(row[0]))) finding("a class that is not a whole number >= 0");
    for (int j = 1; j < 5; ++j) {
      if (!std::isfinite(row[j])) finding("a coordinate that is not finite");
      if (normalised && !(row[j] >= 0 && row[j] <= 1)) finding("a coordinate outside [0, 1] passed the check");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!write_file(root() + "/labels/a.txt", data, size)) finding("cannot write the label file");
  for (const bool normalised : {true, false}) {
    try {
      read(normalised);
    } catch (const nitro::Error&) {
      // a malformed label file: what damaged input must give
    }
  }
  return 0;
}
