#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"

namespace tessera {

AdamW::AdamW(std::vector<ParamSlot> params, AdamWConfig cfg)
    : params_(std::move(params)), cfg_(cfg) {
  for (const ParamSlot& p : params_) {
    m_.emplace_back(static_cast<size_t>(p.size), 0.0f);
    v_.emplace_back(static_cast<size_t>(p.size), 0.0f);
  }
}

// Sums of squares over fixed chunks added in order: the result does not depend on the thread
// count or schedule, so runs (and resumed runs) are bitwise reproducible.
double AdamW::grad_norm() const { return std::sqrt(grad_sq_sum()); }

void AdamW::scale_grads(float c) {
  for (const ParamSlot& p : params_) cpu::scale_inplace(p.grad, p.size, c);
}

double AdamW::grad_sq_sum() const {
  double total = 0;
  for (const ParamSlot& p : params_) total += p.norm_weight * cpu::sum_squares(p.grad, p.size);
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
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamSlot& p = params_[k];
    cpu::AdamWUpdate u;
    u.grad_scale = grad_scale;
    u.shrink = p.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    u.beta1 = b1;
    u.beta2 = b2;
    u.step_size = step_size;
    u.bc2_sqrt = bc2_sqrt;
    u.eps = eps;
    cpu::adamw_update(u, p.param, p.grad, m_[k].data(), v_[k].data(), p.size);
  }
}

void accumulate_grad(float* dst, const float* src, int64_t n, bool first) {
  if (first) return cpu::copy_floats(dst, src, n);
  cpu::add_inplace(dst, src, n);
}

double lr_at(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  if (warmup > 0 && step < warmup)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress = static_cast<double>(step - warmup) /
                    static_cast<double>(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace tessera
