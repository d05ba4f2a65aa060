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
    grads_.emplace_back(static_cast<size_t>(n), 0.0f);
    slots.push_back(ParamSlot{g.name_of(p), exec_->data<float>(p), grads_.back().data(), n,
                              g.type(p).shape.rank() >= 2});
  }
  opt_ = std::make_unique<AdamW>(std::move(slots), opt);
}

float TrainStep::forward_backward(const int32_t* tokens, const int32_t* targets) {
  exec_->set_input("tokens", tokens);
  exec_->set_input("targets", targets);
  exec_->run();
  const Graph& g = graph();
  size_t i = 0;
  for (ValueId p : g.params()) {
    std::vector<float>& dst = grads_[i++];
    accumulate_grad(dst.data(), exec_->data<float>(g.param_grads().at(p)),
                    static_cast<int64_t>(dst.size()), accumulated_ == 0);
  }
  ++accumulated_;
  return *exec_->data<float>(g.loss());
}

double TrainStep::apply(double lr, double clip, int micro_steps) {
  TS_CHECK_EQ(accumulated_, micro_steps);
  if (micro_steps > 1) opt_->scale_grads(1.0f / static_cast<float>(micro_steps));
  double norm = clip > 0 ? opt_->clip_grad_norm(clip) : opt_->grad_norm();
  opt_->step(lr);
  accumulated_ = 0;
  return norm;
}

}  // namespace tessera
