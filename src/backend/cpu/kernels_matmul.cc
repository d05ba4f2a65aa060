// matmul on OpenBLAS: batched, a shared rank-2 right operand (the batch folded into rows), or
// MatmulAttrs::fold_batch (one GEMM over both operands' flattened rows). The fused epilogues
// (ir/ops_fused.cc) run the same product, then one pass over it: in f32 the same arithmetic as
// the unfused ops, to the bit.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_math.h"
#include "base/log.h"

extern "C" char* openblas_get_corename(void);

namespace tessera::cpu {

namespace {

// Work below which one thread does the whole product (splitting costs more than it saves).
constexpr double kSplitFlops = 4e6;

// Once per process: OpenBLAS 0.3.21 does not know some newer x86 CPUs and falls back to its
// SSE3 kernels, 5-10x slower than the AVX2/AVX-512 ones the CPU could run.
void warn_if_generic_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* hint = tessera::openblas_better_coretype()) {
      TS_LOG(warn) << "OpenBLAS does not recognize this CPU and uses its slow Prescott kernels. "
                      "HINT: run with OPENBLAS_CORETYPE="
                   << hint;
    }
  });
}

}  // namespace

// C[M,N] = op(A) op(B) + beta C, row-major, on the backend's threads (thread_pool.h): OpenBLAS
// runs single-threaded inside each on a slice of C (columns when N >= M, else rows). OpenBLAS's
// own threads would spin between calls against the backend's.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
           const float* B, int64_t ldb, float* C, int64_t ldc, float beta) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  warn_if_generic_kernels();
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  auto call = [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    // Row i of op(A) starts at A + i*lda (no transpose) or at column i (transpose); column j
    // of op(B) likewise.
    const float* a = A + (ta ? i0 : i0 * lda);
    const float* b = B + (tb ? j0 * ldb : j0);
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(rows), static_cast<int>(cols),
                static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                C + i0 * ldc + j0, static_cast<int>(ldc));
  };
  if (2.0 * m * n * k < kSplitFlops) return call(0, m, 0, n);
  const bool by_cols = n >= m;
  const int64_t len = by_cols ? n : m;
  // Slices rounded to 16 (a multiple of every kernel's register block), as even as that allows.
  const int64_t unit = 16, units = (len + unit - 1) / unit;
  parallel_run([&](int t, int nt) {
    const int64_t lo = std::min(len, units * t / nt * unit);
    const int64_t hi = std::min(len, units * (t + 1) / nt * unit);
    if (by_cols) {
      call(0, m, lo, hi - lo);
    } else {
      call(lo, hi - lo, 0, n);
    }
  });
}

namespace {

// The product of inputs 0 and 1 (shaped as output 0) into C. Batched operands loop over the
// batch; a rank-2 right operand is shared by folding the left operand's batch into its rows.
void product(const Args& a, float* C) {
  const Shape &sa = a.in_shape(0), &sb = a.in_shape(1), &sc = a.out_shape(0);
  const MatmulAttrs& attrs = a.attr<MatmulAttrs>();
  bool ta = attrs.transpose_a, tb = attrs.transpose_b;
  int64_t m = sc[-2], n = sc[-1];
  int64_t k = ta ? sa[-2] : sa[-1];
  int64_t lda = sa[-1], ldb = sb[-1];
  const float *A = a.fin(0), *B = a.fin(1);
  if (attrs.fold_batch) {  // [.., R, M]^T x [.., R, N]: one GEMM over the flattened rows
    const int64_t rows = sa[-1] > 0 ? sa.numel() / sa[-1] : 0;
    return sgemm(true, false, m, n, rows, A, lda, B, ldb, C, n, 0.0f);
  }
  if (sb.rank() == 2) {
    int64_t rows = sc.numel() / n;  // batch folded into M (transpose_a excluded by inference)
    if (sa.rank() == 2) rows = m;
    return sgemm(ta, tb, rows, n, k, A, lda, B, ldb, C, n, 0.0f);
  }
  int64_t batch = sc.numel() / (m * n);
  int64_t stride_a = sa[-1] * sa[-2], stride_b = sb[-1] * sb[-2];
  // Fewer products than threads: each product is split. Otherwise whole products per thread
  // (sgemm runs serially inside a region), at least kSplitFlops of work each.
  auto one = [&](int64_t i) {
    sgemm(ta, tb, m, n, k, A + i * stride_a, lda, B + i * stride_b, ldb, C + i * m * n, n, 0.0f);
  };
  if (batch < num_threads()) {
    for (int64_t i = 0; i < batch; ++i) one(i);
    return;
  }
  const double per = 2.0 * static_cast<double>(m) * n * k;
  parallel_for(batch, std::max<int64_t>(1, static_cast<int64_t>(kSplitFlops / per)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t i = lo; i < hi; ++i) one(i);
               });
}

// Rows of n elements, at least 16K elements to a thread's piece.
int64_t rows_per_piece(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

}  // namespace

void matmul(const Args& a) { product(a, a.fout(0)); }

// matmul_bias: y = product + bias.
void matmul_bias(const Args& a) {
  float* y = a.fout(0);
  product(a, y);
  const int64_t numel = a.out_shape(0).numel(), n = a.out_shape(0)[-1];
  const float* bias = a.fin(2);
  if (numel == 0) return;
  parallel_for(numel / n, rows_per_piece(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t j = 0; j < n; ++j) y[r * n + j] = y[r * n + j] + bias[j];
  });
}

// matmul_bias_gelu: pre = product + bias, y = gelu(pre).
void matmul_bias_gelu(const Args& a) {
  float *y = a.fout(0), *pre = a.fout(1);
  product(a, pre);
  const int64_t numel = a.out_shape(0).numel(), n = a.out_shape(0)[-1];
  const float* bias = a.fin(2);
  if (numel == 0) return;
  parallel_for(numel / n, rows_per_piece(n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float *pr = pre + r * n, *yr = y + r * n;
      for (int64_t j = 0; j < n; ++j) {
        pr[j] = pr[j] + bias[j];
        yr[j] = gelu_fast(pr[j]);
      }
    }
  });
}

// matmul_dgelu_bgrad: d = product * gelu'(pre), db = d summed over the rows (sum_to's sum).
void matmul_dgelu_bgrad(const Args& a) {
  float* d = a.fout(0);
  product(a, d);
  const Shape& s = a.out_shape(0);
  const float* pre = a.fin(2);
  parallel_for(s.numel(), 16384, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) d[i] = d[i] * gelu_grad_fast(pre[i]);
  });
  std::vector<int64_t> kept(static_cast<size_t>(s.rank()), 1);
  kept.back() = s[-1];
  reduce_into(d, s, a.fout(1), Shape(kept));
}

// matmul_bgrad: the weight gradient's product, and dy summed over its rows (sum_to's sum).
void matmul_bgrad(const Args& a) {
  product(a, a.fout(0));
  const Shape& s = a.in_shape(0);
  std::vector<int64_t> kept(static_cast<size_t>(s.rank()), 1);
  kept.back() = s[-1];
  reduce_into(a.fin(0), s, a.fout(1), Shape(kept));
}

// Registers this file's kernels (cpu_backend.cc builds the table once).
void register_matmul_kernels(KernelTable& t) {
  t.add(OpKind::matmul, [](OpKind, const Args& a) { matmul(a); });
  t.add(OpKind::matmul_bias, [](OpKind, const Args& a) { matmul_bias(a); });
  t.add(OpKind::matmul_bias_gelu, [](OpKind, const Args& a) { matmul_bias_gelu(a); });
  t.add(OpKind::matmul_dgelu_bgrad, [](OpKind, const Args& a) { matmul_dgelu_bgrad(a); });
  t.add(OpKind::matmul_bgrad, [](OpKind, const Args& a) { matmul_bgrad(a); });
}

}  // namespace tessera::cpu
