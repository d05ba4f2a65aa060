#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"
#include "base/check.h"

namespace tessera::cpu {

namespace {

// Elements per thread below which a pass runs on one thread.
constexpr int64_t kGrain = 16384;

template <typename F>
void parallel_map(int64_t n, F f) {
  parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}

// Strides of `in` broadcast against `out` (0 where `in` is broadcast), aligned to out's rank.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> s(static_cast<size_t>(out.rank()), 0);
  int64_t stride = 1;
  for (int i = in.rank() - 1; i >= 0; --i) {
    int o = out.rank() - in.rank() + i;
    s[static_cast<size_t>(o)] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
  return s;
}

// Calls f(out_index, in_offset) for every element of `out`.
template <typename F>
void for_each_broadcast(const Shape& in, const Shape& out, F f) {
  std::vector<int64_t> st = broadcast_strides(in, out);
  int r = out.rank();
  parallel_for(out.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      int64_t rem = i, off = 0;
      for (int d = r - 1; d >= 0; --d) {
        int64_t dim = out[d];
        off += (rem % dim) * st[static_cast<size_t>(d)];
        rem /= dim;
      }
      f(i, off);
    }
  });
}

bool is_suffix(const Shape& small, const Shape& big) {
  if (small.rank() > big.rank()) return false;
  for (int i = 1; i <= small.rank(); ++i)
    if (small[-i] != big[-i]) return false;
  return true;
}

template <typename Op>
void binary_impl(const Args& a, Op op) {
  const float *x = a.fin(0), *y = a.fin(1);
  float* z = a.fout(0);
  const Shape &sx = a.in_shape(0), &sy = a.in_shape(1), &sz = a.out_shape(0);
  int64_t n = sz.numel(), nx = sx.numel(), ny = sy.numel();
  if (nx == n && ny == n) {
    parallel_map(n, [&](int64_t i) { z[i] = op(x[i], y[i]); });
  } else if (nx == n && is_suffix(sy, sz)) {
    parallel_for(n / ny, std::max<int64_t>(1, kGrain / ny), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
#pragma omp simd
        for (int64_t j = 0; j < ny; ++j) z[r * ny + j] = op(x[r * ny + j], y[j]);
    });
  } else if (ny == n && is_suffix(sx, sz)) {
    parallel_for(n / nx, std::max<int64_t>(1, kGrain / nx), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
#pragma omp simd
        for (int64_t j = 0; j < nx; ++j) z[r * nx + j] = op(x[j], y[r * nx + j]);
    });
  } else {
    std::vector<int64_t> stx = broadcast_strides(sx, sz), sty = broadcast_strides(sy, sz);
    int rank = sz.rank();
    parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t rem = i, ox = 0, oy = 0;
        for (int d = rank - 1; d >= 0; --d) {
          int64_t c = rem % sz[d];
          rem /= sz[d];
          ox += c * stx[static_cast<size_t>(d)];
          oy += c * sty[static_cast<size_t>(d)];
        }
        z[i] = op(x[ox], y[oy]);
      }
    });
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

}  // namespace

void fill(const Args& a) {
  if (a.out_types[0].dtype == DType::i32) {
    int32_t* z = static_cast<int32_t*>(a.out[0]);
    int32_t v = static_cast<int32_t>(a.attr<FillAttrs>().value);
    return parallel_map(a.out_shape(0).numel(), [&](int64_t i) { z[i] = v; });
  }
  float* z = a.fout(0);
  float v = static_cast<float>(a.attr<FillAttrs>().value);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) { z[i] = v; });
}

void binary(OpKind op, const Args& a) {
  switch (op) {
    case OpKind::add:
      return binary_impl(a, [](float x, float y) { return x + y; });
    case OpKind::sub:
      return binary_impl(a, [](float x, float y) { return x - y; });
    case OpKind::mul:
      return binary_impl(a, [](float x, float y) { return x * y; });
    case OpKind::div:
      return binary_impl(a, [](float x, float y) { return x / y; });
    default:
      TS_CHECK(false) << "not a binary op: " << op_name(op);
  }
}

void unary(OpKind op, const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t n = a.out_shape(0).numel();
  const auto* scalar = std::get_if<ScalarAttrs>(&a.attrs);  // scale, add_scalar
  float s = scalar != nullptr ? static_cast<float>(scalar->value) : 0.0f;
  switch (op) {
    case OpKind::scale:
      return parallel_map(n, [&](int64_t i) { y[i] = x[i] * s; });
    case OpKind::add_scalar:
      return parallel_map(n, [&](int64_t i) { y[i] = x[i] + s; });
    case OpKind::exp:
      return parallel_map(n, [&](int64_t i) { y[i] = std::exp(x[i]); });
    case OpKind::log:
      return parallel_map(n, [&](int64_t i) { y[i] = std::log(x[i]); });
    case OpKind::sqrt:
      return parallel_map(n, [&](int64_t i) { y[i] = std::sqrt(x[i]); });
    case OpKind::rsqrt:
      return parallel_map(n, [&](int64_t i) { y[i] = 1.0f / std::sqrt(x[i]); });
    case OpKind::tanh:
      return parallel_map(n, [&](int64_t i) { y[i] = std::tanh(x[i]); });
    case OpKind::gelu:
      return parallel_map(n, [&](int64_t i) { y[i] = gelu_fast(x[i]); });
    case OpKind::silu:
      return parallel_map(n, [&](int64_t i) { y[i] = x[i] * sigmoid(x[i]); });
    case OpKind::relu:
      return parallel_map(n, [&](int64_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
    default:
      TS_CHECK(false) << "not a unary op: " << op_name(op);
  }
}

void gelu_grad(const Args& a) {
  const float *x = a.fin(0), *dy = a.fin(1);
  float* dx = a.fout(0);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) { dx[i] = dy[i] * gelu_grad_fast(x[i]); });
}

void silu_grad(const Args& a) {
  const float *x = a.fin(0), *dy = a.fin(1);
  float* dx = a.fout(0);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) {
    float s = sigmoid(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  });
}

void relu_grad(const Args& a) {
  const float *x = a.fin(0), *dy = a.fin(1);
  float* dx = a.fout(0);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; });
}

void swiglu(const Args& a) {
  const float *g = a.fin(0), *u = a.fin(1);
  float* y = a.fout(0);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) { y[i] = g[i] * sigmoid(g[i]) * u[i]; });
}

void swiglu_grad(const Args& a) {
  const float *g = a.fin(0), *u = a.fin(1), *dy = a.fin(2);
  float *dg = a.fout(0), *du = a.fout(1);
  parallel_map(a.out_shape(0).numel(), [&](int64_t i) {
    float s = sigmoid(g[i]);
    du[i] = dy[i] * g[i] * s;
    dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  });
}

void broadcast_to(const Args& a) {
  const float* x = a.fin(0);
  float* y = a.fout(0);
  for_each_broadcast(a.in_shape(0), a.out_shape(0), [&](int64_t i, int64_t off) { y[i] = x[off]; });
}

// Registers this file's kernels (cpu_backend.cc builds the table once).
void register_elementwise_kernels(KernelTable& t) {
  t.add(OpKind::fill, [](OpKind, const Args& a) { fill(a); });
  for (OpKind op : {OpKind::add, OpKind::sub, OpKind::mul, OpKind::div}) t.add(op, binary);
  for (OpKind op : {OpKind::scale, OpKind::add_scalar, OpKind::exp, OpKind::log, OpKind::sqrt,
                    OpKind::rsqrt, OpKind::tanh, OpKind::gelu, OpKind::silu, OpKind::relu})
    t.add(op, unary);
  t.add(OpKind::gelu_grad, [](OpKind, const Args& a) { gelu_grad(a); });
  t.add(OpKind::silu_grad, [](OpKind, const Args& a) { silu_grad(a); });
  t.add(OpKind::relu_grad, [](OpKind, const Args& a) { relu_grad(a); });
  t.add(OpKind::swiglu, [](OpKind, const Args& a) { swiglu(a); });
  t.add(OpKind::swiglu_grad, [](OpKind, const Args& a) { swiglu_grad(a); });
  t.add(OpKind::broadcast_to, [](OpKind, const Args& a) { broadcast_to(a); });
}

}  // namespace tessera::cpu
