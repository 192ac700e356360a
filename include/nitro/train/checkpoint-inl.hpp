#pragma once
// The definitions of nitro/train/checkpoint.hpp's non-template functions: included by checkpoint.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/checkpoint.hpp>

namespace nitro::detail {

NITRO_INLINE RngState RngState::capture(const std::vector<at::Tensor>& inputs) {
  RngState s;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cpu = gen.get_state();
  }
#if NITRO_WITH_CUDA
  for (const auto& t : inputs) {
    if (!t.defined() || !t.is_cuda()) continue;
    const auto index = t.device().index();
    bool seen = false;
    for (const auto& [i, _] : s.cuda) seen = seen || i == index;
    if (seen) continue;
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.cuda.emplace_back(index, gen.get_state());
  }
#else
  (void)inputs;
#endif
  return s;
}

NITRO_INLINE void RngState::restore() const {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(cpu);
  }
#if NITRO_WITH_CUDA
  for (const auto& [index, state] : cuda) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
#endif
}

NITRO_INLINE CheckpointContextScope::CheckpointContextScope(CheckpointContext* context) noexcept : previous_(checkpoint_context) {
  checkpoint_context = context;
}

NITRO_INLINE const std::shared_ptr<torch::autograd::Node>& checkpoint_accumulate_marker() {
  struct Marker : torch::autograd::Node {
    torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }
  };
  static const std::shared_ptr<torch::autograd::Node> marker = std::make_shared<Marker>();
  return marker;
}

NITRO_INLINE const ExecInfoMap*& caller_request() {
  static thread_local const ExecInfoMap* request = nullptr;
  return request;
}

NITRO_INLINE RequestScope::RequestScope(const ExecInfoMap* r) : previous(caller_request()) { caller_request() = r; }

NITRO_INLINE std::vector<std::pair<torch::autograd::Node*, torch::autograd::Edge>>& cut_inputs() {
  static thread_local std::vector<std::pair<torch::autograd::Node*, torch::autograd::Edge>> cut;
  return cut;
}

NITRO_INLINE CutInputs::CutInputs(const torch::autograd::edge_list& inputs) : begin(cut_inputs().size()) {
  for (const auto& e : inputs)
    if (e.is_valid()) {
      cut_inputs().emplace_back(e.function.get(), e.function->next_edges()[0]);
      e.function->next_edges()[0] = torch::autograd::Edge{};
    }
}

NITRO_INLINE CutInputs::~CutInputs() {
  auto& cut = cut_inputs();
  for (std::size_t i = begin; i < cut.size(); ++i) cut[i].first->next_edges()[0] = cut[i].second;
  cut.resize(begin);
}

NITRO_INLINE ReconnectEnclosing::ReconnectEnclosing() {
  for (std::size_t i = 0; i < end; ++i) cut_inputs()[i].first->next_edges()[0] = cut_inputs()[i].second;
}

NITRO_INLINE ReconnectEnclosing::~ReconnectEnclosing() {
  for (std::size_t i = 0; i < end; ++i) cut_inputs()[i].first->next_edges()[0] = torch::autograd::Edge{};
}

NITRO_INLINE torch::autograd::variable_list CheckpointFunction::forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state, at::TensorList inputs) {
  std::vector<at::Tensor> args(inputs.begin(), inputs.end());
  state->rng = RngState::capture(args);
  std::vector<at::Tensor> outputs;
  {
    CheckpointContextScope plain(nullptr);
    outputs = state->fn(args);
  }
  ctx->save_for_backward(args);
  ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
  // An output the loss does not use gets an undefined gradient, not zeros: the parameters reached
  // only through it get no .grad at all, as without checkpointing.
  ctx->set_materialize_grads(false);
  return outputs;
}

NITRO_INLINE torch::autograd::variable_list CheckpointFunction::backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
  const auto saved = ctx->get_saved_variables();
  // The engine runs a backward with grad mode on exactly when its caller asked for create_graph. An
  // empty exec info is a plain backward(), which accumulates into every leaf; a torch::autograd::grad
  // or a backward(inputs) fills it with what it asked for, and leaves every other .grad alone.
  const bool create_graph = at::GradMode::is_enabled();
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  const bool accumulate =
      exec_info == nullptr || exec_info->empty() || exec_info->count(checkpoint_accumulate_marker().get()) != 0;
  if (create_graph || !accumulate) return differentiable_backward(*state, saved, grad_outputs, accumulate, exec_info);

  std::vector<at::Tensor> inputs;
  inputs.reserve(saved.size());
  for (const auto& t : saved) inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
  auto outputs = recompute(*state, inputs);
  auto [roots, grads] = roots_of(outputs, grad_outputs);
  // The recomputed outputs are let go before the backward through them: what the graph saved of
  // them lives until the node that reads it has run, as in Python's non-reentrant checkpoint,
  // instead of to the end of this backward (one activation more at the peak, measured by
  // bench/peers' checkpoint workload). The engine call is what torch::autograd::backward makes.
  outputs.clear();
  if (!roots.empty())
    torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                          /*accumulate_grad=*/true);

  torch::autograd::variable_list result;
  result.reserve(inputs.size() + 1);
  result.emplace_back();  // for the state argument
  for (const auto& t : inputs) result.push_back(t.defined() && t.requires_grad() ? t.grad() : at::Tensor{});
  return result;
}

NITRO_INLINE std::pair<torch::autograd::edge_list, std::vector<at::Tensor>> CheckpointFunction::roots_of(const std::vector<at::Tensor>& outputs, const torch::autograd::variable_list& grad_outputs) {
  std::pair<torch::autograd::edge_list, std::vector<at::Tensor>> out;
  for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
      out.first.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
      out.second.push_back(grad_outputs[i]);
    }
  }
  return out;
}

NITRO_INLINE std::vector<at::Tensor> CheckpointFunction::recompute(CheckpointState& state, const std::vector<at::Tensor>& inputs) {
  const auto now = RngState::capture(inputs);
  state.rng.restore();
  AutocastGuard cpu{c10::DeviceType::CPU, state.autocast.cpu_dtype, state.autocast.cpu_enabled};
  AutocastGuard cuda{c10::DeviceType::CUDA, state.autocast.cuda_dtype, state.autocast.cuda_enabled};
  at::AutoGradMode grad(true);
  CheckpointContextScope plain(nullptr);
  auto outputs = state.fn(inputs);
  now.restore();
  return outputs;
}

NITRO_INLINE torch::autograd::variable_list CheckpointFunction::differentiable_backward(CheckpointState& state, const std::vector<at::Tensor>& saved, const torch::autograd::variable_list& grad_outputs, bool accumulate, const std::unordered_map<torch::autograd::Node*, torch::autograd::GraphTask::ExecInfo>* exec_info) {
  using torch::autograd::Edge;
  const bool create_graph = at::GradMode::is_enabled();
  // Each input that requires grad enters as an alias of itself, whose node is where its gradient is
  // captured: an input passed twice, or one computed from another (x and x * 2), then gets the
  // gradient of its own place only, as a detached input would, instead of the sum over its places.
  std::vector<at::Tensor> inputs;
  torch::autograd::edge_list input_edges(saved.size());
  inputs.reserve(saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const auto& t = saved[i];
    if (t.defined() && t.requires_grad()) {
      at::AutoGradMode grad(true);
      inputs.push_back(at::alias(t));
      input_edges[i] = torch::autograd::impl::gradient_edge(inputs.back());
    } else {
      inputs.push_back(t);
    }
  }
  auto outputs = recompute(state, inputs);
  auto [roots, grads] = roots_of(outputs, grad_outputs);
  ReconnectEnclosing enclosing;
  torch::autograd::variable_list result(saved.size() + 1);  // the first for the state argument
  if (roots.empty()) return result;

  // What the recomputed graph reaches other than through the inputs: leaves to accumulate into, or,
  // for a caller that asked for gradients of its own choosing, something it asked for.
  torch::autograd::edge_list leaves;
  {
    std::vector<torch::autograd::Node*> stack;
    std::unordered_set<torch::autograd::Node*> seen;
    const auto visit = [&](const Edge& e) {
      if (!e.is_valid()) return;
      for (const auto& in : input_edges)
        if (in == e) return;
      auto* node = e.function.get();
      if (!seen.insert(node).second) return;
      NITRO_CHECK(accumulate || (exec_info->count(node) == 0 &&
                                 (caller_request() == nullptr || caller_request()->count(node) == 0)),
                  "nitro::checkpoint: torch::autograd::grad (or backward with inputs) asks for the gradient of a "
                  "tensor that a checkpointed function reads without taking it as an input (a parameter of a "
                  "module it calls, or a tensor it captured); the checkpoint returns gradients for its inputs "
                  "only. Pass that tensor to checkpoint::run(fn, inputs...) as an input and use it from there, "
                  "or call backward() without inputs and read .grad, or differentiate without checkpointing "
                  "(checkpoint::Off)");
      if (dynamic_cast<torch::autograd::AccumulateGrad*>(node) != nullptr) {
        if (accumulate) leaves.push_back(e);
        return;
      }
      stack.push_back(node);
    };
    for (const auto& root : roots) visit(root);
    while (!stack.empty()) {
      auto* node = stack.back();
      stack.pop_back();
      for (const auto& e : node->next_edges()) visit(e);
    }
  }
  torch::autograd::edge_list wanted;
  for (const auto& e : input_edges)
    if (e.is_valid()) wanted.push_back(e);
  wanted.insert(wanted.end(), leaves.begin(), leaves.end());
  if (accumulate) wanted.emplace_back(checkpoint_accumulate_marker(), 0);
  // The inputs' alias nodes are cut from what is upstream of them for the engine call: otherwise a
  // leaf both upstream and read inside (a tied weight, an input fn also captures) would get the
  // upstream part of its gradient here and again from the outer engine, and the engine would walk
  // the whole upstream graph. They are reconnected afterwards (create_graph's graph goes through them).
  // (A nested checkpoint's call finds them reconnected: what its function captured of this one's
  // inputs has its gradient carried upstream.)
  CutInputs cut(input_edges);
  // A nested checkpoint's backward sees this engine call's exec info, not the caller's: it checks
  // against the caller's request too.
  RequestScope request(accumulate ? nullptr : (caller_request() != nullptr ? caller_request() : exec_info));
  // With create_graph the recomputed graph is kept: the second-order graph reads what it saved.
  const auto captured = torch::autograd::Engine::get_default_engine().execute(
      roots, grads, /*keep_graph=*/create_graph, create_graph, /*accumulate_grad=*/false, wanted);
  std::size_t k = 0;
  for (std::size_t i = 0; i < input_edges.size(); ++i)
    if (input_edges[i].is_valid()) result[i + 1] = captured[k++];
  // Each leaf's gradient into its .grad, as the engine's call of its accumulator would do, but for the
  // tensor hooks, which the capture has already applied: AccumulateGrad::apply (with the
  // post-accumulate-grad hooks, and grad mode on: a gradient with history keeps it), then the
  // node's post hooks.
  for (const auto& leaf : leaves) {
    const auto& grad = captured[k++];
    if (!grad.defined()) continue;
    auto& node = *leaf.function;
    torch::autograd::variable_list in{grad};
    for (const auto& hook : node.pre_hooks()) in = (*hook)(in);
    auto out = node(torch::autograd::variable_list(in));
    for (const auto& hook : node.post_hooks()) out = (*hook)(out, in);
  }
  return result;
}

}  // namespace nitro::detail

namespace nitro::checkpoint {

NITRO_INLINE std::int64_t Sqrt::segments(std::int64_t layers, const Options&) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(layers)))));
}

}  // namespace nitro::checkpoint
