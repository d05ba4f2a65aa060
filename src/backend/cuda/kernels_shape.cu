// Shape kernels: reduce_sum and sum_to (f32 sums of f32, bf16 or f16 as stored), and the
// data movers reshape (a copy unless planned as a view), transpose (a strided gather), slice
// and concat, which take 2- and 4-byte elements as stored. Reductions are deterministic: a
// fixed order of additions whatever the launch.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/kernels.h"
#include "backend/cuda/storage.cuh"
#include "base/check.h"

namespace tessera::cuda {

namespace {

constexpr int kMaxRank = 8;

struct Dims {
  int64_t d[kMaxRank];
  int rank = 0;
};

Dims dims_of(const Shape& s) {
  TS_CHECK(s.rank() <= kMaxRank) << "rank " << s.rank() << " is over the CUDA kernels' "
                                 << kMaxRank;
  Dims r;
  r.rank = s.rank();
  for (int i = 0; i < s.rank(); ++i) r.d[i] = s[i];
  return r;
}

Dims row_major_strides(const Shape& s) {
  Dims r = dims_of(s);
  int64_t st = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    r.d[i] = st;
    st *= s[i];
  }
  return r;
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// The data movers copy whole words: the widest of 16, 8, 4 and 2 bytes that divides every
// byte count and pointer given (a [B,T,H,64] bf16 transpose moves 16-byte words, 8 elements).
int word_bytes(std::initializer_list<int64_t> bytes, std::initializer_list<const void*> ptrs) {
  for (int w : {16, 8, 4}) {
    bool ok = true;
    for (int64_t b : bytes) ok = ok && b % w == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % w == 0;
    if (ok) return w;
  }
  return 2;
}

// Calls f with a null pointer of the w-byte word type.
template <typename F>
void with_word(int w, F f) {
  switch (w) {
    case 16:
      return f(static_cast<uint4*>(nullptr));
    case 8:
      return f(static_cast<uint2*>(nullptr));
    case 4:
      return f(static_cast<uint32_t*>(nullptr));
    default:
      return f(static_cast<uint16_t*>(nullptr));
  }
}

// y (shape `out`, rank of `in`, 1 where reduced) = sum of x over the reduced dimensions.
template <typename T>
__global__ void reduce_kernel(const T* x, Dims in, Dims in_stride, Dims out, T* y, int64_t nout,
                              int64_t per_out) {
  GRID_STRIDE(o, nout) {
    // The dim loops are unrolled over kMaxRank so that every index into the Dims is a
    // constant: indexed by a variable, the kernel would copy them to local memory.
    int64_t base = 0, rem = o;
#pragma unroll
    for (int d = kMaxRank - 1; d >= 0; --d) {
      if (d >= in.rank) continue;
      const int64_t c = rem % out.d[d];
      rem /= out.d[d];
      if (out.d[d] != 1) base += c * in_stride.d[d];
    }
    float s = 0;
    for (int64_t k = 0; k < per_out; ++k) {
      int64_t off = base, kr = k;
#pragma unroll
      for (int d = kMaxRank - 1; d >= 0; --d) {
        if (d >= in.rank || out.d[d] != 1 || in.d[d] == 1) continue;
        off += (kr % in.d[d]) * in_stride.d[d];
        kr /= in.d[d];
      }
      s += as_f32(x[off]);
    }
    y[o] = from_f32<T>(s);
  }
}

// [R, C] -> [C] (leading rows reduced, trailing block kept), the bias gradients' shape: stage
// one sums `chunk` rows per block row of the grid into partial[y][c], stage two adds the
// partials in order. Coalesced reads, many blocks.
template <typename T>
__global__ void rows_partial(const T* x, int64_t rows, int64_t cols, int64_t chunk,
                             float* partial) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
  float s = 0;
  for (int64_t r = r0; r < r1; ++r) s += as_f32(x[r * cols + c]);
  partial[blockIdx.y * cols + c] = s;
}

template <typename T>
__global__ void rows_total(const float* partial, int64_t parts, int64_t cols, T* y) {
  GRID_STRIDE(c, cols) {
    float s = 0;
    for (int64_t p = 0; p < parts; ++p) s += partial[p * cols + c];
    y[c] = from_f32<T>(s);
  }
}

template <typename T>
void reduce_leading_rows(const Args& a, int64_t rows, int64_t cols) {
  const int64_t parts = std::min<int64_t>(rows, 64), chunk = (rows + parts - 1) / parts;
  float* partial = nullptr;
  TS_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                          static_cast<size_t>(parts * cols) * sizeof(float), a.stream));
  const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(parts));
  rows_partial<<<grid, 256, 0, a.stream>>>(static_cast<const T*>(a.in[0]), rows, cols, chunk,
                                           partial);
  TS_CUDA_LAUNCH();
  rows_total<<<blocks_for(cols), 256, 0, a.stream>>>(partial, parts, cols,
                                                     static_cast<T*>(a.out[0]));
  TS_CUDA_LAUNCH();
  TS_CUDA(cudaFreeAsync(partial, a.stream));
}

// The sums read and write their storage type as stored (f32 partial sums).
template <typename T>
void reduce_into(const Args& a, const Shape& kept) {
  const Shape& in = a.in_shape(0);
  const int64_t nout = kept.numel();
  if (nout == 0) return;
  int lead = 0;
  while (lead < in.rank() && kept[lead] == 1 && in[lead] != 1) ++lead;
  bool trailing_kept = lead > 0;
  for (int d = lead; d < in.rank(); ++d) trailing_kept = trailing_kept && kept[d] == in[d];
  if (trailing_kept) return reduce_leading_rows<T>(a, in.numel() / nout, nout);
  reduce_kernel<<<blocks_for(nout), 256, 0, a.stream>>>(
      static_cast<const T*>(a.in[0]), dims_of(in), row_major_strides(in), dims_of(kept),
      static_cast<T*>(a.out[0]), nout, in.numel() / nout);
  TS_CUDA_LAUNCH();
}

void reduce_in_storage(OpKind op, const Args& a, const Shape& kept, KernelFn self) {
  if (!one_storage(a, {0}, {0})) return run_in_f32(op, a, self);
  with_storage(a.in_types[0].dtype,
               [&](auto* tag) { reduce_into<std::remove_pointer_t<decltype(tag)>>(a, kept); });
}

void reduce_sum(OpKind op, const Args& a) {
  Shape kept = a.in_shape(0);
  for (int64_t ax : a.attr<ReduceAttrs>().axes) kept = kept.with_dim(static_cast<int>(ax), 1);
  reduce_in_storage(op, a, kept, reduce_sum);
}

void sum_to(OpKind op, const Args& a) {
  const Shape &in = a.in_shape(0), &target = a.out_shape(0);
  std::vector<int64_t> d(static_cast<size_t>(in.rank() - target.rank()), 1);
  d.insert(d.end(), target.dims().begin(), target.dims().end());
  reduce_in_storage(op, a, Shape(d), sum_to);
}

// A reshape whose output the memory planner placed on its input (a view) copies nothing.
void reshape(OpKind, const Args& a) {
  if (a.out[0] == a.in[0]) return;
  TS_CUDA(cudaMemcpyAsync(a.out[0], a.in[0], static_cast<size_t>(a.out_types[0].bytes()),
                          cudaMemcpyDeviceToDevice, a.stream));
}

// Output element i reads the input at sum over dims of coordinate * src stride.
// I: the index type, int32_t (cheaper divisions) when n < 2^31.
template <typename T, typename I>
__global__ void transpose_kernel(const T* x, T* y, Dims out, Dims src, int64_t n) {
  GRID_STRIDE(i, n) {
    I rem = static_cast<I>(i), off = 0;
#pragma unroll  // constant indices into the Dims (see reduce_kernel)
    for (int d = kMaxRank - 1; d >= 0; --d) {
      if (d >= out.rank) continue;
      const I dim = static_cast<I>(out.d[d]);
      off += (rem % dim) * static_cast<I>(src.d[d]);
      rem /= dim;
    }
    y[i] = x[off];
  }
}

template <typename T>
void launch_transpose(const void* x, void* y, const Dims& out, const Dims& src, int64_t n,
                      cudaStream_t s) {
  if (n < (int64_t{1} << 31))
    transpose_kernel<T, int32_t>
        <<<blocks_for(n), 256, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), out, src, n);
  else
    transpose_kernel<T, int64_t>
        <<<blocks_for(n), 256, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), out, src, n);
}

void transpose(OpKind, const Args& a) {
  const Shape &in = a.in_shape(0), &out = a.out_shape(0);
  const int64_t n = out.numel();
  if (n == 0) return;
  const std::vector<int64_t>& perm = a.attr<TransposeAttrs>().perm;
  Dims in_stride = row_major_strides(in), src = dims_of(out), dims = dims_of(out);
  for (int d = 0; d < out.rank(); ++d) src.d[d] = in_stride.d[perm[static_cast<size_t>(d)]];
  const int64_t elem = dtype_size(a.in_types[0].dtype);
  int w = static_cast<int>(elem);
  const int last = out.rank() - 1;
  // Where the last dim stays last, its rows move as words: every other stride is a multiple
  // of its length.
  if (last >= 0 && perm[static_cast<size_t>(last)] == last) {
    w = std::max<int>(w, word_bytes({out[last] * elem}, {a.in[0], a.out[0]}));
    const int64_t k = w / elem;
    dims.d[last] /= k;
    for (int d = 0; d < last; ++d) src.d[d] /= k;
  }
  with_word(w, [&](auto* tag) {
    launch_transpose<std::remove_pointer_t<decltype(tag)>>(a.in[0], a.out[0], dims, src,
                                                           n * elem / w, a.stream);
  });
  TS_CUDA_LAUNCH();
}

// Copies `outer` rows of `piece` elements from x (row stride x_row, offset x_off) to y (row
// stride y_row, offset y_off).
template <typename T, typename I>
__global__ void rows_kernel(const T* x, I x_row, I x_off, T* y, I y_row, I y_off, I outer,
                            I piece) {
  GRID_STRIDE(i, int64_t{outer} * piece) {
    const I o = static_cast<I>(i) / piece, j = static_cast<I>(i) % piece;
    y[o * y_row + y_off + j] = x[o * x_row + x_off + j];
  }
}

void copy_rows(const Args& a, const void* x, int64_t x_row, int64_t x_off, void* y, int64_t y_row,
               int64_t y_off, int64_t outer, int64_t piece) {
  if (outer * piece == 0) return;
  const int64_t elem = dtype_size(a.out_types[0].dtype);
  const int w = std::max<int>(
      static_cast<int>(elem),
      word_bytes({x_row * elem, x_off * elem, y_row * elem, y_off * elem, piece * elem}, {x, y}));
  const int64_t k = w / elem, n = outer * piece / k;
  with_word(w, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    if (outer * std::max(x_row, y_row) < (int64_t{1} << 31) * k)
      rows_kernel<T, int32_t><<<blocks_for(n), 256, 0, a.stream>>>(
          px, static_cast<int32_t>(x_row / k), static_cast<int32_t>(x_off / k), py,
          static_cast<int32_t>(y_row / k), static_cast<int32_t>(y_off / k),
          static_cast<int32_t>(outer), static_cast<int32_t>(piece / k));
    else
      rows_kernel<T, int64_t><<<blocks_for(n), 256, 0, a.stream>>>(
          px, x_row / k, x_off / k, py, y_row / k, y_off / k, outer, piece / k);
  });
  TS_CUDA_LAUNCH();
}

// shard_slice: rows_kernel whose input offset is block (read on the device) * the piece.
template <typename T>
__global__ void shard_rows_kernel(const T* x, int64_t x_row, const int32_t* block, int64_t inner,
                                  T* y, int64_t outer, int64_t piece) {
  const int64_t x_off = static_cast<int64_t>(*block) * piece;
  GRID_STRIDE(i, outer * piece) {
    const int64_t o = i / piece, j = i % piece;
    y[o * piece + j] = x[o * x_row + x_off + j];
  }
}

void shard_slice(OpKind, const Args& a) {
  const Shape& in = a.in_shape(0);
  const ShardSliceAttrs& s = a.attr<ShardSliceAttrs>();
  const int ax = in.axis(static_cast<int>(s.axis));
  const int64_t outer = in.numel_before(ax), inner = in.numel_after(ax);
  const int64_t piece = in[ax] / s.blocks * inner;
  if (outer * piece == 0) return;
  const int32_t* block = a.iin(1);
  if (dtype_size(a.in_types[0].dtype) == 2) {
    shard_rows_kernel<<<blocks_for(outer * piece), 256, 0, a.stream>>>(
        static_cast<const uint16_t*>(a.in[0]), in[ax] * inner, block, inner,
        static_cast<uint16_t*>(a.out[0]), outer, piece);
  } else {
    shard_rows_kernel<<<blocks_for(outer * piece), 256, 0, a.stream>>>(
        static_cast<const uint32_t*>(a.in[0]), in[ax] * inner, block, inner,
        static_cast<uint32_t*>(a.out[0]), outer, piece);
  }
  TS_CUDA_LAUNCH();
}

void slice(OpKind, const Args& a) {
  const Shape& in = a.in_shape(0);
  const SliceAttrs& s = a.attr<SliceAttrs>();
  const int ax = in.axis(static_cast<int>(s.axis));
  const int64_t outer = in.numel_before(ax), inner = in.numel_after(ax);
  const int64_t piece = (s.end - s.start) * inner;
  copy_rows(a, a.in[0], in[ax] * inner, s.start * inner, a.out[0], piece, 0, outer, piece);
}

void concat(OpKind, const Args& a) {
  const Shape& out = a.out_shape(0);
  const int ax = out.axis(static_cast<int>(a.attr<ConcatAttrs>().axis));
  const int64_t outer = out.numel_before(ax), inner = out.numel_after(ax);
  int64_t offset = 0;
  for (size_t i = 0; i < a.in.size(); ++i) {
    const int64_t len = a.in_types[i].shape[ax];
    copy_rows(a, a.in[i], len * inner, 0, a.out[0], out[ax] * inner, offset * inner, outer,
              len * inner);
    offset += len;
  }
}

}  // namespace

void register_shape_kernels(KernelTable& t) {
  t.add(OpKind::reduce_sum, reduce_sum, /*low_precision=*/true);
  t.add(OpKind::sum_to, sum_to, true);
  // Data movers take bf16/f16 as stored (no widening copies).
  t.add(OpKind::reshape, reshape, /*low_precision=*/true);
  t.add(OpKind::transpose, transpose, true);
  t.add(OpKind::slice, slice, true);
  t.add(OpKind::shard_slice, shard_slice, true);
  t.add(OpKind::concat, concat, true);
}

}  // namespace tessera::cuda
