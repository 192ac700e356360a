#pragma once
// The definitions of nitro/dist/data_parallel.hpp's non-template functions: included by data_parallel.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/dist/data_parallel.hpp>

namespace nitro::dist::detail {

NITRO_INLINE AllReduceMean::AllReduceMean(ProcessGroup group, std::shared_ptr<std::atomic<std::int64_t>> calls) : group_(std::move(group)), calls_(std::move(calls)) {}

NITRO_INLINE c10::intrusive_ptr<c10::ivalue::Future> AllReduceMean::runHook(c10d::GradBucket& bucket) {
  calls_->fetch_add(1, std::memory_order_relaxed);
  at::Tensor& flat = bucket.getBufferRef();
  flat.div_(static_cast<double>(group_.size()));
  std::vector<at::Tensor> tensors{flat};
  c10::intrusive_ptr<c10::ivalue::Future> done;
  try {
    done = group_.group()->allreduce(tensors)->getFuture();
  } catch (...) {
    ::nitro::dist::detail::rethrow_collective("the gradients' all-reduce", group_.rank(), group_.size(), group_.timeout());
  }
  auto out = c10::make_intrusive<c10::ivalue::Future>(done->elementType(), done->devices());
  const int rank = group_.rank(), size = group_.size();
  const auto timeout = group_.timeout();
  done->addCallback([out, rank, size, timeout](c10::ivalue::Future& f) {
    if (!f.hasError()) {
      out->markCompleted(f.value());
      return;
    }
    try {
      std::rethrow_exception(f.exception_ptr());
    } catch (...) {
      try {
        ::nitro::dist::detail::rethrow_collective("the gradients' all-reduce", rank, size, timeout);
      } catch (...) {
        out->setError(std::current_exception());
      }
    }
  });
  return out;
}

NITRO_INLINE at::Tensor AllReduceMean::parseHookResult(const c10::IValue& result) {
  return result.isTensor() ? result.toTensor() : result.toTensorVector().at(0);
}

NITRO_INLINE std::vector<std::string> model_signature(const torch::nn::Module& model) {
  std::vector<std::string> lines;
  const auto describe = [&](std::string_view kind, const std::string& name, const at::Tensor& t) {
    std::ostringstream s;
    s << kind << ' ' << name << ' ' << t.sizes() << ' ' << t.scalar_type();
    lines.push_back(std::move(s).str());
  };
  for (const auto& p : model.named_parameters(/*recurse=*/true)) describe("parameter", p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) describe("buffer", b.key(), b.value());
  return lines;
}

NITRO_INLINE std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) (out += l) += '\n';
  return out;
}

NITRO_INLINE std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string::size_type begin = 0;
  while (begin < text.size()) {
    const auto end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end == std::string::npos ? text.size() : end + 1;
  }
  return lines;
}

}  // namespace nitro::dist::detail

namespace nitro::dist {

NITRO_INLINE DataParallel::DataParallel(const Options& options) : o_(options) {
  NITRO_CHECK(o_.group.has_value(), "dist::DataParallel: Options::group is not set; give the ProcessGroup, e.g. "
              "{.group = nitro::dist::ProcessGroup::from_environment()}");
  NITRO_CHECK(o_.bucket_mib > 0 && o_.bucket_mib <= 1 << 16 && o_.first_bucket_mib > 0 && o_.first_bucket_mib <= o_.bucket_mib,
              "dist::DataParallel: bucket_mib must be in (0, 65536] and first_bucket_mib in (0, bucket_mib], got ",
              o_.bucket_mib, " and ", o_.first_bucket_mib);
}

NITRO_INLINE StateDict DataParallel::state_dict() const {
  StateDict s;
  s.integers["world_size"] = group().size();
  return s;
}

NITRO_INLINE void DataParallel::load_state_dict(const StateDict& s) {
  const std::int64_t saved = s.integer("world_size", "dist::DataParallel's state");
  NITRO_CHECK(saved == group().size(), "dist::DataParallel: the state was saved by a run of ", saved,
              " processes, but this run has ", group().size(), "; resume with the same world size (each rank's "
              "share of the data and the averaged gradients depend on it)");
}

NITRO_INLINE void DataParallel::start(torch::nn::Module& model) {
  const ProcessGroup& g = group();
  std::vector<const void*> seen;  // a parameter shared by two modules is one parameter
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    if (std::find(seen.begin(), seen.end(), p.value().unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(p.value().unsafeGetTensorImpl());
    NITRO_CHECK(g.serves(p.value().device().type()), "dist::DataParallel: parameter ", p.key(), " is on ",
                p.value().device(), ", which this process group has no backend for (Gloo serves CPU tensors; a CUDA "
                "model needs an NCCL group: ProcessGroup::Options::nccl = true)");
    NITRO_CHECK(!p.value().is_sparse(), "dist::DataParallel: parameter ", p.key(), " is sparse; not supported");
    params_.push_back(p.value());
    names_.push_back(p.key());
  }
  NITRO_CHECK(!params_.empty(), "dist::DataParallel: the model has no parameter that requires a gradient");
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    buffers_.push_back(b.value());
    buffer_views_.push_back(b.value().detach());
  }
  compare_models(model);
  // Rank 0's parameters and buffers everywhere (DDP's _sync_module_states: 250 MiB broadcast buckets).
  if (g.size() > 1) {
    std::vector<at::Tensor> all;
    for (const auto& p : model.parameters(/*recurse=*/true)) all.push_back(p.detach());
    for (const auto& b : buffers_) all.push_back(b.detach());
    broadcast(all);
  }
  try {
    c10d::verify_params_across_processes(g.group(), params_, std::nullopt);
  } catch (...) {
    ::nitro::dist::detail::rethrow_collective("comparing the parameters' shapes across ranks", g.rank(), g.size(), g.timeout());
  }
  // As DDP: the first step's one bucket holds everything (find_unused_parameters off), and the
  // Reducer rebuilds the buckets (first_bucket_mib, then bucket_mib) in the order the gradients
  // arrived once that step is done (rebuild_buckets before the second forward, on every rank).
  const auto mib = [](double m) { return static_cast<std::int64_t>(m * 1024.0 * 1024.0); };
  const std::vector<std::size_t> limits =
      o_.find_unused_parameters ? std::vector<std::size_t>{static_cast<std::size_t>(mib(o_.first_bucket_mib)),
                                                           static_cast<std::size_t>(mib(o_.bucket_mib))}
                                : std::vector<std::size_t>{SIZE_MAX};
  auto indices = std::get<0>(
      c10d::compute_bucket_assignment_by_size(params_, limits, std::vector<bool>(params_.size(), false)));
  std::reverse(indices.begin(), indices.end());  // as DDP: the last parameters' gradients come first
  std::unordered_map<std::size_t, std::string> param_names;
  for (std::size_t i = 0; i < names_.size(); ++i) param_names.emplace(i, names_[i]);
  bucket_count_ = indices.size();
  reducer_ = std::make_shared<c10d::Reducer>(
      params_, std::move(indices), g.group(), std::vector<bool>(params_.size(), false), mib(o_.bucket_mib),
      o_.find_unused_parameters, /*gradient_as_bucket_view=*/false, std::move(param_names), mib(o_.first_bucket_mib),
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false, std::vector<std::int64_t>{});
  // The search for unused parameters reports to a logger it does not check for (reducer.cpp).
  if (o_.find_unused_parameters) {
    logger_ = std::make_shared<c10d::Logger>(reducer_);
    reducer_->set_logger(logger_);
  }
  reducer_->register_comm_hook(std::make_unique<detail::AllReduceMean>(g, calls_));
}

NITRO_INLINE void DataParallel::compare_models(const torch::nn::Module& model) {
  const ProcessGroup& g = group();
  if (g.size() == 1) return;
  // The n-th DataParallel this process started: every rank starts its loops in one order (their
  // collectives would not pair up otherwise).
  const std::string key = "dist/model/" + std::to_string(detail::data_parallel_started.fetch_add(1)) + "/";
  const auto mine = detail::model_signature(model);
  auto& store = *g.store();
  std::string verdict = "ok";
  try {
    if (g.rank() == 0) store.set(key + "signature", detail::bytes(detail::join_lines(mine)));
    const auto theirs = detail::split_lines(detail::text(store.get(key + "signature")));
    for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()) && verdict == "ok"; ++i) {
      if (i >= mine.size()) verdict = "its model lacks rank 0's " + theirs[i];
      else if (i >= theirs.size()) verdict = "its model has " + mine[i] + ", which rank 0's lacks";
      else if (mine[i] != theirs[i]) verdict = "its model has " + mine[i] + " where rank 0's has " + theirs[i];
    }
    store.set(key + "verdict/" + std::to_string(g.rank()), detail::bytes(verdict));
    for (int r = 0; r < g.size(); ++r) {
      const std::string v = detail::text(store.get(key + "verdict/" + std::to_string(r)));
      NITRO_CHECK(v == "ok", "dist::DataParallel: the ranks' models differ: rank ", r, " of ", g.size(), ": ", v,
                  "; every rank must build the same model");
    }
  } catch (const Error&) {
    throw;
  } catch (...) {
    ::nitro::dist::detail::rethrow_collective("comparing the models across ranks", g.rank(), g.size(), g.timeout());
  }
}

NITRO_INLINE void DataParallel::broadcast(const std::vector<at::Tensor>& tensors) {
  const ProcessGroup& g = group();
  try {
    c10d::broadcast_coalesced(g.group(), tensors, 250u * 1024u * 1024u, 0);
  } catch (...) {
    ::nitro::dist::detail::rethrow_collective("broadcasting rank 0's parameters and buffers", g.rank(), g.size(), g.timeout());
  }
}

}  // namespace nitro::dist
