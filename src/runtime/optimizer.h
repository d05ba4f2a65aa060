// AdamW with decoupled weight decay, global-norm gradient clipping and a warmup + cosine
// learning-rate schedule. Matches torch.optim.AdamW (1.13): p *= 1 - lr*wd, then
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
//
//   AdamW opt(params, {.lr = 6e-4, .weight_decay = 0.1}, cpu);   // moments in cpu's memory
//   float norm = opt.clip_grad_norm(1.0);   // before the step
//   opt.step(lr);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ir/dtype.h"

namespace tessera {

struct AdamWConfig {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to tensors of rank >= 2 (matrices and embeddings)
};

// One parameter tensor as the optimizer sees it: f32 master weights and the gradient, stored
// as grad_dtype (bf16/f16 gradients of a mixed-precision graph are read widened to f32).
struct ParamSlot {
  std::string name;
  float* param = nullptr;
  float* grad = nullptr;  // grad_dtype elements
  DType grad_dtype = DType::f32;
  int64_t size = 0;
  bool decay = true;
  // The share of this slot's squares the gradient norm counts on this rank: 1 / the number of
  // ranks of the norm's reduction group holding the same elements (tensor-axis replicas).
  double norm_weight = 1.0;
  // A low-precision working copy of these elements (a bf16/f16 graph's parameter), written
  // with the updated weights by every update of the slot; null when there is none.
  void* working = nullptr;
  DType working_dtype = DType::f32;
};

class AdamW {
 public:
  // The slots' pointers are `backend`'s memory (fixed from here on); the moments are its
  // buffers (zero to start) and every pass runs on it: the norm and step() over all slots as
  // one Backend::optimizer_group (one launch each on a device), update(k) slot by slot.
  AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, Backend& backend);
  // Scales gradients so their global L2 norm is at most max_norm (coefficient
  // max_norm / (norm + 1e-6), as torch); returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // The factor clip_grad_norm scales by: min(1, max_norm / (norm + 1e-6)).
  static double clip_coefficient(double norm, double max_norm);
  double grad_norm() const;
  // Sum of squared gradients over the slots, in a fixed order (sharded runs add the sums of
  // all ranks before taking the root), and scaling every gradient by c.
  double grad_sq_sum() const;
  void scale_grads(float c);
  // One AdamW step on gradients times grad_scale (a clipping coefficient folded into the
  // update, the same floats as scale_grads(grad_scale) then step(lr)).
  void step(double lr, float grad_scale = 1.0f);
  // The same step in parts, as a Program's optimizer list runs it: begin_step(lr) once (the
  // step count and bias corrections), then update(k, grad_scale) once for each slot k, in
  // any order.
  void begin_step(double lr);
  void update(size_t k, float grad_scale);
  // update(k, grad_scale) for every slot, as one pass.
  void update_all(float grad_scale);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  const std::vector<ParamSlot>& params() const { return params_; }
  // Counts slot k's squares with weight w in the gradient norm (0: not at all).
  void set_norm_weight(size_t k, double w) { params_.at(k).norm_weight = w; }
  // First and second moments of slot i (params()[i].size floats each, for checkpoints).
  float* m(size_t i) const { return static_cast<float*>(m_[i].data()); }
  float* v(size_t i) const { return static_cast<float*>(v_[i].data()); }
  // Bytes of the moments' buffers.
  int64_t state_bytes() const;
  const AdamWConfig& config() const { return cfg_; }

 private:
  std::vector<ParamSlot> params_;
  AdamWConfig cfg_;
  std::vector<Buffer> m_, v_;
  Backend& backend_;
  std::unique_ptr<OptimizerGroup> group_;  // every slot, for the passes over all of them
  int64_t t_ = 0;
  AdamWUpdate current_update(float grad_scale) const;  // begin_step's values, shrink for decay
  struct StepValues {
    double lr = 0;
    float step_size = 0, bc2_sqrt = 1;
  } cur_;  // of the step begin_step() began
};

// Linear warmup to max_lr over warmup steps, then cosine decay to min_lr at total steps.
double lr_at(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr);

}  // namespace tessera
