#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
  for (const ParamSlot& p : params_) {
#pragma omp parallel for if (p.size > 65536)
    for (int64_t i = 0; i < p.size; ++i) p.grad[i] *= c;
  }
}

double AdamW::grad_sq_sum() const {
  constexpr int64_t kChunk = 1 << 15;
  double total = 0;
  for (const ParamSlot& p : params_) {
    int64_t chunks = (p.size + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      for (int64_t i = c * kChunk; i < std::min(p.size, (c + 1) * kChunk); ++i)
        s += static_cast<double>(p.grad[i]) * p.grad[i];
      partial[static_cast<size_t>(c)] = s;
    }
    for (double s : partial) total += s;
  }
  return total;
}

double AdamW::clip_grad_norm(double max_norm) {
  double norm = grad_norm();
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) scale_grads(static_cast<float>(coef));
  return norm;
}

void AdamW::step(double lr) {
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamSlot& p = params_[k];
    const float shrink = p.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    float* m = m_[k].data();
    float* v = v_[k].data();
#pragma omp parallel for if (p.size > 65536)
    for (int64_t i = 0; i < p.size; ++i) {
      float g = p.grad[i];
      p.param[i] *= shrink;
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      p.param[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }
}

void accumulate_grad(float* dst, const float* src, int64_t n, bool first) {
  if (first) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#pragma omp parallel for if (n > 65536)
  for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
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
