#pragma once
// The definitions of nitro/train/autotune.hpp's non-template functions: included by autotune.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/autotune.hpp>

namespace nitro::tune {

NITRO_INLINE std::filesystem::path Options::default_cache_dir() {
  if (const char* dir = std::getenv("NITRO_AUTOTUNE_CACHE")) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::filesystem::path(xdg) / "nitro" / "autotune";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::filesystem::path(home) / ".cache" / "nitro" / "autotune";
  return {};
}

NITRO_INLINE std::string Result::table() const {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "%-58s %10s %9s  %s\n", "autotune candidate", "samples/s", "peak MB", "verdict");
  out += line;
  for (const auto& t : trials) {
    char speed[32] = "-", peak[32] = "-";
    if (t.steps_timed > 0) std::snprintf(speed, sizeof speed, "%.0f", t.samples_per_s);
    if (t.peak_bytes >= 0) std::snprintf(peak, sizeof peak, "%.1f", static_cast<double>(t.peak_bytes) / 1048576.0);
    std::snprintf(line, sizeof line, "%-58s %10s %9s  %s%s\n", t.name.c_str(), speed, peak, t.verdict.c_str(),
                  t.choice == choice && t.ok ? "  <- chosen" : "");
    out += line;
  }
  std::snprintf(line, sizeof line, "chosen: %s (%s%s)\n", name.c_str(), source.c_str(),
                source == "tuned" ? (", " + std::to_string(trials.size()) + " trials in " +
                                     std::to_string(static_cast<int>(std::lround(seconds * 1000))) + " ms")
                                        .c_str()
                                  : "");
  out += line;
  return out;
}

}  // namespace nitro::tune

namespace nitro::tune::detail {

NITRO_INLINE std::string describe(const std::string& loop, const Choice& c) {
  std::string s = loop;
  if (c.channels_last) s += " + channels-last";
  if (c.fused_optimizer) s += " + fused optimizer";
  if (c.cpu_threads > 0) s += ", " + std::to_string(c.cpu_threads) + (c.cpu_threads == 1 ? " thread" : " threads");
  if (c.micro_batches > 1) s += ", " + std::to_string(c.micro_batches) + " micro-batches";
  return s;
}

NITRO_INLINE void default_log(const std::string& text) {
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto end = rest.find('\n');
    const auto line = rest.substr(0, end);
    std::fprintf(stderr, "nitro::autotune: %.*s\n", static_cast<int>(line.size()), line.data());
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
}

NITRO_INLINE Mode mode_of(const Options& o) {
  if (o.mode) return *o.mode;
  const char* env = std::getenv("NITRO_AUTOTUNE");
  if (env == nullptr || *env == '\0') return Mode::automatic;
  const std::string_view v = env;
  if (v == "off") return Mode::off;
  if (v == "force") return Mode::force;
  if (v == "auto") return Mode::automatic;
  ::nitro::detail::fail("nitro::autotune: NITRO_AUTOTUNE is \"", v, "\"; use off (no trials), force (tune again) or "
                        "auto (the cache's choice, else tune), or unset it");
}

NITRO_INLINE void validate(const Options& o) {
  NITRO_CHECK(o.warmup_steps >= 1, "nitro::autotune: warmup_steps must be >= 1 (the first step allocates and "
              "autotunes, and is never timed), got ", o.warmup_steps);
  NITRO_CHECK(o.timed_steps >= 1, "nitro::autotune: timed_steps must be >= 1 (a budget of zero steps measures "
              "nothing), got ", o.timed_steps);
  NITRO_CHECK(o.prune_after >= 0 && o.prune_after <= o.timed_steps, "nitro::autotune: prune_after must be in [0, "
              "timed_steps] (0: never stop a trial early), got ", o.prune_after, " with timed_steps ", o.timed_steps);
  NITRO_CHECK(std::isfinite(o.prune) && o.prune >= 1.0, "nitro::autotune: prune must be >= 1 (a trial slower than "
              "prune times the best so far stops early), got ", o.prune);
  NITRO_CHECK(o.batches >= 1, "nitro::autotune: batches must be >= 1, got ", o.batches);
  for (const int t : o.cpu_threads)
    NITRO_CHECK(t >= 1, "nitro::autotune: every cpu_threads entry must be >= 1, got ", t);
  NITRO_CHECK(o.memory_budget_bytes >= 0, "nitro::autotune: memory_budget_bytes must be >= 0 (0: no limit), got ",
              o.memory_budget_bytes);
  NITRO_CHECK(o.max_micro_batches >= 1 && (o.max_micro_batches & (o.max_micro_batches - 1)) == 0,
              "nitro::autotune: max_micro_batches must be a power of 2 >= 1, got ", o.max_micro_batches);
}

NITRO_INLINE std::string device_name(c10::Device device) {
#if NITRO_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.has_index() ? device.index() : 0) == cudaSuccess)
      return std::string("cuda ") + prop.name;
    return "cuda";
  }
#endif
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      return "cpu " + (colon == std::string::npos ? line : line.substr(colon + 2));
    }
  return std::string("cpu ") + c10::DeviceTypeName(device.type(), true);
}

NITRO_INLINE void synchronize(c10::Device device) {
#if NITRO_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

NITRO_INLINE bool has_conv_weights(torch::nn::Module& model) {
  for (const auto& p : model.parameters())
    if (p.dim() == 4) return true;
  return false;
}

NITRO_INLINE std::unique_ptr<torch::optim::Optimizer> make_fused(torch::optim::Optimizer& user) {
  if (dynamic_cast<optim::FusedStep*>(&user) != nullptr) return nullptr;
  std::unique_ptr<torch::optim::Optimizer> fused;
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(&user)) {
    fused = std::make_unique<optim::FusedSGD>(sgd->param_groups(),
                                              static_cast<const torch::optim::SGDOptions&>(sgd->defaults()));
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&user)) {
    fused = std::make_unique<optim::FusedAdamW>(adamw->param_groups(),
                                                static_cast<const torch::optim::AdamWOptions&>(adamw->defaults()));
  } else if (auto* adam = dynamic_cast<torch::optim::Adam*>(&user)) {
    fused = std::make_unique<optim::FusedAdam>(adam->param_groups(),
                                               static_cast<const torch::optim::AdamOptions&>(adam->defaults()));
  } else {
    return nullptr;
  }
  for (const auto& [key, state] : user.state()) {
    auto copy = state->clone();
    memory::detail::with_state_type(*copy, [&]<class S>() {
      memory::detail::for_each_state_tensor(static_cast<S&>(*copy), [](const at::Tensor& t, auto set) {
        if (t.defined()) set(t.clone());
      });
    });
    fused->state()[key] = std::move(copy);
  }
  return fused;
}

NITRO_INLINE bool has_fused_version(torch::optim::Optimizer& user) {
  return dynamic_cast<optim::FusedStep*>(&user) == nullptr &&
         (dynamic_cast<torch::optim::SGD*>(&user) != nullptr || dynamic_cast<torch::optim::AdamW*>(&user) != nullptr ||
          dynamic_cast<torch::optim::Adam*>(&user) != nullptr);
}

NITRO_INLINE void copy_learning_rates(torch::optim::Optimizer& from, torch::optim::Optimizer& to, std::vector<double>& seen) {
  auto& a = from.param_groups();
  auto& b = to.param_groups();
  for (std::size_t i = 0; i < a.size() && i < b.size() && i < seen.size(); ++i) {
    const double lr = a[i].options().get_lr();
    if (lr != seen[i]) {
      b[i].options().set_lr(lr);
      seen[i] = lr;
    }
  }
}

NITRO_INLINE std::vector<double> learning_rates(torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
  return out;
}

NITRO_INLINE LayoutChange::LayoutChange(torch::nn::Module& model) {
  for (auto& p : model.parameters())
    if (p.dim() == 4 && !p.is_contiguous(c10::MemoryFormat::ChannelsLast)) changed_.push_back(p);
  for (auto& b : model.buffers())
    if (b.dim() == 4 && !b.is_contiguous(c10::MemoryFormat::ChannelsLast)) changed_.push_back(b);
  to_channels_last(model);
}

NITRO_INLINE void LayoutChange::undo() {
  at::NoGradGuard no_grad;
  for (auto& t : changed_) {
    t.set_data(t.contiguous());
    if (t.grad().defined()) t.mutable_grad() = t.grad().contiguous();
  }
  changed_.clear();
}

NITRO_INLINE std::string hex(std::uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

NITRO_INLINE std::uint64_t hash_text(std::string_view text) {
  return io::xxh64(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

NITRO_INLINE std::string choice_lines(const Choice& c, std::string_view name) {
  return ::nitro::detail::concat("candidate ", c.candidate, "\nname ", name, "\nchannels_last ", int(c.channels_last),
                                 "\nfused_optimizer ", int(c.fused_optimizer), "\ncpu_threads ", c.cpu_threads,
                                 "\nmicro_batches ", c.micro_batches, "\n");
}

NITRO_INLINE std::optional<Choice> read_cache(const std::filesystem::path& file, const std::string& key, std::size_t candidates, const std::vector<std::string>& names, bool fusable, std::string& why) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const auto last = text.rfind("check ");
  if (text.size() > 4096 || last == std::string::npos || !text.starts_with("nitro-autotune 1\n")) {
    why = "not a Nitro autotune file";
    return std::nullopt;
  }
  const std::string body = text.substr(0, last);
  if (text.substr(last) != "check " + hex(hash_text(body)) + "\n") {
    why = "its checksum does not match (damaged)";
    return std::nullopt;
  }
  std::istringstream lines(body);
  std::string line;
  std::getline(lines, line);  // the magic
  Choice c;
  std::string name, file_key;
  int fields = 0;
  while (std::getline(lines, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string field = line.substr(0, space), value = line.substr(space + 1);
    try {
      if (field == "key") file_key = value, ++fields;
      else if (field == "candidate") c.candidate = std::stoull(value), ++fields;
      else if (field == "name") name = value, ++fields;
      else if (field == "channels_last") c.channels_last = std::stoi(value) != 0, ++fields;
      else if (field == "fused_optimizer") c.fused_optimizer = std::stoi(value) != 0, ++fields;
      else if (field == "cpu_threads") c.cpu_threads = std::stoi(value), ++fields;
      else if (field == "micro_batches") c.micro_batches = std::stoll(value), ++fields;
    } catch (const std::exception&) {
      why = "the field \"" + field + "\" is not a number";
      return std::nullopt;
    }
  }
  if (fields != 7) {
    why = "fields are missing";
    return std::nullopt;
  }
  if (file_key != hex(hash_text(key))) {
    why = "it was written for another model, batch, machine or version (stale)";
    return std::nullopt;
  }
  if (c.candidate >= candidates || names[c.candidate] != name || c.cpu_threads < 0 || c.micro_batches < 1 ||
      (c.fused_optimizer && !fusable)) {
    why = "its choice is not one of this candidate list (stale)";
    return std::nullopt;
  }
  return c;
}

NITRO_INLINE void write_cache(const std::filesystem::path& file, const std::string& key, const Choice& c, const std::string& name, double samples_per_s, const std::function<void(const std::string&)>& log) {
  try {
    std::filesystem::create_directories(file.parent_path());
    std::string body = ::nitro::detail::concat("nitro-autotune 1\nkey ", hex(hash_text(key)), "\n",
                                               choice_lines(c, name), "samples_per_s ", samples_per_s, "\n");
    body += "check " + hex(hash_text(body)) + "\n";
    io::AtomicFile out{file};
    out.write(body.data(), body.size());
    if (!out.commit()) log("wrote " + file.string() + ", but could not sync its directory");
  } catch (const std::exception& e) {
    log(::nitro::detail::concat("could not write the cache file ", file.string(), " (", e.what(),
                                "); the choice holds for this run only"));
  }
}

NITRO_INLINE c10::Device model_device(torch::nn::Module& model) {
  for (const auto& p : model.parameters()) return p.device();
  return c10::Device(c10::kCPU);
}

NITRO_INLINE std::string optimizer_options(torch::optim::Optimizer& optimizer) {
  std::ostringstream k;
  k << typeid(optimizer).name();
  for (auto& group : optimizer.param_groups()) {
    const auto& o = group.options();
    k << " [" << group.params().size();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o))
      k << " m" << sgd->momentum() << " d" << sgd->dampening() << " w" << sgd->weight_decay() << " n" << sgd->nesterov();
    else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&o))
      k << " b" << std::get<0>(adam->betas()) << ',' << std::get<1>(adam->betas()) << " e" << adam->eps() << " w"
        << adam->weight_decay() << " a" << adam->amsgrad();
    else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&o))
      k << " b" << std::get<0>(adamw->betas()) << ',' << std::get<1>(adamw->betas()) << " e" << adamw->eps() << " w"
        << adamw->weight_decay() << " a" << adamw->amsgrad();
    k << ']';
  }
  return k.str();
}

}  // namespace nitro::tune::detail
