#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"

namespace tessera {

AdamW::AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, Backend& backend)
    : params_(std::move(params)), cfg_(cfg), backend_(backend) {
  for (const ParamSlot& p : params_) {
    m_.push_back(backend.allocate(p.size * static_cast<int64_t>(sizeof(float))));
    v_.push_back(backend.allocate(p.size * static_cast<int64_t>(sizeof(float))));
  }
  std::vector<OptimizerTensor> tensors;
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamSlot& p = params_[k];
    tensors.push_back(
        {p.param, p.grad, p.grad_dtype, m(k), v(k), p.size, p.decay, p.working, p.working_dtype});
  }
  group_ = backend.optimizer_group(std::move(tensors));
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < m_.size(); ++i) bytes += m_[i].bytes() + v_[i].bytes();
  return bytes;
}

// Sums of squares over fixed chunks added in order: the result does not depend on the thread
// count or schedule, so runs (and resumed runs) are bitwise reproducible.
double AdamW::grad_norm() const { return std::sqrt(grad_sq_sum()); }

void AdamW::scale_grads(float c) {
  for (const ParamSlot& p : params_) {
    TS_CHECK(p.grad_dtype == DType::f32) << "scale_grads on a " << dtype_name(p.grad_dtype)
                                         << " gradient (accumulate micro-batches in f32)";
    backend_.scale(p.grad, p.size, c);
  }
}

double AdamW::grad_sq_sum() const {
  const std::vector<double> sums = group_->sum_squares();
  double total = 0;
  for (size_t k = 0; k < params_.size(); ++k) total += params_[k].norm_weight * sums[k];
  return total;
}

double AdamW::clip_coefficient(double norm, double max_norm) {
  double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double AdamW::clip_grad_norm(double max_norm) {
  double norm = grad_norm();
  double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) scale_grads(static_cast<float>(coef));
  return norm;
}

void AdamW::step(double lr, float grad_scale) {
  begin_step(lr);
  update_all(grad_scale);
}

void AdamW::begin_step(double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  cur_ = {lr, static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2))};
}

AdamWUpdate AdamW::current_update(float grad_scale) const {
  AdamWUpdate u;
  u.grad_scale = grad_scale;
  u.shrink = static_cast<float>(1.0 - cur_.lr * cfg_.weight_decay);
  u.beta1 = static_cast<float>(cfg_.beta1);
  u.beta2 = static_cast<float>(cfg_.beta2);
  u.step_size = cur_.step_size;
  u.bc2_sqrt = cur_.bc2_sqrt;
  u.eps = static_cast<float>(cfg_.eps);
  return u;
}

void AdamW::update(size_t k, float grad_scale) {
  const ParamSlot& p = params_.at(k);
  AdamWUpdate u = current_update(grad_scale);
  if (!p.decay) u.shrink = 1.0f;
  backend_.adamw(u, p.param, p.grad, p.grad_dtype, m(k), v(k), p.size);
  if (p.working != nullptr)
    backend_.convert(p.param, DType::f32, p.working, p.working_dtype, p.size);
}

void AdamW::update_all(float grad_scale) { group_->adamw(current_update(grad_scale)); }

double lr_at(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  if (warmup > 0 && step < warmup)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress = static_cast<double>(step - warmup) /
                    static_cast<double>(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace tessera
