// Elementwise kernels: fill, the binary ops with numpy broadcasting, the unary ops, the
// activation gradients, broadcast_to and dtype conversion. One thread per element with a grid
// stride; broadcast operands are read through per-dimension strides (0 where broadcast). The
// binary and unary ops and the activation gradients read and write bf16/f16 as stored
// (f32 arithmetic, one rounding of the result).
#include <initializer_list>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/storage.cuh"
#include "base/check.h"

namespace tessera::cuda {

namespace {

constexpr int kMaxRank = 8;

// Strides of an operand broadcast against the output, aligned to the output's rank.
struct Strides {
  int64_t out_dim[kMaxRank];
  int64_t x[kMaxRank], y[kMaxRank];
  int rank = 0;
};

void broadcast_strides(const Shape& in, const Shape& out, int64_t* s) {
  int64_t stride = 1;
  for (int d = 0; d < out.rank(); ++d) s[d] = 0;
  for (int i = in.rank() - 1; i >= 0; --i) {
    s[out.rank() - in.rank() + i] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
}

Strides strides_of(const Shape& x, const Shape& y, const Shape& out) {
  TS_CHECK(out.rank() <= kMaxRank)
      << "rank " << out.rank() << " is over the CUDA kernels' " << kMaxRank;
  Strides s;
  s.rank = out.rank();
  for (int d = 0; d < out.rank(); ++d) s.out_dim[d] = out[d];
  broadcast_strides(x, out, s.x);
  broadcast_strides(y, out, s.y);
  // Merge each dim into the next outer one where both operands walk them as one (contiguous,
  // or both broadcast): a bias add over [B, T, C] + [C] indexes as [B*T, C].
  int r = 0;
  for (int d = 1; d < s.rank; ++d) {
    const bool merge = s.x[r] == s.x[d] * s.out_dim[d] && s.y[r] == s.y[d] * s.out_dim[d];
    if (merge) {
      s.out_dim[r] *= s.out_dim[d];
      s.x[r] = s.x[d];
      s.y[r] = s.y[d];
    } else {
      ++r;
      s.out_dim[r] = s.out_dim[d];
      s.x[r] = s.x[d];
      s.y[r] = s.y[d];
    }
  }
  if (s.rank > 0) s.rank = r + 1;
  return s;
}

// 32-bit index arithmetic (far cheaper divisions) when every index of a launch fits.
bool fits_32(int64_t n) { return n < (int64_t{1} << 31); }

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// op on each pair of elements of two packs.
template <typename T, typename Op>
__device__ Pack<T> pack_op(const Pack<T>& a, const Pack<T>& b, Op op) {
  Pack<T> c;
#pragma unroll
  for (int e = 0; e < Pack<T>::kN; ++e) c.v[e] = from_f32<T>(op(as_f32(a.v[e]), as_f32(b.v[e])));
  return c;
}

template <typename T, typename Op>
__global__ void binary_packs(const Pack<T>* x, const Pack<T>* y, Pack<T>* z, int64_t n, Op op) {
  GRID_STRIDE(i, n) z[i] = pack_op(x[i], y[i], op);
}

// Broadcast in packs: both operands walk the innermost dim contiguously (a bias add).
template <typename T, typename Op>
__global__ void binary_bcast_packs(const Pack<T>* x, const Pack<T>* y, Pack<T>* z, int64_t n,
                                   Strides s, Op op) {
  GRID_STRIDE(i, n) {
    int32_t rem = static_cast<int32_t>(i), ox = 0, oy = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const int32_t dim = static_cast<int32_t>(s.out_dim[d]), c = rem % dim;
      rem /= dim;
      ox += c * static_cast<int32_t>(s.x[d]);
      oy += c * static_cast<int32_t>(s.y[d]);
    }
    z[i] = pack_op(x[ox], y[oy], op);
  }
}

template <typename T, typename Op>
__global__ void binary_same(const T* x, const T* y, T* z, int64_t n, Op op) {
  GRID_STRIDE(i, n) z[i] = from_f32<T>(op(as_f32(x[i]), as_f32(y[i])));
}

template <typename T, typename I, typename Op>
__global__ void binary_bcast(const T* x, const T* y, T* z, int64_t n, Strides s, Op op) {
  GRID_STRIDE(i, n) {
    I rem = static_cast<I>(i), ox = 0, oy = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const I dim = static_cast<I>(s.out_dim[d]), c = rem % dim;
      rem /= dim;
      ox += c * static_cast<I>(s.x[d]);
      oy += c * static_cast<I>(s.y[d]);
    }
    z[i] = from_f32<T>(op(as_f32(x[ox]), as_f32(y[oy])));
  }
}

template <typename T, typename Op>
void binary_typed(const Args& a, Op op) {
  const Shape &sx = a.in_shape(0), &sy = a.in_shape(1), &sz = a.out_shape(0);
  const int64_t n = sz.numel();
  const T *x = static_cast<const T*>(a.in[0]), *y = static_cast<const T*>(a.in[1]);
  T* z = static_cast<T*>(a.out[0]);
  using P = Pack<T>;
  if (sx == sz && sy == sz) {
    if (packs_fit<T>(n, {x, y, z}))
      binary_packs<<<blocks_for(n / P::kN), 256, 0, a.stream>>>(
          reinterpret_cast<const P*>(x), reinterpret_cast<const P*>(y), reinterpret_cast<P*>(z),
          n / P::kN, op);
    else
      binary_same<<<blocks_for(n), 256, 0, a.stream>>>(x, y, z, n, op);
  } else {
    Strides st = strides_of(sx, sy, sz);
    const int last = st.rank - 1;
    if (last >= 0 && st.x[last] == 1 && st.y[last] == 1 && fits_32(n) &&
        packs_fit<T>(st.out_dim[last], {x, y, z})) {
      st.out_dim[last] /= P::kN;
      for (int d = 0; d < last; ++d) {
        st.x[d] /= P::kN;
        st.y[d] /= P::kN;
      }
      binary_bcast_packs<<<blocks_for(n / P::kN), 256, 0, a.stream>>>(
          reinterpret_cast<const P*>(x), reinterpret_cast<const P*>(y), reinterpret_cast<P*>(z),
          n / P::kN, st, op);
    } else if (fits_32(n))
      binary_bcast<T, int32_t><<<blocks_for(n), 256, 0, a.stream>>>(x, y, z, n, st, op);
    else
      binary_bcast<T, int64_t><<<blocks_for(n), 256, 0, a.stream>>>(x, y, z, n, st, op);
  }
  TS_CUDA_LAUNCH();
}

template <typename Op>
void binary_impl(const Args& a, Op op) {
  if (a.out_shape(0).numel() == 0) return;
  // The IR gives both inputs the output's dtype.
  with_storage(a.out_types[0].dtype,
               [&](auto* tag) { binary_typed<std::remove_pointer_t<decltype(tag)>>(a, op); });
}

struct Add {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct Sub {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct Mul {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct Div {
  __device__ float operator()(float x, float y) const { return x / y; }
};

void binary(OpKind op, const Args& a) {
  switch (op) {
    case OpKind::add:
      return binary_impl(a, Add{});
    case OpKind::sub:
      return binary_impl(a, Sub{});
    case OpKind::mul:
      return binary_impl(a, Mul{});
    case OpKind::div:
      return binary_impl(a, Div{});
    default:
      TS_CHECK(false) << "not a binary op: " << op_name(op);
  }
}

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ float unary_value(OpKind op, float v, float s) {
  float r = 0;
  switch (op) {
    case OpKind::scale:
      r = v * s;
      break;
    case OpKind::add_scalar:
      r = v + s;
      break;
    case OpKind::exp:
      r = expf(v);
      break;
    case OpKind::log:
      r = logf(v);
      break;
    case OpKind::sqrt:
      r = sqrtf(v);
      break;
    case OpKind::rsqrt:
      r = 1.0f / sqrtf(v);
      break;
    case OpKind::tanh:
      r = tanhf(v);
      break;
    case OpKind::gelu:
      r = gelu(v);
      break;
    case OpKind::silu:
      r = v * sigmoid(v);
      break;
    case OpKind::relu:
      r = v > 0.0f ? v : 0.0f;
      break;
    default:
      r = __int_as_float(0x7fc00000);  // not a unary op: NaN
  }
  return r;
}

template <typename T>
__global__ void unary_kernel(OpKind op, const T* x, T* y, int64_t n, float s) {
  GRID_STRIDE(i, n) y[i] = from_f32<T>(unary_value(op, as_f32(x[i]), s));
}

template <typename T>
__global__ void unary_packs(OpKind op, const Pack<T>* x, Pack<T>* y, int64_t n, float s) {
  GRID_STRIDE(i, n) {
    const Pack<T> a = x[i];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < Pack<T>::kN; ++e) r.v[e] = from_f32<T>(unary_value(op, as_f32(a.v[e]), s));
    y[i] = r;
  }
}

void unary(OpKind op, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  const auto* scalar = std::get_if<ScalarAttrs>(&a.attrs);  // scale, add_scalar
  const float sc = scalar != nullptr ? static_cast<float>(scalar->value) : 0.0f;
  with_storage(a.out_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = Pack<T>;
    if (packs_fit<T>(n, {a.in[0], a.out[0]}))
      unary_packs<<<blocks_for(n / P::kN), 256, 0, a.stream>>>(
          op, static_cast<const P*>(a.in[0]), static_cast<P*>(a.out[0]), n / P::kN, sc);
    else
      unary_kernel<<<blocks_for(n), 256, 0, a.stream>>>(op, static_cast<const T*>(a.in[0]),
                                                        static_cast<T*>(a.out[0]), n, sc);
  });
  TS_CUDA_LAUNCH();
}

__global__ void fill_f32(float* y, int64_t n, float v) { GRID_STRIDE(i, n) y[i] = v; }
__global__ void fill_i32(int32_t* y, int64_t n, int32_t v) { GRID_STRIDE(i, n) y[i] = v; }

void fill(OpKind, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  if (a.out_types[0].dtype == DType::i32) {
    fill_i32<<<blocks_for(n), 256, 0, a.stream>>>(static_cast<int32_t*>(a.out[0]), n,
                                                  static_cast<int32_t>(a.attr<FillAttrs>().value));
  } else {
    fill_f32<<<blocks_for(n), 256, 0, a.stream>>>(a.fout(0), n,
                                                  static_cast<float>(a.attr<FillAttrs>().value));
  }
  TS_CUDA_LAUNCH();
}

// gelu_grad / silu_grad / relu_grad: dx = dy * f'(x). swiglu: y = silu(g) * u. swiglu_grad: dg, du.
__device__ float act_grad_value(OpKind op, float v, float d) {
  if (op == OpKind::gelu_grad) return d * gelu_grad(v);
  if (op == OpKind::relu_grad) return v > 0.0f ? d : 0.0f;
  const float s = sigmoid(v);
  return d * s * (1.0f + v * (1.0f - s));
}

template <typename T>
__global__ void act_grad(OpKind op, const T* x, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = from_f32<T>(act_grad_value(op, as_f32(x[i]), as_f32(dy[i])));
}

template <typename T>
__global__ void act_grad_packs(OpKind op, const Pack<T>* x, const Pack<T>* dy, Pack<T>* dx,
                               int64_t n) {
  GRID_STRIDE(i, n) {
    const Pack<T> a = x[i], d = dy[i];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < Pack<T>::kN; ++e)
      r.v[e] = from_f32<T>(act_grad_value(op, as_f32(a.v[e]), as_f32(d.v[e])));
    dx[i] = r;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, float* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

__global__ void swiglu_grad_kernel(const float* g, const float* u, const float* dy, float* dg,
                                   float* du, int64_t n) {
  GRID_STRIDE(i, n) {
    const float s = sigmoid(g[i]);
    du[i] = dy[i] * g[i] * s;
    dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

void activation_grad(OpKind op, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  with_storage(a.out_types[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = Pack<T>;
    if (packs_fit<T>(n, {a.in[0], a.in[1], a.out[0]}))
      act_grad_packs<<<blocks_for(n / P::kN), 256, 0, a.stream>>>(
          op, static_cast<const P*>(a.in[0]), static_cast<const P*>(a.in[1]),
          static_cast<P*>(a.out[0]), n / P::kN);
    else
      act_grad<<<blocks_for(n), 256, 0, a.stream>>>(op, static_cast<const T*>(a.in[0]),
                                                    static_cast<const T*>(a.in[1]),
                                                    static_cast<T*>(a.out[0]), n);
  });
  TS_CUDA_LAUNCH();
}

void swiglu(OpKind, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  swiglu_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fin(1), a.fout(0), n);
  TS_CUDA_LAUNCH();
}

void swiglu_grad(OpKind, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  swiglu_grad_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fin(1), a.fin(2), a.fout(0),
                                                          a.fout(1), n);
  TS_CUDA_LAUNCH();
}

template <typename I>
__global__ void broadcast_kernel(const float* x, float* y, int64_t n, Strides s) {
  GRID_STRIDE(i, n) {
    I rem = static_cast<I>(i), off = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const I dim = static_cast<I>(s.out_dim[d]);
      off += (rem % dim) * static_cast<I>(s.x[d]);
      rem /= dim;
    }
    y[i] = x[off];
  }
}

void broadcast_to(OpKind, const Args& a) {
  const int64_t n = a.out_shape(0).numel();
  if (n == 0) return;
  const Strides st = strides_of(a.in_shape(0), a.in_shape(0), a.out_shape(0));
  if (fits_32(n))
    broadcast_kernel<int32_t><<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fout(0), n, st);
  else
    broadcast_kernel<int64_t><<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fout(0), n, st);
  TS_CUDA_LAUNCH();
}

__device__ float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      return;
    case DType::f16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      return;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

__global__ void convert_kernel(const void* src, DType from, void* dst, DType to, int64_t n) {
  GRID_STRIDE(i, n) store(dst, to, i, load(src, from, i));
}

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (from == to) {
    TS_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n * dtype_size(from)),
                            cudaMemcpyDeviceToDevice, stream));
    return;
  }
  TS_CHECK(from != DType::i32 && to != DType::i32) << "cannot convert i32 to/from float";
  convert_kernel<<<blocks_for(n), 256, 0, stream>>>(src, from, dst, to, n);
  TS_CUDA_LAUNCH();
}

void register_elementwise_kernels(KernelTable& t) {
  t.add(OpKind::fill, fill);
  for (OpKind op : {OpKind::add, OpKind::sub, OpKind::mul, OpKind::div})
    t.add(op, binary, /*low_precision=*/true);
  for (OpKind op : {OpKind::scale, OpKind::add_scalar, OpKind::exp, OpKind::log, OpKind::sqrt,
                    OpKind::rsqrt, OpKind::tanh, OpKind::gelu, OpKind::silu, OpKind::relu})
    t.add(op, unary, /*low_precision=*/true);
  for (OpKind op : {OpKind::gelu_grad, OpKind::silu_grad, OpKind::relu_grad})
    t.add(op, activation_grad, /*low_precision=*/true);
  t.add(OpKind::swiglu, swiglu);
  t.add(OpKind::swiglu_grad, swiglu_grad);
  t.add(OpKind::broadcast_to, broadcast_to);
}

}  // namespace tessera::cuda
