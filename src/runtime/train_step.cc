#include "runtime/train_step.h"

#include <cstring>

#include "base/check.h"
#include "parallel/recompute.h"

namespace tessera {

namespace {
std::unique_ptr<Graph> maybe_recompute(const Graph& g, RecomputePolicy policy) {
  if (policy == RecomputePolicy::none) return nullptr;
  Result<Graph> r = apply_recompute(g, policy);
  TS_CHECK(r.ok()) << r.status().to_string();
  return std::make_unique<Graph>(std::move(r).value());
}
}  // namespace

TrainStep::TrainStep(const ModelGraph& model, Backend& backend, AdamWConfig opt,
                     RecomputePolicy recompute)
    : model_(model),
      recomputed_(maybe_recompute(model.graph, recompute)),
      exec_(std::make_unique<Executor>(graph(), backend)) {
  const Graph& g = graph();
  TS_CHECK(!g.param_grads().empty()) << "TrainStep needs a graph built in ModelMode::train";
  std::vector<ParamSlot> slots;
  for (ValueId p : g.params()) {
    TS_CHECK(g.type(p).dtype == DType::f32) << "parameters are kept in f32";
    int64_t n = g.type(p).shape.numel();
    // The optimizer reads the gradient where the graph left it; accumulators are made on the
    // second micro-batch only.
    slots.push_back(ParamSlot{g.name_of(p), exec_->data<float>(p),
                              exec_->data<float>(g.param_grads().at(p)), n,
                              g.type(p).shape.rank() >= 2});
  }
  grads_.resize(slots.size());
  opt_ = std::make_unique<AdamW>(std::move(slots), opt);
}

const float* TrainStep::grad(size_t i) const { return opt_->params()[i].grad; }

// The first micro-batch's gradients stay in the arena (no copy); a second one first moves them
// to the accumulators, which the optimizer then reads until apply().
float TrainStep::forward_backward(const int32_t* tokens, const int32_t* targets) {
  const Graph& g = graph();
  std::vector<ParamSlot>& slots = opt_->slots();
  if (accumulated_ == 1) {
    for (size_t i = 0; i < slots.size(); ++i) {
      grads_[i].resize(static_cast<size_t>(slots[i].size));
      accumulate_grad(grads_[i].data(), slots[i].grad, slots[i].size, /*first=*/true);
      slots[i].grad = grads_[i].data();
    }
  }
  exec_->set_input("tokens", tokens);
  exec_->set_input("targets", targets);
  exec_->run();
  if (accumulated_ >= 1) {
    size_t i = 0;
    for (ValueId p : g.params()) {
      accumulate_grad(grads_[i].data(), exec_->data<float>(g.param_grads().at(p)), slots[i].size,
                      /*first=*/false);
      ++i;
    }
  }
  ++accumulated_;
  return *exec_->data<float>(g.loss());
}

double TrainStep::apply(double lr, double clip, int micro_steps) {
  TS_CHECK_EQ(accumulated_, micro_steps);
  if (micro_steps > 1) opt_->scale_grads(1.0f / static_cast<float>(micro_steps));
  const double norm = opt_->grad_norm();
  // Clipping folded into the update: one pass over the gradients fewer.
  const double coef = clip > 0 ? AdamW::clip_coefficient(norm, clip) : 1.0;
  opt_->step(lr, static_cast<float>(coef));
  accumulated_ = 0;
  // The next micro-batch's gradients are read from the arena again.
  const Graph& g = graph();
  size_t i = 0;
  for (ValueId p : g.params()) opt_->slots()[i++].grad = exec_->data<float>(g.param_grads().at(p));
  return norm;
}

}  // namespace tessera
