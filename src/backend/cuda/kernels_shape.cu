// Shape kernels: reduce_sum and sum_to (one thread per output element, summing its reduced
// sub-space in row-major order), reshape (a copy unless planned as a view), transpose (a
// strided gather), slice and concat. Elements are 4 bytes (f32 or i32; bf16/f16 storage is
// widened by the backend around these kernels).
#include "backend/cuda/kernels.h"
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

// y (shape `out`, rank of `in`, 1 where reduced) = sum of x over the reduced dimensions.
__global__ void reduce_kernel(const float* x, Dims in, Dims in_stride, Dims out, float* y,
                              int64_t nout, int64_t per_out) {
  GRID_STRIDE(o, nout) {
    int64_t base = 0, rem = o;
    for (int d = in.rank - 1; d >= 0; --d) {
      const int64_t c = rem % out.d[d];
      rem /= out.d[d];
      if (out.d[d] != 1) base += c * in_stride.d[d];
    }
    float s = 0;
    for (int64_t k = 0; k < per_out; ++k) {
      int64_t off = base, kr = k;
      for (int d = in.rank - 1; d >= 0; --d) {
        if (out.d[d] != 1 || in.d[d] == 1) continue;
        off += (kr % in.d[d]) * in_stride.d[d];
        kr /= in.d[d];
      }
      s += x[off];
    }
    y[o] = s;
  }
}

void reduce_into(const Args& a, const Shape& kept) {
  const Shape& in = a.in_shape(0);
  const int64_t nout = kept.numel();
  if (nout == 0) return;
  reduce_kernel<<<blocks_for(nout), 256, 0, a.stream>>>(a.fin(0), dims_of(in),
                                                        row_major_strides(in), dims_of(kept),
                                                        a.fout(0), nout, in.numel() / nout);
  TS_CUDA_LAUNCH();
}

void reduce_sum(OpKind, const Args& a) {
  Shape kept = a.in_shape(0);
  for (int64_t ax : a.attrs.ints) kept = kept.with_dim(static_cast<int>(ax), 1);
  reduce_into(a, kept);
}

void sum_to(OpKind, const Args& a) {
  const Shape &in = a.in_shape(0), &target = a.out_shape(0);
  std::vector<int64_t> d(static_cast<size_t>(in.rank() - target.rank()), 1);
  d.insert(d.end(), target.dims().begin(), target.dims().end());
  reduce_into(a, Shape(d));
}

// A reshape whose output the memory planner placed on its input (a view) copies nothing.
void reshape(OpKind, const Args& a) {
  if (a.out[0] == a.in[0]) return;
  TS_CUDA(cudaMemcpyAsync(a.out[0], a.in[0], static_cast<size_t>(a.out_types[0].bytes()),
                          cudaMemcpyDeviceToDevice, a.stream));
}

// Output element i reads the input at sum over dims of coordinate * src stride.
__global__ void transpose_kernel(const float* x, float* y, Dims out, Dims src, int64_t n) {
  GRID_STRIDE(i, n) {
    int64_t rem = i, off = 0;
    for (int d = out.rank - 1; d >= 0; --d) {
      off += (rem % out.d[d]) * src.d[d];
      rem /= out.d[d];
    }
    y[i] = x[off];
  }
}

void transpose(OpKind, const Args& a) {
  const Shape &in = a.in_shape(0), &out = a.out_shape(0);
  const int64_t n = out.numel();
  if (n == 0) return;
  Dims in_stride = row_major_strides(in), src = dims_of(out);
  for (int d = 0; d < out.rank(); ++d) src.d[d] = in_stride.d[a.attrs.ints[static_cast<size_t>(d)]];
  transpose_kernel<<<blocks_for(n), 256, 0, a.stream>>>(a.fin(0), a.fout(0), dims_of(out), src, n);
  TS_CUDA_LAUNCH();
}

// Copies `outer` rows of `piece` elements from x (row stride x_row, offset x_off) to y (row
// stride y_row, offset y_off).
__global__ void rows_kernel(const float* x, int64_t x_row, int64_t x_off, float* y, int64_t y_row,
                            int64_t y_off, int64_t outer, int64_t piece) {
  GRID_STRIDE(i, outer * piece) {
    const int64_t o = i / piece, j = i % piece;
    y[o * y_row + y_off + j] = x[o * x_row + x_off + j];
  }
}

void copy_rows(const Args& a, const void* x, int64_t x_row, int64_t x_off, void* y, int64_t y_row,
               int64_t y_off, int64_t outer, int64_t piece) {
  if (outer * piece == 0) return;
  TS_CHECK(dtype_size(a.in_types[0].dtype) == 4) << "slice/concat of 4-byte elements only";
  rows_kernel<<<blocks_for(outer * piece), 256, 0, a.stream>>>(static_cast<const float*>(x), x_row,
                                                               x_off, static_cast<float*>(y), y_row,
                                                               y_off, outer, piece);
  TS_CUDA_LAUNCH();
}

void slice(OpKind, const Args& a) {
  const Shape& in = a.in_shape(0);
  const int ax = in.axis(static_cast<int>(a.attrs.axis));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < ax; ++d) outer *= in[d];
  for (int d = ax + 1; d < in.rank(); ++d) inner *= in[d];
  const int64_t piece = (a.attrs.end - a.attrs.start) * inner;
  copy_rows(a, a.in[0], in[ax] * inner, a.attrs.start * inner, a.out[0], piece, 0, outer, piece);
}

void concat(OpKind, const Args& a) {
  const Shape& out = a.out_shape(0);
  const int ax = out.axis(static_cast<int>(a.attrs.axis));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < ax; ++d) outer *= out[d];
  for (int d = ax + 1; d < out.rank(); ++d) inner *= out[d];
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
  t.add(OpKind::reduce_sum, reduce_sum);
  t.add(OpKind::sum_to, sum_to);
  t.add(OpKind::reshape, reshape);
  t.add(OpKind::transpose, transpose);
  t.add(OpKind::slice, slice);
  t.add(OpKind::concat, concat);
}

}  // namespace tessera::cuda
