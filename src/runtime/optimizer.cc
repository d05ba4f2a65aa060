#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "base/check.h"

namespace tessera {

namespace {

// A bf16/f16 gradient is read in chunks widened into this buffer (f32 needs none).
constexpr int64_t kWidenChunk = int64_t{1} << 16;

// Calls f(offset, f32 pointer, count) over n elements of dtype dt at x, widened chunk by chunk.
template <typename F>
void widened_chunks(const void* x, DType dt, int64_t n, F f) {
  if (dt == DType::f32) return f(0, static_cast<const float*>(x), n);
  std::vector<float> buf(static_cast<size_t>(std::min(n, kWidenChunk)));
  const int64_t width = static_cast<int64_t>(dtype_size(dt));
  for (int64_t at = 0; at < n; at += kWidenChunk) {
    const int64_t k = std::min(kWidenChunk, n - at);
    convert_elements(static_cast<const char*>(x) + at * width, dt, buf.data(), DType::f32, k);
    f(at, buf.data(), k);
  }
}

}  // namespace

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
    TS_CHECK(p.grad_dtype == DType::f32) << "scale_grads on a " << dtype_name(p.grad_dtype)
                                         << " gradient (accumulate micro-batches in f32)";
    cpu::scale_inplace(p.grad, p.size, c);
  }
}

double AdamW::grad_sq_sum() const {
  double total = 0;
  for (const ParamSlot& p : params_) {
    double sum = 0;
    widened_chunks(p.grad, p.grad_dtype, p.size,
                   [&](int64_t, const float* g, int64_t n) { sum += cpu::sum_squares(g, n); });
    total += p.norm_weight * sum;
  }
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
  for (size_t k = 0; k < params_.size(); ++k) update(k, grad_scale);
}

void AdamW::begin_step(double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  cur_ = {lr, static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2))};
}

void AdamW::update(size_t k, float grad_scale) {
  const ParamSlot& p = params_.at(k);
  cpu::AdamWUpdate u;
  u.grad_scale = grad_scale;
  u.shrink = p.decay ? static_cast<float>(1.0 - cur_.lr * cfg_.weight_decay) : 1.0f;
  u.beta1 = static_cast<float>(cfg_.beta1);
  u.beta2 = static_cast<float>(cfg_.beta2);
  u.step_size = cur_.step_size;
  u.bc2_sqrt = cur_.bc2_sqrt;
  u.eps = static_cast<float>(cfg_.eps);
  widened_chunks(p.grad, p.grad_dtype, p.size, [&](int64_t at, const float* g, int64_t n) {
    cpu::adamw_update(u, p.param + at, g, m_[k].data() + at, v_[k].data() + at, n);
  });
}

void accumulate_grad(float* dst, const float* src, int64_t n, bool first) {
  if (first) return cpu::copy_floats(dst, src, n);
  cpu::add_inplace(dst, src, n);
}

void accumulate_grad(float* dst, const void* src, DType src_dtype, int64_t n, bool first) {
  if (src_dtype == DType::f32)
    return accumulate_grad(dst, static_cast<const float*>(src), n, first);
  if (first) return convert_elements(src, src_dtype, dst, DType::f32, n);
  widened_chunks(src, src_dtype, n,
                 [&](int64_t at, const float* g, int64_t k) { cpu::add_inplace(dst + at, g, k); });
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
