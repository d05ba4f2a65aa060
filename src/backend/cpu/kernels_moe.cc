// Mixture-of-experts routing kernels (ir/ops_moe.cc): top-k, slot assignment, dispatch into the
// experts' buffer and the weighted combine back, with their gradients.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "ir/top_k_row.h"

namespace tessera::cpu {

namespace {

int32_t* iout(const Args& a, int i) { return static_cast<int32_t*>(a.out[static_cast<size_t>(i)]); }

// Per row of n: the k largest in decreasing order (ir/top_k_row.h).
void top_k(const Args& a) {
  const int64_t k = a.attr<TopKAttrs>().k, n = a.in_shape(0)[-1];
  const int64_t rows = a.in_shape(0).numel() / n;
  const float* x = a.fin(0);
  float* values = a.fout(0);
  int32_t* idx = iout(a, 1);
  parallel_for(rows, std::max<int64_t>(1, 4096 / n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) top_k_row(x + r * n, n, k, values + r * k, idx + r * k);
  });
}

void top_k_grad(const Args& a) {
  const TopKAttrs& t = a.attr<TopKAttrs>();
  const int64_t rows = a.in_shape(0).numel() / t.k;
  const float* dv = a.fin(0);
  const int32_t* idx = a.iin(1);
  float* dx = a.fout(0);
  std::memset(dx, 0, static_cast<size_t>(rows * t.n) * sizeof(float));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < t.k; ++j) dx[r * t.n + idx[r * t.k + j]] += dv[r * t.k + j];
}

// Choice-major: every token's first choice takes a position before any second choice.
void moe_slots(const Args& a) {
  const MoeAttrs& m = a.attr<MoeAttrs>();
  const int64_t n = a.in_shape(0)[0], k = a.in_shape(0)[1];
  const int32_t* idx = a.iin(0);
  int32_t* slots = iout(a, 0);
  std::vector<int64_t> used(static_cast<size_t>(m.experts), 0);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t e = idx[t * k + j];
      int64_t& u = used[static_cast<size_t>(e)];
      slots[t * k + j] = u < m.capacity ? static_cast<int32_t>(e * m.capacity + u) : -1;
      if (u < m.capacity) ++u;
    }
}

void moe_dispatch(const Args& a) {
  const int64_t n = a.in_shape(1)[0], k = a.in_shape(1)[1], d = a.in_shape(0)[1];
  const float* x = a.fin(0);
  const int32_t* slots = a.iin(1);
  const float* w = a.num_inputs() == 3 ? a.fin(2) : nullptr;
  float* buf = a.fout(0);
  std::memset(buf, 0, static_cast<size_t>(a.out_shape(0).numel()) * sizeof(float));
  parallel_for(n, std::max<int64_t>(1, 4096 / (k * d)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = slots[t * k + j];
        if (s < 0) continue;
        const float c = w != nullptr ? w[t * k + j] : 1.0f;
        for (int64_t i = 0; i < d; ++i) buf[s * d + i] = c * x[t * d + i];
      }
  });
}

void moe_combine(const Args& a) {
  const int64_t n = a.in_shape(1)[0], k = a.in_shape(1)[1], d = a.in_shape(0)[2];
  const float* y = a.fin(0);
  const int32_t* slots = a.iin(1);
  const float* w = a.num_inputs() == 3 ? a.fin(2) : nullptr;
  float* out = a.fout(0);
  parallel_for(n, std::max<int64_t>(1, 4096 / (k * d)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float* o = out + t * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = slots[t * k + j];
        if (s < 0) continue;
        const float c = w != nullptr ? w[t * k + j] : 1.0f;
        for (int64_t i = 0; i < d; ++i) o[i] += c * y[s * d + i];
      }
    }
  });
}

void moe_combine_grad(const Args& a) {
  const int64_t n = a.in_shape(2)[0], k = a.in_shape(2)[1], d = a.in_shape(0)[1];
  const float* x = a.fin(0);
  const float* y = a.fin(1);
  const int32_t* slots = a.iin(2);
  float* dw = a.fout(0);
  parallel_for(n, std::max<int64_t>(1, 4096 / (k * d)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = slots[t * k + j];
        double dot = 0;
        if (s >= 0)
          for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(x[t * d + i]) * y[s * d + i];
        dw[t * k + j] = static_cast<float>(dot);
      }
  });
}

}  // namespace

void register_moe_kernels(KernelTable& t) {
  t.add(OpKind::top_k, [](OpKind, const Args& a) { top_k(a); });
  t.add(OpKind::top_k_grad, [](OpKind, const Args& a) { top_k_grad(a); });
  t.add(OpKind::moe_slots, [](OpKind, const Args& a) { moe_slots(a); });
  t.add(OpKind::moe_dispatch, [](OpKind, const Args& a) { moe_dispatch(a); });
  t.add(OpKind::moe_combine, [](OpKind, const Args& a) { moe_combine(a); });
  t.add(OpKind::moe_combine_grad, [](OpKind, const Args& a) { moe_combine_grad(a); });
}

}  // namespace tessera::cpu
