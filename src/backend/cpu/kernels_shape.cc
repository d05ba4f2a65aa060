#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "base/check.h"

namespace tessera::cpu {

// Sums x (shape `in`) into y (shape `out`, same rank, 1 where reduced).
void reduce_into(const float* x, const Shape& in, float* y, const Shape& out) {
  int r = in.rank();
  int64_t nout = out.numel();
  // Fast path: reduce leading rows, keep trailing block ([R, C] -> [C]).
  int lead = 0;
  while (lead < r && out[lead] == 1 && in[lead] != 1) ++lead;
  bool trailing_kept = true;
  for (int d = lead; d < r; ++d) trailing_kept = trailing_kept && out[d] == in[d];
  if (trailing_kept) {
    // Rows summed in order into a block of columns: contiguous, vectorized reads.
    const int64_t rows = in.numel() / nout, block = 256;
    parallel_for((nout + block - 1) / block, rows * block > 65536 ? 1 : 1 << 30,
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t j0 = lo * block; j0 < std::min(nout, hi * block); j0 += block) {
                     const int64_t w = std::min(block, nout - j0);
                     float* yj = y + j0;
                     for (int64_t j = 0; j < w; ++j) yj[j] = 0.0f;
                     for (int64_t i = 0; i < rows; ++i) {
                       const float* xi = x + i * nout + j0;
#pragma omp simd
                       for (int64_t j = 0; j < w; ++j) yj[j] += xi[j];
                     }
                   }
                 });
    return;
  }
  // General path: one output element at a time, iterating over the reduced sub-space.
  std::vector<int64_t> in_stride(static_cast<size_t>(r));
  int64_t st = 1;
  for (int d = r - 1; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = st;
    st *= in[d];
  }
  int64_t per_out = in.numel() / nout;
  parallel_for(nout, 256, [&](int64_t o_lo, int64_t o_hi) {
    for (int64_t o = o_lo; o < o_hi; ++o) {
      int64_t base = 0, rem = o;
      for (int d = r - 1; d >= 0; --d) {
        int64_t c = rem % out[d];
        rem /= out[d];
        if (out[d] != 1) base += c * in_stride[static_cast<size_t>(d)];
      }
      float s = 0;
      for (int64_t k = 0; k < per_out; ++k) {
        int64_t off = base, kr = k;
        for (int d = r - 1; d >= 0; --d) {
          if (out[d] != 1 || in[d] == 1) continue;
          off += (kr % in[d]) * in_stride[static_cast<size_t>(d)];
          kr /= in[d];
        }
        s += x[off];
      }
      y[o] = s;
    }
  });
}

void reduce_sum(const Args& a) {
  const Shape& in = a.in_shape(0);
  Shape kept = in;
  for (int64_t ax : a.attr<ReduceAttrs>().axes) kept = kept.with_dim(static_cast<int>(ax), 1);
  reduce_into(a.fin(0), in, a.fout(0), kept);
}

void sum_to(const Args& a) {
  const Shape &in = a.in_shape(0), &target = a.out_shape(0);
  std::vector<int64_t> d(static_cast<size_t>(in.rank() - target.rank()), 1);
  d.insert(d.end(), target.dims().begin(), target.dims().end());
  reduce_into(a.fin(0), in, a.fout(0), Shape(d));
}

namespace {
// memcpy of `bytes`, in pieces of at least 256 KiB on the backend's threads.
void parallel_memcpy(void* dst, const void* src, int64_t bytes) {
  constexpr int64_t kPiece = 1 << 18;
  parallel_for((bytes + kPiece - 1) / kPiece, 1, [&](int64_t lo, int64_t hi) {
    const int64_t b0 = lo * kPiece, b1 = std::min(bytes, hi * kPiece);
    std::memcpy(static_cast<char*>(dst) + b0, static_cast<const char*>(src) + b0,
                static_cast<size_t>(b1 - b0));
  });
}
}  // namespace

// A reshape whose output the memory planner placed on its input (a view) copies nothing.
void copy(const Args& a) {
  if (a.out[0] != a.in[0]) parallel_memcpy(a.out[0], a.in[0], a.out_types[0].bytes());
}

void transpose(const Args& a) {
  const Shape& in = a.in_shape(0);
  const Shape& out = a.out_shape(0);
  const std::vector<int64_t>& perm = a.attr<TransposeAttrs>().perm;
  int r = in.rank();
  std::vector<int64_t> in_stride(static_cast<size_t>(r));
  int64_t st = 1;
  for (int d = r - 1; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = st;
    st *= in[d];
  }
  // Stride in the input of each output dimension.
  std::vector<int64_t> src(static_cast<size_t>(r));
  for (int d = 0; d < r; ++d)
    src[static_cast<size_t>(d)] = in_stride[static_cast<size_t>(perm[static_cast<size_t>(d)])];
  const float* x = a.fin(0);
  float* y = a.fout(0);
  int64_t inner = out[r - 1], rows = out.numel() / inner,
          inner_stride = src[static_cast<size_t>(r - 1)];
  parallel_for(rows, std::max<int64_t>(64, 16384 / inner), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      int64_t rem = row, off = 0;
      for (int d = r - 2; d >= 0; --d) {
        off += (rem % out[d]) * src[static_cast<size_t>(d)];
        rem /= out[d];
      }
      float* yr = y + row * inner;
      if (inner_stride == 1) {
        std::memcpy(yr, x + off, static_cast<size_t>(inner) * sizeof(float));
      } else {
        for (int64_t j = 0; j < inner; ++j) yr[j] = x[off + j * inner_stride];
      }
    }
  });
}

namespace {
// Elements [start, start + len) of dim `axis`.
void slice_range(const Args& a, int64_t axis, int64_t start, int64_t len) {
  const Shape& in = a.in_shape(0);
  int ax = in.axis(static_cast<int>(axis));
  const int64_t outer = in.numel_before(ax), inner = in.numel_after(ax);
  const char* x = static_cast<const char*>(a.in[0]);
  char* y = static_cast<char*>(a.out[0]);
  int64_t es = dtype_size(a.in_types[0].dtype);
  const int64_t piece = len * inner * es;
  if (outer == 1) return parallel_memcpy(y, x + start * inner * es, piece);
  parallel_for(outer, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, piece)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t o = lo; o < hi; ++o)
                   std::memcpy(y + o * piece, x + (o * in[ax] + start) * inner * es,
                               static_cast<size_t>(piece));
               });
}
}  // namespace

void slice(const Args& a) {
  const SliceAttrs& s = a.attr<SliceAttrs>();
  slice_range(a, s.axis, s.start, s.end - s.start);
}

void shard_slice(const Args& a) {
  const ShardSliceAttrs& s = a.attr<ShardSliceAttrs>();
  const int64_t len = a.out_shape(0)[static_cast<int>(s.axis)];
  const int32_t block = a.iin(1)[0];
  TS_CHECK(block >= 0 && block < s.blocks) << "shard_slice block " << block << " of " << s.blocks;
  slice_range(a, s.axis, static_cast<int64_t>(block) * len, len);
}

void concat(const Args& a) {
  const Shape& out = a.out_shape(0);
  int ax = out.axis(static_cast<int>(a.attr<ConcatAttrs>().axis));
  const int64_t outer = out.numel_before(ax), inner = out.numel_after(ax);
  int64_t es = dtype_size(a.out_types[0].dtype);
  char* y = static_cast<char*>(a.out[0]);
  // Output rows in parallel; each row gathers its piece of every input.
  const int64_t row_bytes = out[ax] * inner * es;
  parallel_for(outer, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, row_bytes)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t o = lo; o < hi; ++o) {
                   int64_t offset = 0;
                   for (size_t i = 0; i < a.in.size(); ++i) {
                     const int64_t len = a.in_types[i].shape[ax];
                     const char* x = static_cast<const char*>(a.in[i]);
                     std::memcpy(y + (o * out[ax] + offset) * inner * es, x + o * len * inner * es,
                                 static_cast<size_t>(len * inner * es));
                     offset += len;
                   }
                 }
               });
}

// Registers this file's kernels (cpu_backend.cc builds the table once).
void register_shape_kernels(KernelTable& t) {
  t.add(OpKind::reduce_sum, [](OpKind, const Args& a) { reduce_sum(a); });
  t.add(OpKind::sum_to, [](OpKind, const Args& a) { sum_to(a); });
  t.add(OpKind::reshape, [](OpKind, const Args& a) { copy(a); });
  t.add(OpKind::transpose, [](OpKind, const Args& a) { transpose(a); });
  t.add(OpKind::slice, [](OpKind, const Args& a) { slice(a); });
  t.add(OpKind::shard_slice, [](OpKind, const Args& a) { shard_slice(a); });
  t.add(OpKind::concat, [](OpKind, const Args& a) { concat(a); });
}

}  // namespace tessera::cpu
